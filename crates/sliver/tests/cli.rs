//! End-to-end: the `sliver` binary's subcommands against a real `sliver serve` (temporary data
//! directory, ephemeral ports), their `--json` output and their error paths.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SLIVER: &str = env!("CARGO_BIN_EXE_sliver");

struct Served {
    child: Child,
    api: String,
    demo_url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(extra: &[&str]) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(SLIVER)
        .args(["serve", "--data-dir"])
        .arg(dir.path())
        .args([
            "--iscsi-listen",
            "127.0.0.1:0",
            "--api-listen",
            "127.0.0.1:0",
            "--capacity",
            "2G",
        ])
        .args(extra)
        .env_remove("SLIVER_API_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut api, mut demo_url) = (None, None);
    while api.is_none() || demo_url.is_none() {
        let line = lines
            .next()
            .expect("sliver serve printed its URLs")
            .unwrap();
        if let Some(url) = line.strip_prefix("API: ") {
            api = Some(url.to_string());
        } else if line.starts_with("volume demo") {
            demo_url = line.split(": ").nth(1).map(str::to_string);
        }
    }
    // Keep draining stdout so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Served {
        child,
        api: api.unwrap(),
        demo_url: demo_url.unwrap(),
        _dir: dir,
    }
}

fn sliver(s: &Served, args: &[&str]) -> Output {
    Command::new(SLIVER)
        .args(args)
        .env("SLIVER_API", &s.api)
        .env_remove("SLIVER_API_TOKEN")
        .output()
        .unwrap()
}

/// Run, expect success, return stdout.
fn ok(s: &Served, args: &[&str]) -> String {
    let out = sliver(s, args);
    assert!(
        out.status.success(),
        "sliver {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Run, expect failure with one clear sentence on stderr containing `needle`.
fn fails(s: &Served, args: &[&str], needle: &str) {
    let out = sliver(s, args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "sliver {args:?} should fail");
    assert!(
        stderr.contains(needle),
        "sliver {args:?}: expected {needle:?} in {stderr:?}"
    );
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "one line of error: {stderr:?}"
    );
}

fn json(s: &Served, args: &[&str]) -> Value {
    serde_json::from_str(&ok(s, args)).unwrap()
}

#[test]
fn every_subcommand_against_a_live_server() {
    let s = serve(&[]);
    // The demo volume exists and is connected to every initiator.
    let list = json(&s, &["volume", "list", "--json"]);
    assert_eq!(list[0]["name"], "demo");
    assert_eq!(list[0]["provisioned_bytes"], 10u64 << 30);
    assert_eq!(ok(&s, &["volume", "url", "demo"]).trim(), s.demo_url);
    assert!(ok(&s, &["volume", "list"]).contains("demo"));

    // create / show
    assert!(ok(&s, &["volume", "create", "db", "--size", "64M"]).contains("created volume 'db'"));
    fails(
        &s,
        &["volume", "create", "db", "--size", "64M"],
        "already exists",
    );
    fails(&s, &["volume", "create", "x", "--size", "ten"], "bad size");
    fails(
        &s,
        &["volume", "create", "bad/name", "--size", "64M"],
        "invalid name",
    );
    let v = json(&s, &["volume", "show", "db", "--json"]);
    for key in [
        "name",
        "provisioned_bytes",
        "mapped_bytes",
        "thin_provisioning",
        "physical_bytes",
        "data_reduction",
    ] {
        assert!(v.get(key).is_some(), "volume show --json lacks {key}: {v}");
    }
    assert_eq!(v["thin_provisioning"], 1.0);
    assert!(ok(&s, &["volume", "show", "db"]).contains("thin provisioning 100.0%"));
    fails(
        &s,
        &["volume", "show", "nope"],
        "volume 'nope' does not exist",
    );

    // hosts: the same creation twice is refused the second time.
    let create_linux1 = [
        "host",
        "create",
        "linux1",
        "--iqn",
        "iqn.2026-11.test:linux1",
    ];
    ok(&s, &create_linux1);
    fails(&s, &create_linux1, "already exists");
    fails(
        &s,
        &["host", "create", "h2", "--iqn", "nonsense"],
        "not an iSCSI name",
    );
    let hosts = json(&s, &["host", "list", "--json"]);
    assert_eq!(hosts[0]["name"], "linux1");
    assert!(ok(&s, &["host", "list"]).contains("iqn.2026-11.test:linux1"));

    // connect / url / disconnect
    let out = ok(
        &s,
        &["volume", "connect", "db", "--host", "linux1", "--lun", "4"],
    );
    assert!(out.contains("LUN 4"), "{out}");
    let url = ok(&s, &["volume", "url", "db", "--host", "linux1"]);
    assert!(
        url.trim().starts_with("iscsi://127.0.0.1:") && url.trim().ends_with("/4"),
        "{url}"
    );
    fails(&s, &["volume", "delete", "db"], "disconnect it first");
    fails(&s, &["host", "delete", "linux1"], "disconnect them first");
    fails(
        &s,
        &["volume", "connect", "db", "--host", "ghost"],
        "host 'ghost' does not exist",
    );

    // snapshot / clone / resize / rename
    ok(&s, &["volume", "snapshot", "db", "db.snap1"]);
    ok(&s, &["volume", "clone", "db.snap1", "db-copy"]);
    let snap = json(&s, &["volume", "show", "db.snap1", "--json"]);
    assert_eq!(snap["kind"], "snapshot");
    fails(
        &s,
        &["volume", "resize", "db", "--size", "1M"],
        "shrinking discards data",
    );
    ok(&s, &["volume", "resize", "db", "--size", "128M"]);
    assert_eq!(
        json(&s, &["volume", "show", "db", "--json"])["provisioned_bytes"],
        128u64 << 20
    );
    ok(&s, &["volume", "rename", "db-copy", "db-clone"]);
    fails(
        &s,
        &["volume", "rename", "db-clone", "db"],
        "already exists",
    );
    let names: Vec<String> = json(&s, &["volume", "list", "--json"])
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["demo", "db", "db.snap1", "db-clone"]);

    // disconnect / delete
    ok(&s, &["volume", "disconnect", "db", "--host", "linux1"]);
    fails(
        &s,
        &["volume", "disconnect", "db", "--host", "linux1"],
        "not connected",
    );
    fails(&s, &["volume", "url", "db"], "not connected to any host");
    for name in ["db", "db.snap1", "db-clone"] {
        ok(&s, &["volume", "delete", name]);
    }
    ok(&s, &["host", "delete", "linux1"]);
    assert_eq!(json(&s, &["host", "list", "--json"]), serde_json::json!([]));

    // array show
    let a = json(&s, &["array", "show", "--json"]);
    for key in ["capacity_bytes", "physical_used_bytes", "data_reduction"] {
        assert!(a.get(key).is_some(), "array show --json lacks {key}: {a}");
    }
    assert!(ok(&s, &["array", "show"]).contains("write amplification"));
    ok(
        &s,
        &[
            "array",
            "set",
            "--soft-threshold",
            "70",
            "--gc-priority",
            "high",
        ],
    );
    let a = json(&s, &["array", "show", "--json"]);
    assert_eq!(
        (a["soft_threshold"].as_f64(), a["gc"]["priority"].as_str()),
        (Some(0.7), Some("high"))
    );
    fails(
        &s,
        &["array", "set", "--soft-threshold", "250"],
        "not between",
    );
    fails(
        &s,
        &["array", "set", "--gc-priority", "warp"],
        "not a GC priority",
    );

    // Shell completions know the subcommands.
    for shell in ["bash", "zsh", "fish"] {
        let script = ok(&s, &["completions", shell]);
        assert!(
            script.contains("snapshot") && script.contains("disconnect"),
            "{shell}"
        );
    }

    // An API that is not there: one sentence, non-zero.
    let out = Command::new(SLIVER)
        .args(["volume", "list", "--api", "http://127.0.0.1:1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach the sliver API"));
}

