//! CHAP with MD5 (RFC 1994, RFC 7143 §12.1.3): response = MD5(identifier || secret || challenge).

use md5::{Digest, Md5};

/// CHAP_A value for MD5, the only algorithm we offer.
pub const ALGORITHM_MD5: &str = "5";
/// Challenge length we issue (RFC 7143 §12.1.3 wants at least 16 random bytes).
pub const CHALLENGE_LEN: usize = 32;
/// Longest challenge we accept from an initiator for mutual CHAP (bounded work and memory).
pub const MAX_CHALLENGE_LEN: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChapCredentials {
    pub user: String,
    pub secret: Vec<u8>,
}

/// Computes the CHAP MD5 response.
pub fn response(identifier: u8, secret: &[u8], challenge: &[u8]) -> [u8; 16] {
    let mut h = Md5::new();
    h.update([identifier]);
    h.update(secret);
    h.update(challenge);
    h.finalize().into()
}

/// A challenge we issued, remembered until the initiator answers.
#[derive(Debug, Clone)]
pub struct Challenge {
    pub identifier: u8,
    pub challenge: Vec<u8>,
}

impl Challenge {
    /// A challenge drawn from `random`: the identifier from its first byte, the challenge
    /// from the rest ([`crate::Authority::fill_random`] fills it).
    pub fn drawn(random: &[u8; CHALLENGE_LEN + 1]) -> Self {
        Self {
            identifier: random[0],
            challenge: random[1..].to_vec(),
        }
    }

    /// Checks the initiator's answer in constant time with respect to the response bytes.
    pub fn verify(&self, expected: &ChapCredentials, user: &str, answer: &[u8]) -> bool {
        use subtle::ConstantTimeEq;
        let want = response(self.identifier, &expected.secret, &self.challenge);
        // `ct_eq` answers at once for a length other than 16 bytes: the length is public.
        let same: bool = answer.ct_eq(&want).into();
        same && user == expected.user
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc1994_style_response() {
        // MD5(0x01 || "secret" || 0x00..0x0f), computed independently with Python's hashlib.
        let challenge: Vec<u8> = (0..16).collect();
        let r = response(1, b"secret", &challenge);
        assert_eq!(
            crate::text::encode_hex(&r),
            "0x740e86463bda3a4d7017d6e0fba0699d"
        );
    }

    #[test]
    fn verify_accepts_only_right_secret_and_user() {
        let creds = ChapCredentials {
            user: "alice".into(),
            secret: b"0123456789ab".to_vec(),
        };
        let mut random = [0u8; CHALLENGE_LEN + 1];
        for (i, b) in random.iter_mut().enumerate() {
            *b = (i * 37 + 11) as u8;
        }
        let c = Challenge::drawn(&random);
        assert_eq!((c.identifier, c.challenge.len()), (11, CHALLENGE_LEN));
        let good = response(c.identifier, &creds.secret, &c.challenge);
        assert!(c.verify(&creds, "alice", &good));
        assert!(!c.verify(&creds, "bob", &good));
        let bad = response(c.identifier, b"wrong-secret", &c.challenge);
        assert!(!c.verify(&creds, "alice", &bad));
        assert!(!c.verify(&creds, "alice", &good[..15]));
    }
}
