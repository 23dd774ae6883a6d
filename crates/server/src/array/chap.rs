//! CHAP credentials in two forms: [`ChapSecret`], the only form the array takes from outside
//! (the API, the configuration file, the CLI), which cannot hold a credential the array
//! would refuse; and [`StoredChap`], what `array.json` keeps and logins use, read without
//! checks because versions before the array checked credentials itself could store
//! secrets shorter than today's rule, and such an array must still open.

use super::{ArrayError, Result};
use serde::{Deserialize, Serialize};

/// Shortest secret taken: RFC 7143 recommends at least 12 bytes for one-way CHAP.
const MIN_SECRET: usize = 12;
/// Longest user name and secret taken (the API's and the configuration file's limit).
const MAX_LEN: usize = 255;

/// CHAP credentials the array accepts: a user name of 1 to 255 printable characters and a
/// secret of 12 to 255 bytes. Made only by [`ChapSecret::new`] or by deserialising, which
/// checks the same way, so holding one is proof it is valid.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "StoredChap")]
pub struct ChapSecret(StoredChap);

impl ChapSecret {
    pub fn new(user: impl Into<String>, secret: impl Into<String>) -> Result<Self> {
        Self::try_from(StoredChap {
            user: user.into(),
            secret: secret.into(),
        })
    }

    pub fn user(&self) -> &str {
        &self.0.user
    }
}

impl TryFrom<StoredChap> for ChapSecret {
    type Error = ArrayError;

    fn try_from(c: StoredChap) -> Result<Self> {
        if c.user.is_empty() || c.user.len() > MAX_LEN || c.user.chars().any(char::is_control) {
            return Err(ArrayError::InvalidChap(
                "the CHAP user name must be 1 to 255 printable characters",
            ));
        }
        if !(MIN_SECRET..=MAX_LEN).contains(&c.secret.len()) {
            return Err(ArrayError::InvalidChap(
                "the CHAP secret must be 12 to 255 bytes long",
            ));
        }
        Ok(ChapSecret(c))
    }
}

impl From<ChapSecret> for StoredChap {
    fn from(c: ChapSecret) -> Self {
        c.0
    }
}

impl std::fmt::Debug for ChapSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// CHAP credentials as `array.json` keeps them and a login checks them.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StoredChap {
    pub user: String,
    pub secret: String,
}

/// The secret stays out of logs and error messages.
impl std::fmt::Debug for StoredChap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chap")
            .field("user", &self.user)
            .field("secret", &"<hidden>")
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_credentials_the_array_takes_can_be_made_or_read() {
        assert!(ChapSecret::new("h", "twelve-bytes").is_ok());
        assert!(ChapSecret::new("h", "x".repeat(255)).is_ok());
        for (user, secret) in [
            ("h", "eleven-byte".to_string()),
            ("h", "x".repeat(256)),
            ("", "twelve-bytes".to_string()),
            ("a\nb", "twelve-bytes".to_string()),
        ] {
            assert!(
                matches!(
                    ChapSecret::new(user, secret.clone()),
                    Err(ArrayError::InvalidChap(_))
                ),
                "{user:?} {}",
                secret.len()
            );
            let json = serde_json::json!({ "user": user, "secret": secret });
            assert!(serde_json::from_value::<ChapSecret>(json.clone()).is_err());
            // What array.json holds is read as it is.
            let stored: StoredChap = serde_json::from_value(json).unwrap();
            assert_eq!(stored.secret, secret);
        }
    }

    #[test]
    fn the_secret_is_not_in_debug_output() {
        let c = ChapSecret::new("esx1", "host-secret-1234").unwrap();
        let text = format!("{c:?}");
        assert!(
            text.contains("esx1") && !text.contains("host-secret-1234"),
            "{text}"
        );
    }
}