/// Writes random data to LBAs 0..blocks of `url` until `stop`, then flushes.
fn load(url: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut session =
            sliver_initiator::Session::connect(&url, Default::default()).expect("login");
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let data: Vec<u8> = (0..8 * 512).map(|i| (i as u64 ^ n) as u8 | 1).collect();
            let cmd = sliver_initiator::cdb::write16(n % 2048 * 8, data, 512, false).unwrap();
            session.execute_checked(cmd).expect("write");
            n += 1;
        }
        session
            .execute_checked(sliver_initiator::cdb::synchronize_cache16(0, 0))
            .unwrap();
        n
    })
}

#[test]
fn top_batch_mode_samples_move_under_load_and_reclaim_shows_in_volume_show() {
    let s = serve(&[]);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = load(s.demo_url.clone(), stop.clone());
    let out = ok(&s, &["top", "-b", "-d", "1", "-n", "3"]);
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().unwrap();
    assert!(written > 0);
    let mut lines = out.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(header[1], "volume");
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 3, "three samples of one volume:\n{out}");
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    for row in &rows {
        assert_eq!(row.len(), header.len());
        assert_eq!(row[col("volume")], "demo");
        let iops: f64 = row[col("writes_per_s")].parse().unwrap();
        assert!(iops > 0.0, "writes move in every sample:\n{out}");
    }

    // Raw reclaim of everything written: the volume's mapped bytes drop to zero.
    let before = json(&s, &["volume", "show", "demo", "--json"]);
    assert!(before["mapped_bytes"].as_u64().unwrap() > 0);
    let out = ok(
        &s,
        &[
            "reclaim",
            "--lun",
            &s.demo_url,
            "--lba",
            "0",
            "--count",
            "16384",
            "--blocks-per-command",
            "2048",
        ],
    );
    assert!(!out.is_empty());
    let after = json(&s, &["volume", "show", "demo", "--json"]);
    assert_eq!(after["mapped_bytes"], 0, "{after}");
    assert_eq!(after["vaai"]["delete"], 8);
    assert_eq!(after["vaai"]["deleted_bytes"], 16384u64 * 512);
}

