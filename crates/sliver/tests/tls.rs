//! The management API over TLS against a real `sliver serve`: curl and the CLI over HTTPS
//! with the certificate's fingerprint, plain HTTP to the HTTPS port refused, a wrong
//! fingerprint refused with its sentence, a certificate replaced on disk served without a
//! restart, and wrong API tokens slowed down for their address only.

use serde_json::Value;
use sliver_server::throttle::{delay_after, worth_reporting, FREE_FAILURES};
use sliver_test_support::slowdown::each_attempt_slowed;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const SLIVER: &str = env!("CARGO_BIN_EXE_sliver");
const TOKEN: &str = "tls-test-token-0123456789";

/// A `sliver serve` on loopback and what it printed.
struct Array {
    child: Child,
    api: String,
    /// The fingerprint line, when it serves HTTPS.
    fingerprint: Option<String>,
    dir: tempfile::TempDir,
}

impl Drop for Array {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(extra: &[&str]) -> Array {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(SLIVER)
        .args(["serve", "--data-dir"])
        .arg(dir.path().join("data"))
        .args([
            "--iscsi-listen",
            "127.0.0.1:0",
            "--api-listen",
            "127.0.0.1:0",
        ])
        .args(["--capacity", "1G", "--api-token", TOKEN])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut fingerprint = None;
    let api = loop {
        let line = lines.next().expect("sliver serve printed its API").unwrap();
        if let Some(f) = line.strip_prefix("API certificate SHA-256 fingerprint: ") {
            fingerprint = Some(f.to_string());
        }
        if let Some(url) = line.strip_prefix("API: ") {
            break url.to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    Array {
        child,
        api,
        fingerprint,
        dir,
    }
}

/// The CLI against `api`, with the token and these environment variables.
fn sliver(api: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(SLIVER);
    c.args(args)
        .env("SLIVER_API", api)
        .env("SLIVER_API_TOKEN", TOKEN)
        .env_remove("SLIVER_API_FINGERPRINT");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// The one line the CLI failed with.
#[track_caller]
fn failure(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).trim_end().to_string();
    assert!(!out.status.success(), "should fail: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line of error: {stderr:?}");
    stderr
}

/// curl with `args`: (HTTP status, body). A connection curl could not make is status 0.
fn curl(args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "30", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("curl is installed (.ci/run installs it)");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (status.trim().parse().unwrap_or(0), body.to_string())
}

fn cert_path(a: &Array) -> PathBuf {
    a.dir
        .path()
        .join("data")
        .join(sliver_server::tls::CERT_FILE)
}

#[test]
fn curl_and_the_cli_over_https_with_the_fingerprint_and_plain_http_refused() {
    let a = serve(&["--api-tls"]);
    assert!(a.api.starts_with("https://127.0.0.1:"), "{}", a.api);
    let fp = a.fingerprint.clone().expect("the fingerprint is printed");
    let key = a.dir.path().join("data").join(sliver_server::tls::KEY_FILE);
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&key).unwrap().permissions())
            & 0o777,
        0o600
    );

    // The CLI, pinned by the environment and by the flag (in another spelling).
    let out = sliver(
        &a.api,
        &["array", "show", "--json"],
        &[("SLIVER_API_FINGERPRINT", &fp)],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let info: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        info["tls_fingerprint"],
        fp.as_str(),
        "the array shows what it printed"
    );
    let spelled = fp.replace(':', "").to_lowercase();
    let out = sliver(
        &a.api,
        &["volume", "list", "--api-fingerprint", &spelled],
        &[],
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("demo"));

    // curl, trusting the generated certificate as its own CA (as Prometheus is told to).
    let cert = cert_path(&a);
    let cert = cert.to_str().unwrap();
    let bearer = format!("Authorization: Bearer {TOKEN}");
    let trusting =
        |path: &str| curl(&["--cacert", cert, "-H", &bearer, &format!("{}{path}", a.api)]);
    let (status, body) = trusting("/api/v1/array");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["tls_fingerprint"],
        fp.as_str()
    );
    let (status, body) = trusting("/metrics");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("sliver_"), "{body}");
    // Without trusting it, curl refuses the certificate (status 0: no HTTP exchange).
    assert_eq!(curl(&[&format!("{}/api/v1/array", a.api)]).0, 0);

    // Plain HTTP to the HTTPS port: a clear refusal, at once, never a hang.
    let plain = a.api.replace("https://", "http://");
    let started = Instant::now();
    let (status, body) = curl(&["-H", &bearer, &format!("{plain}/api/v1/array")]);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("use https://"), "{body}");
    assert!(started.elapsed() < Duration::from_secs(20));
    let e = failure(&sliver(&plain, &["volume", "list"], &[]));
    assert!(e.contains("use https://"), "{e}");

    // A wrong fingerprint: refused with the sentence naming both.
    let wrong = format!(
        "{}{}",
        if fp.starts_with('0') { "1" } else { "0" },
        &fp[1..]
    );
    let e = failure(&sliver(
        &a.api,
        &["volume", "list"],
        &[("SLIVER_API_FINGERPRINT", &wrong)],
    ));
    assert!(
        e.contains(&format!(
            "the array's certificate fingerprint is {fp}, expected {wrong}"
        )),
        "{e}"
    );
    // No fingerprint: the system's CA store does not know a self-signed certificate.
    let e = failure(&sliver(&a.api, &["volume", "list"], &[]));
    assert!(e.contains("fingerprint"), "{e}");
    // A fingerprint for a plain URL is an error, never plain HTTP sent anyway.
    let e = failure(&sliver(
        &plain,
        &["volume", "list", "--api-fingerprint", &fp],
        &[],
    ));
    assert!(e.contains("give its https:// URL"), "{e}");
    let e = failure(&sliver(
        &a.api,
        &["volume", "list", "--api-fingerprint", "AB:CD"],
        &[],
    ));
    assert!(e.contains("is not a SHA-256 fingerprint"), "{e}");
}

