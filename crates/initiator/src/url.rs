//! `iscsi://[USER%SECRET@]HOST[:PORT]/TARGET-IQN/LUN` URLs (the form libiscsi and QEMU use).

use std::fmt;

/// The well-known iSCSI port.
pub const DEFAULT_PORT: u16 = 3260;

/// A parsed iSCSI URL.
#[derive(Clone, PartialEq, Eq)]
pub struct IscsiUrl {
    /// Host name or address; IPv6 addresses without brackets.
    pub host: String,
    pub port: u16,
    pub target: String,
    pub lun: u64,
    /// CHAP user and secret (one-way CHAP).
    pub chap: Option<(String, String)>,
}

/// Why a URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid iSCSI URL '{url}': {reason} (expected iscsi://[USER%SECRET@]HOST[:PORT]/TARGET-IQN/LUN)")]
pub struct UrlError {
    pub url: String,
    pub reason: String,
}

impl IscsiUrl {
    /// Parses an URL; every malformed part is reported, nothing panics.
    pub fn parse(url: &str) -> Result<Self, UrlError> {
        let fail = |reason: &str| UrlError {
            // Never echo a secret back in an error message.
            url: redact(url),
            reason: reason.to_owned(),
        };
        let rest = url
            .strip_prefix("iscsi://")
            .ok_or_else(|| fail("it must start with iscsi://"))?;
        let (authority, path) = rest
            .split_once('/')
            .ok_or_else(|| fail("the target name and LUN are missing"))?;
        let (chap, hostport) = match authority.rsplit_once('@') {
            Some((cred, hp)) => {
                let (user, secret) = cred
                    .split_once('%')
                    .ok_or_else(|| fail("credentials must be USER%SECRET"))?;
                if user.is_empty() || secret.is_empty() {
                    return Err(fail("the CHAP user and secret must not be empty"));
                }
                (Some((user.to_owned(), secret.to_owned())), hp)
            }
            None => (None, authority),
        };
        let (host, port) = split_host_port(hostport).map_err(|r| fail(&r))?;
        let (target, lun) = path
            .rsplit_once('/')
            .ok_or_else(|| fail("the LUN is missing"))?;
        if target.is_empty() {
            return Err(fail("the target name is empty"));
        }
        if target.contains('/') {
            return Err(fail("the target name must not contain '/'"));
        }
        let lun: u64 = lun
            .parse()
            .map_err(|_| fail(&format!("LUN '{lun}' is not a number")))?;
        if lun >= 1 << 14 {
            return Err(fail("LUN must be below 16384"));
        }
        Ok(Self {
            host,
            port,
            target: target.to_owned(),
            lun,
            chap,
        })
    }

    /// `host:port`, with brackets around IPv6 addresses, for `TcpStream::connect`.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

fn split_host_port(s: &str) -> Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or("unterminated '[' in the address")?;
        match after {
            "" => (h, None),
            p => (
                h,
                Some(
                    p.strip_prefix(':')
                        .ok_or("garbage after ']' in the address")?,
                ),
            ),
        }
    } else {
        match s.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    if host.is_empty() {
        return Err("the host is empty".into());
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(p) if p != 0 => p,
            _ => return Err(format!("port '{p}' is not a number in 1..65535")),
        },
    };
    Ok((host.to_owned(), port))
}

fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

impl fmt::Display for IscsiUrl {
    /// The URL without the secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "iscsi://")?;
        if let Some((user, _)) = &self.chap {
            write!(f, "{user}%***@")?;
        }
        write!(f, "{}/{}/{}", self.address(), self.target, self.lun)
    }
}

impl fmt::Debug for IscsiUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_chap_urls() {
        let u = IscsiUrl::parse("iscsi://127.0.0.1:3261/iqn.2026-11.dev.sliver:array/3").unwrap();
        assert_eq!(u.host, "127.0.0.1");
        assert_eq!(u.port, 3261);
        assert_eq!(u.target, "iqn.2026-11.dev.sliver:array");
        assert_eq!(u.lun, 3);
        assert_eq!(u.chap, None);
        assert_eq!(u.address(), "127.0.0.1:3261");

        let u = IscsiUrl::parse("iscsi://alice%s3cret@host.example/iqn.x:y/0").unwrap();
        assert_eq!(u.port, DEFAULT_PORT);
        assert_eq!(u.chap, Some(("alice".into(), "s3cret".into())));
        assert_eq!(
            u.to_string(),
            "iscsi://alice%***@host.example:3260/iqn.x:y/0"
        );

        let u = IscsiUrl::parse("iscsi://[::1]:4000/iqn.x:y/7").unwrap();
        assert_eq!(u.host, "::1");
        assert_eq!(u.address(), "[::1]:4000");
    }

    #[test]
    fn rejects_malformed_urls_with_reasons() {
        for (url, reason) in [
            ("http://h/iqn/0", "iscsi://"),
            ("iscsi://h", "target name and LUN"),
            ("iscsi://h/iqn.x", "LUN is missing"),
            ("iscsi://h/iqn.x/abc", "not a number"),
            ("iscsi://h:0/iqn.x/0", "port"),
            ("iscsi://h:99999/iqn.x/0", "port"),
            ("iscsi://:3260/iqn.x/0", "host is empty"),
            ("iscsi://alice@h/iqn.x/0", "USER%SECRET"),
            ("iscsi://h//0", "target name is empty"),
            ("iscsi://h/iqn.x/99999", "below 16384"),
        ] {
            let err = IscsiUrl::parse(url).unwrap_err();
            assert!(err.reason.contains(reason), "{url}: {err}");
        }
        let err = IscsiUrl::parse("iscsi://bob%topsecret@h/iqn.x/z").unwrap_err();
        assert!(!err.to_string().contains("topsecret"), "{err}");
    }
}