#[test]
fn serve_refuses_bad_configuration_and_an_open_api_without_token() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sliver.toml");
    std::fs::write(&config, "[gc]\npriority = \"sometimes\"\n").unwrap();
    let out = Command::new(SLIVER)
        .args(["serve", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("line 2") && stderr.contains("sometimes"),
        "{stderr}"
    );

    let started = Instant::now();
    let out = Command::new(SLIVER)
        .args(["serve", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(["--api-listen", "0.0.0.0:0", "--iscsi-listen", "127.0.0.1:0"])
        .env_remove("SLIVER_API_TOKEN")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("without a token"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(60));
}

#[test]
fn a_configuration_file_declares_hosts_and_the_api_token() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sliver.toml");
    std::fs::write(
        &config,
        r#"
target_name = "iqn.2026-11.test.sliver:configured"
[api]
token = "a-long-enough-api-token"
[gc]
priority = "low"
[[hosts]]
name = "esx1"
iqns = ["iqn.1998-01.com.vmware:esx1"]
chap_user = "esx1"
chap_secret = "esx1-chap-secret"
"#,
    )
    .unwrap();
    let s = serve(&["--config", config.to_str().unwrap()]);
    assert!(s.demo_url.contains("iqn.2026-11.test.sliver:configured"));
    fails(&s, &["host", "list"], "API token is required");
    let out = Command::new(SLIVER)
        .args(["host", "list", "--json", "--api", &s.api])
        .env("SLIVER_API_TOKEN", "a-long-enough-api-token")
        .output()
        .unwrap();
    assert!(out.status.success());
    let hosts: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(hosts[0]["name"], "esx1");
    assert_eq!(hosts[0]["chap_user"], "esx1");
    let out = Command::new(SLIVER)
        .args([
            "array",
            "show",
            "--json",
            "--api",
            &s.api,
            "--api-token",
            "a-long-enough-api-token",
        ])
        .output()
        .unwrap();
    let a: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(a["gc"]["priority"], "low");
}

#[test]
fn an_endpoint_without_credentials_is_one_sentence_at_once_never_instance_metadata() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens on these ports: the store's, and the instance metadata's were it tried
    // (AWS_METADATA_ENDPOINT keeps it off 169.254.169.254).
    let closed = || {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let endpoint = format!("http://127.0.0.1:{}", closed());
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    for args in [
        vec!["restore", "--from", "s3://pool/site-a", "--data-dir", data],
        vec!["restore", "--from", "s3://pool/site-a", "--list"],
        vec![
            "serve",
            "--data-dir",
            data,
            "--capacity",
            "1G",
            "--iscsi-listen",
            "127.0.0.1:0",
            "--api-listen",
            "127.0.0.1:0",
            "--replicate-to",
            "s3://pool/site-a",
        ],
    ] {
        let started = Instant::now();
        let mut child = Command::new(SLIVER)
            .args(&args)
            .args(["--s3-endpoint", &endpoint])
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .env_remove("SLIVER_S3_CREDENTIALS")
            .env(
                "AWS_METADATA_ENDPOINT",
                format!("http://127.0.0.1:{}", closed()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // A server that started anyway is stopped (by its PID) and the test fails below.
        while child.try_wait().unwrap().is_none() && started.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {stderr}");
        let said = format!(
            "no credentials are configured for s3://pool/site-a at {endpoint}: set \
             AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in sliver's environment"
        );
        assert!(stderr.contains(&said), "{args:?}: {stderr}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{args:?}: failed after {:?}",
            started.elapsed()
        );
        if args[0] == "restore" {
            assert!(!std::path::Path::new(data).exists(), "{args:?} made {data}");
        }
    }
}

/// A reader that goes away early (`sliver completions bash | head -1`) ends the command
/// quietly, without a panic: the bash script is larger than a pipe holds, so the command is
/// still writing when the pipe closes.
#[test]
fn a_closed_output_pipe_ends_a_command_without_a_panic() {
    let mut child = Command::new(SLIVER)
        .args(["completions", "bash"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.contains("sliver"), "{first}");
    // The pipe's read end is dropped with the reader.
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    use std::os::unix::process::ExitStatusExt;
    assert!(
        out.status.success() || out.status.signal() == Some(libc::SIGPIPE),
        "{:?}",
        out.status
    );
}
