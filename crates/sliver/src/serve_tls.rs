//! Whether `sliver serve` speaks HTTPS on its API port, and with which certificate.

use sliver_server::tls::{self, CertFiles};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The certificate the API serves.
#[derive(Debug)]
pub enum ApiCertificate {
    /// The pair generated in the data directory (created at the first start), naming these
    /// hosts and addresses.
    Generated { names: Vec<String> },
    /// The administrator's files.
    Files { cert: PathBuf, key: PathBuf },
}

/// Decides from the flag, the configuration and the address: HTTPS whenever the API
/// listens beyond loopback; on loopback when asked (`--api-tls`, `[api] tls = true`) or
/// when a certificate is given. `None`: plain HTTP.
pub fn choose(
    listen: SocketAddr,
    flag: bool,
    configured: Option<bool>,
    files: Option<(PathBuf, PathBuf)>,
    allowed_names: &[String],
) -> Result<Option<ApiCertificate>, String> {
    let beyond_loopback = !listen.ip().is_loopback();
    // The flag overrides the file.
    let wanted = if flag { Some(true) } else { configured };
    if wanted == Some(false) && beyond_loopback {
        return Err(format!("[api] tls = false, but the API listens on {listen}, beyond loopback, where it serves HTTPS only (tokens and CHAP secrets must not cross the network in clear)"));
    }
    if wanted == Some(false) && files.is_some() {
        return Err("[api] tls = false contradicts tls_cert and tls_key".into());
    }
    if !(beyond_loopback || wanted == Some(true) || files.is_some()) {
        return Ok(None);
    }
    Ok(Some(match files {
        Some((cert, key)) => ApiCertificate::Files { cert, key },
        None => ApiCertificate::Generated {
            names: certificate_names(listen, allowed_names),
        },
    }))
}

/// The names a generated certificate holds, for clients that check them (a CA store that
/// trusts it, Prometheus with the certificate as its CA): loopback, the machine's name,
/// the listening address and the allowed host names.
fn certificate_names(listen: SocketAddr, allowed_names: &[String]) -> Vec<String> {
    let mut names: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    if let Ok(own) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        names.push(own.trim().to_string());
    }
    if !listen.ip().is_unspecified() {
        names.push(listen.ip().to_string());
    }
    names.extend(allowed_names.iter().cloned());
    // A certificate holds ASCII names only (IA5String); an internationalised host name
    // would have to be in its punycode form, which is what a client then sends anyway.
    names.retain(|n| !n.is_empty() && n.is_ascii());
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(n.clone()));
    names
}

/// Loads (or for the generated pair, first creates) the certificate; prints and logs its
/// fingerprint, which clients pin.
pub fn load(choice: &ApiCertificate, data_dir: &Path) -> Result<Arc<CertFiles>, String> {
    let (cert, key) = match choice {
        ApiCertificate::Files { cert, key } => (cert.clone(), key.clone()),
        ApiCertificate::Generated { names } => {
            let (cert, key, created) = tls::self_signed(data_dir, names)?;
            if created {
                tracing::info!(
                    "created the API's self-signed certificate {} (key {}, readable by its owner only)",
                    cert.display(),
                    key.display()
                );
            }
            (cert, key)
        }
    };
    let files = CertFiles::open(&cert, &key).map_err(|e| format!("the API's certificate: {e}"))?;
    if matches!(choice, ApiCertificate::Files { .. }) {
        warn_if_key_readable(&key);
    }
    let fingerprint = files.fingerprint();
    tracing::info!(
        "API certificate {}: SHA-256 fingerprint {fingerprint}",
        cert.display()
    );
    println!("API certificate SHA-256 fingerprint: {fingerprint}");
    Ok(Arc::new(files))
}

/// A key others can read is a key others may have copied: say so, serve anyway (the
/// administrator owns the file's permissions).
fn warn_if_key_readable(key: &Path) {
    use std::os::unix::fs::MetadataExt;
    if let Ok(m) = std::fs::metadata(key) {
        if m.mode() & 0o077 != 0 {
            tracing::warn!(
                "the API's private key {} is readable by other users (mode {:o}): chmod 600 it",
                key.display(),
                m.mode() & 0o777
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn https_beyond_loopback_always_and_on_loopback_when_asked() {
        let lo: SocketAddr = "127.0.0.1:8600".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:8600".parse().unwrap();
        let files = || Some(("c.pem".into(), "k.pem".into()));
        assert!(choose(lo, false, None, None, &[]).unwrap().is_none());
        assert!(choose(lo, false, Some(false), None, &[]).unwrap().is_none());
        assert!(matches!(
            choose(lo, true, Some(false), None, &[]),
            Ok(Some(ApiCertificate::Generated { .. }))
        ));
        assert!(matches!(
            choose(lo, false, Some(true), None, &[]),
            Ok(Some(ApiCertificate::Generated { .. }))
        ));
        assert!(matches!(
            choose(lo, false, None, files(), &[]),
            Ok(Some(ApiCertificate::Files { .. }))
        ));
        match choose(any, false, None, None, &["array1.example.com".into()]) {
            Ok(Some(ApiCertificate::Generated { names })) => {
                assert!(names.iter().any(|n| n == "array1.example.com"), "{names:?}");
                assert!(names.iter().any(|n| n == "127.0.0.1"), "{names:?}");
                assert!(!names.iter().any(|n| n == "0.0.0.0"), "{names:?}");
            }
            other => panic!("{other:?}"),
        }
        let e = choose(any, false, Some(false), None, &[]).unwrap_err();
        assert!(e.contains("beyond loopback"), "{e}");
        let e = choose(lo, false, Some(false), files(), &[]).unwrap_err();
        assert!(e.contains("contradicts"), "{e}");
    }
}
