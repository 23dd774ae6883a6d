//! Certificate and key files: the pair `sliver serve` generates, and [`CertFiles`], which
//! serves a pair from disk and follows its replacement.

use super::{provider, Fingerprint};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The generated certificate, in the data directory.
pub const CERT_FILE: &str = "api-cert.pem";
/// Its private key, readable by its owner only.
pub const KEY_FILE: &str = "api-key.pem";

/// How often a handshake looks at the files' metadata for a replacement: a few `stat`s per
/// interval at most, whatever the connection rate.
const RECHECK: Duration = Duration::from_secs(2);

/// Largest certificate chain or key file read (a PEM chain is a few KiB).
const MAX_FILE: u64 = 1 << 20;

/// The generated pair in `dir`, created if either file is missing: an ECDSA P-256 key
/// (mode 0600) and a self-signed certificate naming `names` (host names and IP addresses).
/// The files never expire on their own (the fingerprint is the identity clients pin, and a
/// new pair would change it). Returns the two paths and whether they were just created.
pub fn self_signed(dir: &Path, names: &[String]) -> Result<(PathBuf, PathBuf, bool), String> {
    let cert = dir.join(CERT_FILE);
    let key = dir.join(KEY_FILE);
    if cert.exists() && key.exists() {
        return Ok((cert, key, false));
    }
    let generated = rcgen::generate_simple_self_signed(names.to_vec())
        .map_err(|e| format!("cannot generate the API's certificate: {e}"))?;
    // The key lands first: a crash between the two leaves a key without its certificate,
    // which the next start replaces, never a certificate without its key.
    write_new(&key, generated.key_pair.serialize_pem().as_bytes(), 0o600)?;
    write_new(&cert, generated.cert.pem().as_bytes(), 0o644)?;
    Ok((cert, key, true))
}

/// Writes `bytes` to `path` through a temporary file created with `mode`, synced, then
/// renamed over `path`: a reader sees the old file or the whole new one.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), String> {
    let tmp = path.with_extension("pem.tmp");
    let _ = std::fs::remove_file(&tmp);
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// A certificate chain and key served from PEM files, read again when either file changes
/// (checked at a handshake, at most every [`RECHECK`]). A replacement that does not load
/// (half written, damaged, a key of another certificate) is logged and the pair loaded
/// before keeps being served.
#[derive(Debug)]
pub struct CertFiles {
    cert: PathBuf,
    key: PathBuf,
    state: Mutex<Served>,
}

#[derive(Debug)]
struct Served {
    key: Arc<CertifiedKey>,
    fingerprint: Fingerprint,
    /// The files' identity when last read (loaded or refused): a change is a new attempt.
    stamp: Stamp,
    checked: Instant,
}

/// What tells that a file changed: its inode (a rename over it), size and modification
/// time (an edit in place).
type Stamp = [(u64, u64, i64, i64); 2];

impl CertFiles {
    /// Reads the pair; an error names the file and what is wrong with it.
    pub fn open(cert: &Path, key: &Path) -> Result<CertFiles, String> {
        let stamp = stamp(cert, key);
        let (certified, fingerprint) = load(cert, key)?;
        Ok(CertFiles {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            state: Mutex::new(Served {
                key: certified,
                fingerprint,
                stamp,
                checked: Instant::now(),
            }),
        })
    }

    /// The fingerprint of the certificate served now (after looking for a replacement).
    pub fn fingerprint(&self) -> Fingerprint {
        self.current().1
    }

    /// The certificate file.
    pub fn cert_path(&self) -> &Path {
        &self.cert
    }

    fn current(&self) -> (Arc<CertifiedKey>, Fingerprint) {
        let mut served = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if served.checked.elapsed() >= RECHECK {
            served.checked = Instant::now();
            let now = stamp(&self.cert, &self.key);
            if now != served.stamp {
                served.stamp = now;
                match load(&self.cert, &self.key) {
                    Ok((key, fingerprint)) => {
                        tracing::info!(
                            "the API's certificate {} changed: serving it now, SHA-256 fingerprint {fingerprint}",
                            self.cert.display()
                        );
                        served.key = key;
                        served.fingerprint = fingerprint;
                    }
                    Err(e) => tracing::warn!(
                        "the API's certificate files changed but do not load ({e}): still serving the certificate of fingerprint {}",
                        served.fingerprint
                    ),
                }
            }
        }
        (served.key.clone(), served.fingerprint)
    }
}

impl ResolvesServerCert for CertFiles {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current().0)
    }
}

