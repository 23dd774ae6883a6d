//! Which names a request to the API may be addressed to: the defence against DNS rebinding.
//!
//! A web page the administrator visits can make its own host name resolve to 127.0.0.1 and
//! then call the API from the browser: the request reaches sliver with the attacker's name in
//! its `Host` header (the browser believes it talks to the attacker's site). A token stops
//! it when one is configured, but the loopback default has none. So every request must name
//! sliver by something an attacker cannot own: an IP address literal (a browser sends one
//! only to the address it names), `localhost` or a name under `.localhost` (RFC 6761:
//! browsers resolve them to loopback themselves), or a name the administrator configured
//! (`[api] allowed_hosts`, `--api-allowed-host`; `sliver serve` adds the machine's own host
//! name). The port is not compared: the attack uses the right port with the wrong name.

use std::net::{Ipv4Addr, Ipv6Addr};

/// The configured names a `Host` header may carry besides IP literals and `localhost`:
/// validated DNS names, lower case, without a trailing dot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowedHosts {
    names: Vec<String>,
}

impl AllowedHosts {
    /// Validates `names` (DNS names: letters, digits, '-' and '.', labels of 1-63 bytes, at
    /// most 253 bytes; no port, no scheme).
    pub fn new<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> Result<Self, String> {
        let mut out = AllowedHosts::default();
        for n in names {
            out.add(n.as_ref())?;
        }
        Ok(out)
    }

    /// Adds one name (validated as in [`AllowedHosts::new`]); a name already present is kept
    /// once.
    pub fn add(&mut self, name: &str) -> Result<(), String> {
        let n = name.trim_end_matches('.').to_ascii_lowercase();
        let valid_label = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        };
        if n.is_empty() || n.len() > 253 || !n.split('.').all(valid_label) {
            return Err(format!(
                "'{name}' is not a host name the API can be addressed by (a DNS name such as array1.example.com, without a port)"
            ));
        }
        if !self.names.contains(&n) {
            self.names.push(n);
        }
        Ok(())
    }

    /// The configured names.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Whether a request whose `Host` header is `header` may be served.
    pub fn permits(&self, header: &str) -> bool {
        let Some(host) = host_part(header) else {
            return false;
        };
        if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            return v6.parse::<Ipv6Addr>().is_ok();
        }
        if host.parse::<Ipv4Addr>().is_ok() {
            return true;
        }
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        host == "localhost" || host.ends_with(".localhost") || self.names.contains(&host)
    }
}

/// The host of a `Host` header value: without the port, IPv6 literals still bracketed.
/// `None` for a malformed value (a port that is not a number, unbalanced brackets, nothing).
fn host_part(header: &str) -> Option<&str> {
    let h = header.trim();
    let (host, port) = if h.starts_with('[') {
        let end = h.find(']')?;
        let rest = &h[end + 1..];
        let port = match rest.strip_prefix(':') {
            Some(p) => Some(p),
            None if rest.is_empty() => None,
            None => return None,
        };
        (&h[..=end], port)
    } else {
        match h.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (h, None),
        }
    };
    if let Some(p) = port {
        if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
    }
    (!host.is_empty()).then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_ip_literals_are_served_other_names_only_when_configured() {
        let none = AllowedHosts::default();
        for ok in [
            "127.0.0.1:8600",
            "127.0.0.1",
            "10.1.2.3:8600",
            "[::1]:8600",
            "[::1]",
            "localhost:8600",
            "LocalHost",
            "console.localhost:8600",
            "localhost.:8600",
        ] {
            assert!(none.permits(ok), "{ok} refused");
        }
        for refused in [
            "attacker.example:8600",
            "localhost.attacker.example",
            "127.0.0.1.attacker.example",
            "array1:8600",
            "",
            ":8600",
            "127.0.0.1:86a0",
            "127.0.0.1:",
            "[::1",
            "[::1]x",
            "[not-an-address]:8600",
            "[::1]:123456",
        ] {
            assert!(!none.permits(refused), "{refused:?} served");
        }
        let some = AllowedHosts::new(["Array1.Example.com.", "array1"]).unwrap();
        assert_eq!(some.names(), ["array1.example.com", "array1"]);
        assert!(some.permits("array1.example.com:8600"));
        assert!(some.permits("ARRAY1"));
        assert!(!some.permits("array2:8600"));
        assert!(!some.permits("example.com"));
    }

    #[test]
    fn configured_names_are_validated() {
        for bad in [
            "",
            "array1:8600",
            "http://array1",
            "a..b",
            "-a.example",
            "a_b.example",
            &"a".repeat(64),
            "ünïcode.example",
        ] {
            let e = AllowedHosts::new([bad]).unwrap_err();
            assert!(e.contains("not a host name"), "{bad:?}: {e}");
        }
        let mut h = AllowedHosts::new(["a.example"]).unwrap();
        h.add("A.EXAMPLE").unwrap();
        assert_eq!(h.names().len(), 1);
    }
}
