//! TLS for the management API, `/metrics` and the console (and, when it exists, the
//! node-to-node link): one place that builds rustls server and client configurations, so
//! every endpoint speaks the same protocol versions and cipher suites.
//!
//! Why rustls with the ring provider and rcgen: see docs/design.md, "Management over TLS".
//! In short, no system library to link or keep patched (OpenSSL), memory-safe parsing of
//! what the network sends, the stack the Rust ecosystem (hyper, tokio, ureq) already uses,
//! and ring builds with nothing beyond a C compiler, where aws-lc-rs needs cmake.
//!
//! The pieces: [`CertFiles`] serves a certificate and key from PEM files and picks up a
//! replacement without a restart; [`self_signed`] creates the pair `sliver serve` uses when
//! the administrator gives none; [`ApiListener`] accepts TCP connections, answers plain HTTP
//! sent to a TLS port with a refusal and hands finished handshakes to the HTTP server;
//! [`PinnedVerifier`] lets a client trust one certificate by its [`Fingerprint`].

mod files;
mod listener;
mod pin;

pub use files::{self_signed, CertFiles, CERT_FILE, KEY_FILE};
pub use listener::{ApiListener, ApiStream};
pub use pin::PinnedVerifier;

use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, ServerConfig};
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// The cryptography every configuration uses: ring's, named rather than taken from a
/// process-wide default that a dependency could install.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A server configuration presenting what `certs` resolves at each handshake (TLS 1.2 and
/// 1.3, HTTP/1.1: the API's server speaks nothing else).
pub fn server_config(
    certs: Arc<dyn rustls::server::ResolvesServerCert>,
) -> Result<ServerConfig, String> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("cannot set up TLS: {e}"))?
        .with_no_client_auth()
        .with_cert_resolver(certs);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// How a client decides to trust a server.
#[derive(Clone, Debug)]
pub enum Trust {
    /// Exactly the certificate of this fingerprint (a self-signed array certificate).
    Pinned(Fingerprint),
    /// A certificate that chains to the system's CA store and names the server.
    SystemRoots,
}

/// A client configuration for `trust`; with [`Trust::Pinned`], also the verifier, which
/// remembers the certificate a refused server presented (for the error message).
pub fn client_config(trust: &Trust) -> Result<(ClientConfig, Option<Arc<PinnedVerifier>>), String> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("cannot set up TLS: {e}"))?;
    match trust {
        Trust::Pinned(fingerprint) => {
            let verifier = Arc::new(PinnedVerifier::new(*fingerprint, provider()));
            let config = builder
                .dangerous()
                .with_custom_certificate_verifier(verifier.clone())
                .with_no_client_auth();
            Ok((config, Some(verifier)))
        }
        Trust::SystemRoots => {
            let found = rustls_native_certs::load_native_certs();
            let mut roots = rustls::RootCertStore::empty();
            let (added, _ignored) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                let why = found
                    .errors
                    .first()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default();
                return Err(format!(
                    "no CA certificate found in the system's store{why}: trust the array by its certificate fingerprint instead"
                ));
            }
            Ok((
                builder.with_root_certificates(roots).with_no_client_auth(),
                None,
            ))
        }
    }
}

/// The SHA-256 digest of a certificate (its DER encoding): what `sliver serve` prints at
/// start, what `openssl x509 -fingerprint -sha256` and browsers show, and what a client
/// pins.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    pub fn of(certificate_der: &[u8]) -> Self {
        Fingerprint(Sha256::digest(certificate_der).into())
    }
}

/// Upper-case hex pairs joined by colons, as OpenSSL and browsers print it.
impl std::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{b:02X}")?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

/// Reads the printed form, and the forms other tools print: either case, colons or not, an
/// optional `sha256:` or `SHA256 Fingerprint=` in front.
impl std::str::FromStr for Fingerprint {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "'{}' is not a SHA-256 fingerprint: give the 64 hex digits `sliver serve` prints (colons allowed)",
                text.chars().take(120).collect::<String>()
            )
        };
        let trimmed = text.trim();
        let hex = [
            "SHA256 Fingerprint=",
            "sha256 Fingerprint=",
            "sha256:",
            "SHA256:",
        ]
        .iter()
        .find_map(|p| trimmed.strip_prefix(p))
        .unwrap_or(trimmed);
        let digits: Vec<u8> = hex.bytes().filter(|b| *b != b':').collect();
        if digits.len() != 64 {
            return Err(bad());
        }
        let mut out = [0u8; 32];
        for (i, pair) in digits.chunks(2).enumerate() {
            let pair = std::str::from_utf8(pair).map_err(|_| bad())?;
            out[i] = u8::from_str_radix(pair, 16).map_err(|_| bad())?;
        }
        Ok(Fingerprint(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fingerprint_reads_back_what_it_prints_and_what_openssl_prints() {
        let f = Fingerprint::of(b"not really a certificate");
        let printed = f.to_string();
        assert_eq!(printed.len(), 32 * 3 - 1);
        assert_eq!(printed.parse::<Fingerprint>(), Ok(f));
        assert_eq!(printed.to_lowercase().parse::<Fingerprint>(), Ok(f));
        assert_eq!(printed.replace(':', "").parse::<Fingerprint>(), Ok(f));
        assert_eq!(
            format!("SHA256 Fingerprint={printed}").parse::<Fingerprint>(),
            Ok(f)
        );
        for bad in [
            "",
            "AB:CD",
            &printed[3..],
            &format!("G{}", &printed[1..]),
            "é".repeat(32).as_str(),
        ] {
            let e = bad.parse::<Fingerprint>().unwrap_err();
            assert!(e.contains("is not a SHA-256 fingerprint"), "{e}");
        }
    }
}