fn stamp(cert: &Path, key: &Path) -> Stamp {
    [cert, key].map(|p| {
        std::fs::metadata(p)
            .map(|m| (m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
            .unwrap_or_default()
    })
}

/// Reads and checks a pair: a chain of one or more certificates, the end entity's first,
/// and the private key that matches it.
fn load(cert: &Path, key: &Path) -> Result<(Arc<CertifiedKey>, Fingerprint), String> {
    let cert_pem = read_bounded(cert, "certificate")?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{} is not a PEM certificate chain: {e}", cert.display()))?;
    let Some(end_entity) = chain.first() else {
        return Err(format!(
            "{} holds no certificate (no BEGIN CERTIFICATE block)",
            cert.display()
        ));
    };
    let fingerprint = Fingerprint::of(end_entity);
    let key_pem = read_bounded(key, "key")?;
    let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        format!(
            "{} holds no PEM private key (PKCS#8, PKCS#1 or SEC1): {e}",
            key.display()
        )
    })?;
    let signing = provider()
        .key_provider
        .load_private_key(private)
        .map_err(|e| format!("{} is not a usable private key: {e}", key.display()))?;
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(|e| {
        format!(
            "the key {} is not the certificate {}'s ({e})",
            key.display(),
            cert.display()
        )
    })?;
    Ok((Arc::new(certified), fingerprint))
}

fn read_bounded(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_FILE + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("cannot read the {what} {}: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(format!(
            "the {what} {} is larger than {} KiB: not a PEM file",
            path.display(),
            MAX_FILE >> 10
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["localhost".into(), "127.0.0.1".into()]
    }

    #[test]
    fn the_generated_pair_loads_is_kept_and_its_key_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key, created) = self_signed(dir.path(), &names()).unwrap();
        assert!(created);
        assert_eq!(
            std::fs::metadata(&key).unwrap().mode() & 0o777,
            0o600,
            "the key is readable by its owner only"
        );
        let served = CertFiles::open(&cert, &key).unwrap();
        let (again_cert, _, created) = self_signed(dir.path(), &names()).unwrap();
        assert!(!created, "a second start keeps the pair");
        let der = CertificateDer::from_pem_file(&again_cert).unwrap();
        assert_eq!(served.fingerprint(), Fingerprint::of(&der));
        // A key left without its certificate (a crash between the two writes) is replaced.
        std::fs::remove_file(&cert).unwrap();
        let (_, _, created) = self_signed(dir.path(), &names()).unwrap();
        assert!(created);
        assert_ne!(
            CertFiles::open(&cert, &key).unwrap().fingerprint(),
            served.fingerprint()
        );
    }

    #[test]
    fn damaged_or_mismatched_files_are_refused_with_the_file_named() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key, _) = self_signed(dir.path(), &names()).unwrap();
        let other = tempfile::tempdir().unwrap();
        let (_, other_key, _) = self_signed(other.path(), &names()).unwrap();
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "-----BEGIN CERTIFICATE-----\nnot base64!\n").unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let missing = dir.path().join("missing.pem");
        for (c, k, needle) in [
            (&cert, &other_key, "is not the certificate"),
            (&garbage, &key, "garbage.pem is not a PEM certificate chain"),
            (&empty, &key, "empty.pem holds no certificate"),
            (&cert, &empty, "empty.pem holds no PEM private key"),
            (&cert, &cert, "holds no PEM private key"),
            (&missing, &key, "cannot read the certificate"),
        ] {
            let e = CertFiles::open(c, k).unwrap_err();
            assert!(e.contains(needle), "{c:?} {k:?}: {e}");
        }
    }

    #[test]
    fn a_replacement_is_served_once_seen_and_a_bad_one_keeps_the_last_good() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key, _) = self_signed(dir.path(), &names()).unwrap();
        let served = CertFiles::open(&cert, &key).unwrap();
        let first = served.fingerprint();
        let force_recheck = || {
            served.state.lock().unwrap().checked = Instant::now() - RECHECK;
        };
        // A damaged certificate: logged, the first one still served.
        std::fs::write(&cert, "damaged").unwrap();
        force_recheck();
        assert_eq!(served.fingerprint(), first);
        // A new pair moved into place.
        let other = tempfile::tempdir().unwrap();
        let (new_cert, new_key, _) = self_signed(other.path(), &names()).unwrap();
        std::fs::rename(&new_key, &key).unwrap();
        std::fs::rename(&new_cert, &cert).unwrap();
        force_recheck();
        let second = served.fingerprint();
        assert_ne!(second, first);
        assert_eq!(
            second,
            Fingerprint::of(&CertificateDer::from_pem_file(&cert).unwrap())
        );
    }
}
