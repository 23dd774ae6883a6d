//! Trusting one server certificate by its fingerprint: how a client reaches an array whose
//! certificate is self-signed, without a CA and without turning verification off.

use super::Fingerprint;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use std::sync::{Arc, Mutex};

/// Accepts a server whose end-entity certificate has the expected fingerprint, whatever
/// names it holds and whoever issued it (the pin is the identity). The handshake's
/// signatures are still checked against that certificate's key, so only the holder of the
/// key passes. Remembers the fingerprint a refused server presented.
#[derive(Debug)]
pub struct PinnedVerifier {
    expected: Fingerprint,
    provider: Arc<CryptoProvider>,
    refused: Mutex<Option<Fingerprint>>,
}

impl PinnedVerifier {
    pub fn new(expected: Fingerprint, provider: Arc<CryptoProvider>) -> Self {
        PinnedVerifier {
            expected,
            provider,
            refused: Mutex::new(None),
        }
    }

    /// The fingerprint of the last certificate refused, if one was.
    pub fn refused(&self) -> Option<Fingerprint> {
        *self.refused.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The sentence a client prints when the server presented another certificate.
    pub fn mismatch_message(&self, server: &str) -> Option<String> {
        self.refused().map(|seen| {
            format!(
                "the array's certificate fingerprint is {seen}, expected {}: {server} is not the array you pinned, or its certificate was replaced (check the fingerprint `sliver serve` printed, or the console's settings, before trusting the new one)",
                self.expected
            )
        })
    }
}

impl ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let seen = Fingerprint::of(end_entity);
        if seen == self.expected {
            return Ok(ServerCertVerified::assertion());
        }
        *self.refused.lock().unwrap_or_else(|e| e.into_inner()) = Some(seen);
        Err(rustls::Error::General(format!(
            "certificate fingerprint {seen}, expected {}",
            self.expected
        )))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
