//! The `sliver serve` process under test: start, wait until it accepts, SIGKILL, SIGTERM, and
//! `sliver check`.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Lines of server output kept for failure reports.
const LOG_LINES: usize = 300;
/// Longest a start may take before the harness calls it hung.
const START_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Default)]
struct Log {
    lines: VecDeque<String>,
    /// The first line mentioning engine recovery, with its time since spawn (ms).
    recovered: Option<(f64, String)>,
    /// Lines logged at ERROR level (the first few).
    errors: Vec<String>,
}

/// Lines at ERROR level kept per server process.
const ERROR_LINES: usize = 20;

/// A handle on the ERROR lines a server logged, readable after it is gone.
#[derive(Clone)]
pub struct ErrorLines(Arc<Mutex<Log>>);

impl ErrorLines {
    pub fn get(&self) -> Vec<String> {
        self.0.lock().unwrap().errors.clone()
    }
}

/// A running `sliver serve`.
pub struct ServerProcess {
    child: Child,
    pub port: u16,
    /// Spawn to accepting connections, in milliseconds.
    pub ready_ms: f64,
    log: Arc<Mutex<Log>>,
    readers: Vec<JoinHandle<()>>,
}

fn free_port() -> std::io::Result<u16> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(l.local_addr()?.port())
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn reader(
    stream: impl Read + Send + 'static,
    log: Arc<Mutex<Log>>,
    started: Instant,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            let line = strip_ansi(&line);
            let mut l = log.lock().unwrap();
            if (line.contains(" ERROR ") || line.contains("poisoned"))
                && l.errors.len() < ERROR_LINES
            {
                l.errors.push(line.clone());
            }
            if l.recovered.is_none() && line.contains("recovered") {
                l.recovered = Some((started.elapsed().as_secs_f64() * 1e3, line.clone()));
            }
            if l.lines.len() == LOG_LINES {
                l.lines.pop_front();
            }
            l.lines.push_back(line);
        }
    })
}

impl ServerProcess {
    /// Starts `sliver serve` on a free loopback port and waits until the port accepts.
    pub fn start(sliver: &Path, data_dir: &Path) -> Result<Self, String> {
        let mut last = String::new();
        for _ in 0..5 {
            match Self::try_start(sliver, data_dir)? {
                Ok(s) => return Ok(s),
                Err(tail) if tail.contains("in use") => last = tail,
                Err(tail) => return Err(format!("sliver serve exited during start:\n{tail}")),
            }
        }
        Err(format!("sliver serve could not find a free port:\n{last}"))
    }

    fn try_start(sliver: &Path, data_dir: &Path) -> Result<Result<Self, String>, String> {
        let port = free_port().map_err(|e| format!("cannot find a free port: {e}"))?;
        let started = Instant::now();
        let mut child = Command::new(sliver)
            .arg("serve")
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--iscsi-listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--api-listen")
            .arg("127.0.0.1:0")
            .env("NO_COLOR", "1")
            .env_remove("SLIVER_API_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", sliver.display()))?;
        let log = Arc::new(Mutex::new(Log::default()));
        let readers = vec![
            reader(child.stdout.take().expect("piped"), log.clone(), started),
            reader(child.stderr.take().expect("piped"), log.clone(), started),
        ];
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        loop {
            if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                for r in readers {
                    let _ = r.join();
                }
                let tail = tail_of(&log);
                return Ok(Err(format!("{status}\n{tail}")));
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                let ready_ms = started.elapsed().as_secs_f64() * 1e3;
                return Ok(Ok(Self {
                    child,
                    port,
                    ready_ms,
                    log,
                    readers,
                }));
            }
            if started.elapsed() > START_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "sliver serve did not accept connections within {START_TIMEOUT:?}:\n{}",
                    tail_of(&log)
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The URL of `lun` on this server.
    pub fn url(&self, target: &str, lun: u64) -> String {
        format!("iscsi://127.0.0.1:{}/{target}/{lun}", self.port)
    }

    /// The last lines the server wrote.
    pub fn tail(&self) -> String {
        tail_of(&self.log)
    }

    /// The engine's recovery log line, if it wrote one, and when (ms after spawn).
    pub fn recovered(&self) -> Option<(f64, String)> {
        self.log.lock().unwrap().recovered.clone()
    }

