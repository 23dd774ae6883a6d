//! An in-process target on an ephemeral loopback port.

use sliver_server::array::ArrayOptions;
use sliver_server::{Array, Server, ServerOptions};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Serve `server` on an ephemeral loopback port from a two-worker runtime whose threads are
/// named `thread_name` (the run loop's thread `{thread_name}-main`). Returns the portal and the
/// thread, which ends after `server.shutdown()`.
pub fn serve_on_loopback(server: &Arc<Server>, thread_name: &str) -> (SocketAddr, JoinHandle<()>) {
    let runtime = multi_thread(2)
        .thread_name(thread_name)
        .build()
        .expect("a tokio runtime");
    let listeners = runtime
        .block_on(server.bind(&ServerOptions {
            portals: vec!["127.0.0.1:0".parse().expect("an address")],
        }))
        .expect("a loopback port");
    let addr = server.portals()[0];
    let s = server.clone();
    let thread = std::thread::Builder::new()
        .name(format!("{thread_name}-main"))
        .spawn(move || runtime.block_on(s.run(listeners)))
        .expect("a thread");
    (addr, thread)
}

/// A multi-thread tokio runtime of `workers` worker threads, with I/O and timers.
pub fn runtime(workers: usize) -> tokio::runtime::Runtime {
    multi_thread(workers).build().expect("a tokio runtime")
}

fn multi_thread(workers: usize) -> tokio::runtime::Builder {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(workers).enable_all();
    builder
}

/// How to start a [`Running`] target; [`Start::new`] then what differs, then [`Start::run`].
pub struct Start<'a> {
    target_name: &'a str,
    options: ArrayOptions,
    thread_name: &'a str,
    dir: Option<&'a Path>,
}

impl<'a> Start<'a> {
    /// An array named `target_name` with default options, served by threads named
    /// `sliver-test`.
    pub fn new(target_name: &'a str) -> Self {
        Start {
            target_name,
            options: ArrayOptions::default(),
            thread_name: "sliver-test",
            dir: None,
        }
    }

    /// Open the array with `options` (a capacity, a passthrough directory, ...).
    pub fn options(self, options: ArrayOptions) -> Self {
        Start { options, ..self }
    }

    /// Name the server's threads (a test that watches for panics on them finds them so).
    pub fn thread_name(self, thread_name: &'a str) -> Self {
        Start {
            thread_name,
            ..self
        }
    }

    /// Keep the array in `dir` (a small file system, an array opened before) instead of a
    /// temporary directory of its own.
    pub fn dir(self, dir: &'a Path) -> Self {
        Start {
            dir: Some(dir),
            ..self
        }
    }

    /// Open the array, let `setup` make its volumes and hosts and `tune` set the server's
    /// limits, and serve it.
    pub fn run(self, setup: impl FnOnce(&Array), tune: impl FnOnce(&Server)) -> Running {
        let (own, path) = match self.dir {
            Some(dir) => (None, dir.to_path_buf()),
            None => {
                let own = tempfile::tempdir().expect("a temporary directory");
                let path = own.path().to_path_buf();
                (Some(own), path)
            }
        };
        let array =
            Arc::new(Array::open_with(&path, self.target_name, self.options).expect("an array"));
        setup(&array);
        let server = Server::new(array.clone());
        tune(&server);
        let (addr, thread) = serve_on_loopback(&server, self.thread_name);
        Running {
            addr,
            array,
            server,
            thread: Some(thread),
            own,
            path,
        }
    }
}

/// A target serving an array; dropping it stops the server and waits for it.
pub struct Running {
    pub addr: SocketAddr,
    pub array: Arc<Array>,
    pub server: Arc<Server>,
    thread: Option<JoinHandle<()>>,
    /// The array's temporary directory, unless [`Start::dir`] gave one.
    own: Option<tempfile::TempDir>,
    path: PathBuf,
}

impl Running {
    /// The target served by `setup`'s array under `target_name`, with default options.
    pub fn start(target_name: &str, setup: impl FnOnce(&Array)) -> Running {
        Start::new(target_name).run(setup, |_| {})
    }

    /// The iSCSI URL of `lun` (libiscsi's and QEMU's form).
    pub fn url(&self, lun: u64) -> String {
        format!("iscsi://{}/{}/{lun}", self.addr, self.array.target_name())
    }

    /// The array's directory.
    pub fn dir(&self) -> &Path {
        &self.path
    }

    /// Stop the server, wait for it and shut the array down cleanly (a checkpoint); the
    /// array's temporary directory (none with [`Start::dir`]) outlives it, for an offline
    /// check or a reopen.
    pub fn stop(mut self) -> Option<tempfile::TempDir> {
        self.server.shutdown();
        if let Some(t) = self.thread.take() {
            t.join().expect("the server's thread ended without a panic");
        }
        self.array.shutdown().expect("the array shuts down");
        self.own.take()
    }

    /// Whether the server's run loop has ended (it should only after a shutdown).
    pub fn stopped(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.server.shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
