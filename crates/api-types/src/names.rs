//! Validated names: a value of these types has been checked, so code that takes one does not
//! check again and cannot forget to. The API, the configuration file and the array make them
//! the same way ([`IscsiName::new`]); what the array already stored is read as it was written.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The longest iSCSI name, in bytes (RFC 7143 4.2.7.1).
pub const MAX_ISCSI_NAME_BYTES: usize = 223;

/// An iSCSI name (RFC 7143 4.2.7): the `iqn.`, `eui.` or `naa.` form (any case), at most 223
/// bytes of ASCII letters, digits, `-`, `.` and `:`. Deserializing one checks it too.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct IscsiName(String);

/// A string that is not an iSCSI name; it carries the string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidIscsiName(pub String);

impl fmt::Display for InvalidIscsiName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "'{}' is not an iSCSI name (iqn., eui. or naa. form, at most {MAX_ISCSI_NAME_BYTES} \
             characters)",
            self.0
        )
    }
}

impl std::error::Error for InvalidIscsiName {}

impl IscsiName {
    pub fn new(name: impl Into<String>) -> Result<Self, InvalidIscsiName> {
        let name = name.into();
        let form = ["iqn.", "eui.", "naa."].iter().any(|prefix| {
            name.len() > prefix.len()
                && name.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
        });
        let ok = name.len() <= MAX_ISCSI_NAME_BYTES
            && form
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-.:".contains(&b));
        if ok {
            Ok(IscsiName(name))
        } else {
            Err(InvalidIscsiName(name))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for IscsiName {
    type Error = InvalidIscsiName;
    fn try_from(name: String) -> Result<Self, Self::Error> {
        IscsiName::new(name)
    }
}

impl From<IscsiName> for String {
    fn from(name: IscsiName) -> String {
        name.0
    }
}

impl AsRef<str> for IscsiName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IscsiName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_forms_are_names_and_anything_else_is_refused_with_the_string() {
        for good in [
            "iqn.1998-01.com.vmware:esx1",
            "IQN.2026-11.test:h",
            "eui.02004567A425678D",
            "naa.52004567BA64678D",
            &format!("iqn.{}", "a".repeat(MAX_ISCSI_NAME_BYTES - 4)),
        ] {
            assert_eq!(IscsiName::new(good).map(String::from), Ok(good.to_owned()));
        }
        for bad in [
            "",
            "iqn.",
            "nope",
            "iqn.2026-11.test:h i",
            "iqn.2026-11.test:h,i,0x1",
            "iqn.2026-11.tést",
            // A multi-byte character where the form's prefix ends.
            "iqé.x",
            &format!("iqn.{}", "a".repeat(MAX_ISCSI_NAME_BYTES - 3)),
        ] {
            assert_eq!(
                IscsiName::new(bad),
                Err(InvalidIscsiName(bad.to_owned())),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn deserializing_checks_and_serializing_gives_the_plain_string() {
        let name: IscsiName = serde_json::from_str(r#""iqn.2026-11.test:h""#).unwrap();
        assert_eq!(
            serde_json::to_string(&name).unwrap(),
            r#""iqn.2026-11.test:h""#
        );
        let refused = serde_json::from_str::<IscsiName>(r#""nope""#).unwrap_err();
        assert!(
            refused.to_string().contains("'nope' is not an iSCSI name"),
            "{refused}"
        );
    }
}