/// A new certificate and key for `dir`, from the same generator `sliver serve` uses.
fn new_pair(dir: &Path) -> (PathBuf, PathBuf) {
    let (cert, key, _) =
        sliver_server::tls::self_signed(dir, &["localhost".into(), "127.0.0.1".into()]).unwrap();
    (cert, key)
}

fn fingerprint_of(cert: &Path) -> String {
    use rustls::pki_types::pem::PemObject;
    let der = rustls::pki_types::CertificateDer::from_pem_file(cert).unwrap();
    sliver_server::tls::Fingerprint::of(&der).to_string()
}

#[test]
fn the_administrators_certificate_replaced_on_disk_is_served_without_a_restart() {
    let files = tempfile::tempdir().unwrap();
    let (cert, key) = new_pair(files.path());
    let config = files.path().join("sliver.toml");
    std::fs::write(
        &config,
        format!(
            "[api]\ntls_cert = \"{}\"\ntls_key = \"{}\"\n",
            cert.display(),
            key.display()
        ),
    )
    .unwrap();
    // On loopback, a certificate given is HTTPS without --api-tls.
    let a = serve(&["--config", config.to_str().unwrap()]);
    let first = fingerprint_of(&cert);
    assert_eq!(a.fingerprint.as_deref(), Some(first.as_str()));
    assert!(a.api.starts_with("https://"));

    // A damaged file in between changes nothing (the last good pair stays served).
    std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\ndamaged\n").unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let out = sliver(
        &a.api,
        &["volume", "list"],
        &[("SLIVER_API_FINGERPRINT", &first)],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The replacement moved into place, key first, as an administrator's tooling would.
    let next = tempfile::tempdir().unwrap();
    let (new_cert, new_key) = new_pair(next.path());
    let second = fingerprint_of(&new_cert);
    std::fs::rename(&new_key, &key).unwrap();
    std::fs::rename(&new_cert, &cert).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = sliver(
            &a.api,
            &["volume", "list"],
            &[("SLIVER_API_FINGERPRINT", &second)],
        );
        if out.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new certificate is not served: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The old pin is now refused, naming the certificate served.
    let e = failure(&sliver(
        &a.api,
        &["volume", "list"],
        &[("SLIVER_API_FINGERPRINT", &first)],
    ));
    assert!(
        e.contains(&format!("fingerprint is {second}, expected {first}")),
        "{e}"
    );
    let out = sliver(
        &a.api,
        &["array", "show", "--json"],
        &[("SLIVER_API_FINGERPRINT", &second)],
    );
    let info: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["tls_fingerprint"], second.as_str());
}

#[test]
fn wrong_tokens_are_slowed_and_logged_while_another_address_is_not() {
    let a = serve(&[]);
    let url = format!("{}/api/v1/volumes", a.api);
    let from = |ip: &str, token: &str| {
        let started = Instant::now();
        let auth = format!("Authorization: Bearer {token}");
        let (status, body) = curl(&["--interface", ip, "-H", &auth, &url]);
        (status, body, started.elapsed())
    };
    let failures = FREE_FAILURES + 5;
    each_attempt_slowed(failures, |n| {
        let (status, body, _) = from("127.0.0.1", "a-wrong-token-0123456789");
        assert_eq!(status, 401, "attempt {n}: {body}");
    });
    // Another address with the right token is not held up by the guessing one.
    let (status, body, took) = from("127.0.0.2", TOKEN);
    assert_eq!(status, 200, "{body}");
    let bound = delay_after(failures) / 2;
    assert!(
        took < bound,
        "a request from another address took {took:?} (the guessing address waits {:?})",
        delay_after(failures)
    );
    // The guesses are in the events log, a few lines rather than one per guess.
    let (status, body) = curl(&[
        "--interface",
        "127.0.0.2",
        "-H",
        &format!("Authorization: Bearer {TOKEN}"),
        &format!("{}/api/v1/events?limit=1000", a.api),
    ]);
    assert_eq!(status, 200, "{body}");
    let page: Value = serde_json::from_str(&body).unwrap();
    let logged: Vec<&str> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "authentication_failed")
        .map(|e| e["message"].as_str().unwrap())
        .collect();
    let expected = (1..=failures).filter(|n| worth_reporting(*n)).count();
    assert_eq!(logged.len(), expected, "{logged:#?}");
    assert!(
        logged
            .iter()
            .all(|m| m.starts_with("wrong API token from 127.0.0.1")),
        "{logged:#?}"
    );
    // The right token from the slowed address is served once its turn comes.
    let (status, body, _) = from("127.0.0.1", TOKEN);
    assert_eq!(status, 200, "{body}");
}