    /// The ERROR lines it logs (complete once the process is killed or stopped).
    pub fn error_lines(&self) -> ErrorLines {
        ErrorLines(self.log.clone())
    }

    /// Whether the process already exited (it should not have).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGKILL, and reap.
    pub fn kill(mut self) -> Result<(), String> {
        let r = self.child.kill();
        let status = self.child.wait();
        self.join_readers();
        r.map_err(|e| format!("cannot SIGKILL the server: {e}"))?;
        status.map_err(|e| e.to_string())?;
        Ok(())
    }

    /// SIGTERM and wait for a clean exit (SIGKILL after `timeout`).
    pub fn terminate(mut self, timeout: Duration) -> Result<ExitStatus, String> {
        let pid = libc::pid_t::try_from(self.child.id()).map_err(|e| e.to_string())?;
        // SAFETY: kill(2) on our own child's pid, which we have not reaped yet.
        if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
            return Err(format!(
                "cannot SIGTERM the server: {}",
                std::io::Error::last_os_error()
            ));
        }
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().map_err(|e| e.to_string())? {
                self.join_readers();
                return Ok(status);
            }
            if Instant::now() > deadline {
                let tail = self.tail();
                let _ = self.child.kill();
                let _ = self.child.wait();
                self.join_readers();
                return Err(format!(
                    "the server did not exit within {timeout:?} of SIGTERM:\n{tail}"
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn join_readers(&mut self) {
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn tail_of(log: &Mutex<Log>) -> String {
    let l = log.lock().unwrap();
    let skip = l.lines.len().saturating_sub(40);
    l.lines
        .iter()
        .skip(skip)
        .cloned()
        .collect::<Vec<_>>()
        .join("\n")
}

/// Runs `sliver check --data-dir DIR`; Ok with the time it took, Err with its output.
pub fn check(sliver: &Path, data_dir: &Path) -> Result<Duration, String> {
    let started = Instant::now();
    let out = Command::new(sliver)
        .arg("check")
        .arg("--data-dir")
        .arg(data_dir)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {} check: {e}", sliver.display()))?;
    if out.status.success() {
        return Ok(started.elapsed());
    }
    Err(format!(
        "sliver check exited with {}:\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        strip_ansi(&String::from_utf8_lossy(&out.stderr))
    ))
}

/// `sliver` next to the current executable (or one directory up, for test binaries in
/// `deps/`).
pub fn default_sliver() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    for _ in 0..2 {
        let candidate = dir.join("sliver");
        if candidate.is_file() {
            return candidate;
        }
        if !dir.pop() {
            break;
        }
    }
    exe.with_file_name("sliver")
}

/// `Err` saying how to get one when `sliver` is no binary: the harness cannot run.
pub fn require_binary(sliver: &Path) -> Result<(), String> {
    if !sliver.is_file() {
        return Err(format!(
            "no sliver binary at {} (build it with `cargo build -p sliver` or pass --sliver)",
            sliver.display()
        ));
    }
    Ok(())
}

/// The array's directory: `dir` when given (created; it must be empty), else a new temporary
/// directory named `prefix...`, returned too so it lives as long as the run.
pub fn data_dir(
    dir: Option<&Path>,
    prefix: &str,
) -> Result<(PathBuf, Option<tempfile::TempDir>), String> {
    match dir {
        Some(d) => {
            if d.exists()
                && std::fs::read_dir(d)
                    .map_err(|e| format!("{}: {e}", d.display()))?
                    .next()
                    .is_some()
            {
                return Err(format!("the data directory {} is not empty", d.display()));
            }
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
            Ok((d.to_path_buf(), None))
        }
        None => {
            let t = tempfile::Builder::new()
                .prefix(prefix)
                .tempdir()
                .map_err(|e| format!("cannot create a temporary directory: {e}"))?;
            Ok((t.path().to_path_buf(), Some(t)))
        }
    }
}

/// Whether the array's directory outlives the run: one the caller named (no `temp`) always
/// does; a temporary one is kept when the run `failed`, for a post-mortem, and removed
/// otherwise.
pub fn keep_data_dir(temp: Option<tempfile::TempDir>, failed: bool) -> bool {
    match temp {
        None => true,
        Some(t) if failed => {
            let _ = t.keep();
            true
        }
        Some(_) => false,
    }
}
