//! The `sliver serve --config FILE` TOML file.
//!
//! Every key is checked when the file is read: unknown keys and bad values are errors that
//! name the key and its line, and the daemon refuses to start rather than guessing. Command
//! line flags override the file. See `docs/configuration.md` (and `dist/sliver.toml`).

use serde::{Deserialize, Deserializer};
use sliver_api_types::IscsiName;
use sliver_engine::{Compression, GcPriority};
use sliver_server::array::parse_gc_priority;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Directory holding the array.
    pub data_dir: Option<PathBuf>,
    /// The target's iSCSI qualified name (used when the array is created).
    pub target_name: Option<String>,
    #[serde(default)]
    pub iscsi: IscsiSection,
    #[serde(default)]
    pub api: ApiSection,
    #[serde(default)]
    pub capacity: CapacitySection,
    #[serde(default)]
    pub gc: GcSection,
    #[serde(default)]
    pub engine: EngineSection,
    /// The off-site copy on an S3-compatible object store (RFC 0003).
    pub replication: Option<ReplicationSection>,
    /// The target's own CHAP credentials, for mutual CHAP.
    pub chap: Option<Chap>,
    /// Hosts: created or updated at start to match this list.
    #[serde(default)]
    pub hosts: Vec<Host>,
    /// Settings of existing volumes, applied at start.
    #[serde(default)]
    pub volumes: Vec<VolumeSettings>,
}

/// `[[volumes]]`: one existing volume's settings (volumes are created through the API or CLI).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeSettings {
    pub name: String,
    /// `write-through` or `write-back`.
    pub write_cache: Option<sliver_api_types::WriteCache>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IscsiSection {
    /// Portal addresses.
    #[serde(default)]
    pub listen: Vec<SocketAddr>,
    /// How long a connection may take to log in.
    #[serde(default, deserialize_with = "duration")]
    pub login_timeout: Option<std::time::Duration>,
    /// Microseconds a quiet connection polls its socket before it sleeps (0: never).
    #[serde(default, deserialize_with = "poll_us")]
    pub poll_us: Option<std::time::Duration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiSection {
    pub listen: Option<SocketAddr>,
    /// Bearer token for the API (required when it listens beyond loopback).
    pub token: Option<String>,
    /// A file holding the token (first line), kept out of the configuration.
    pub token_file: Option<PathBuf>,
    /// Host names the API answers to besides IP addresses, localhost and the machine's own
    /// name (requests naming anything else are refused: DNS rebinding).
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// HTTPS on a loopback address too (beyond loopback it always is; `false` there is an
    /// error).
    pub tls: Option<bool>,
    /// The administrator's certificate chain (PEM) instead of the generated one; read again
    /// when it changes.
    pub tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    pub tls_key: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapacitySection {
    /// Log capacity when the array is created, e.g. "2T" (default: 90% of free space).
    #[serde(default, deserialize_with = "size")]
    pub size: Option<u64>,
    /// Space used, in percent of capacity, that raises the thin-provisioning soft threshold.
    #[serde(default, deserialize_with = "percent")]
    pub soft_threshold_percent: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcSection {
    /// off | low | medium | high, or a rate such as "100MB/s".
    #[serde(default, deserialize_with = "gc_priority")]
    pub priority: Option<GcPriority>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSection {
    /// none | lz4 | zstd | zstd:LEVEL.
    #[serde(default, deserialize_with = "compression")]
    pub compression: Option<Compression>,
    /// RAM for cached metadata pages, e.g. "512M" (default: an eighth of the machine's memory).
    #[serde(default, deserialize_with = "size")]
    pub metadata_cache: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicationSection {
    /// `s3://BUCKET/PREFIX`: one array per prefix.
    pub to: Option<String>,
    /// Another endpoint than AWS's, e.g. `http://127.0.0.1:8333`.
    pub endpoint: Option<String>,
    /// Region (default: the standard AWS variables, then us-east-1).
    pub region: Option<String>,
    /// Access key id (default: the standard AWS variables).
    pub access_key_id: Option<String>,
    /// A file holding the secret access key (first line), kept out of the configuration.
    pub secret_access_key_file: Option<PathBuf>,
    /// Longest wait of a completed write before it is shipped, e.g. "5s" (the copy's RPO
    /// beside the store's own time).
    #[serde(default, deserialize_with = "duration")]
    pub interval: Option<std::time::Duration>,
    /// Writes waiting for the store before the copy is given up and taken again from the
    /// start, e.g. "1G".
    #[serde(default, deserialize_with = "size")]
    pub max_backlog: Option<u64>,
    /// How often a scheduled restore point is taken, e.g. "1h" (default 1 h).
    #[serde(default, deserialize_with = "duration")]
    pub points_every: Option<std::time::Duration>,
    /// Scheduled restore points kept (default 24; named ones stay until deleted).
    pub keep_points: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Chap {
    pub user: String,
    pub secret: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    pub name: String,
    /// Checked as the file is read: a name that is not an iSCSI name is refused at its line.
    pub iqns: Vec<IscsiName>,
    pub chap_user: Option<String>,
    pub chap_secret: Option<String>,
}

impl Config {
    /// Read and check `path`. The error names the file, the line and the key.
    pub fn load(path: &Path) -> Result<Config, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the configuration {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("configuration {}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Config, String> {
        let config: Config = toml::from_str(text).map_err(|e| one_line(&e, text))?;
        config.check(text)?;
        Ok(config)
    }

    /// Checks that need more than one value.
    fn check(&self, text: &str) -> Result<(), String> {
        let line_of = |needle: &str| {
            text.lines()
                .position(|l| l.trim_start().starts_with(needle))
                .map(|i| format!("line {}: ", i + 1))
                .unwrap_or_default()
        };
        if let Some(chap) = &self.chap {
            sliver_server::array::ChapSecret::new(chap.user.as_str(), chap.secret.as_str())
                .map_err(|e| format!("{}[chap]: {e}", line_of("[chap]")))?;
        }
        if self.api.token.is_some() && self.api.token_file.is_some() {
            return Err(format!(
                "{}[api]: give token or token_file, not both",
                line_of("token")
            ));
        }
        if self.api.tls_cert.is_some() != self.api.tls_key.is_some() {
            return Err(format!(
                "{}[api]: give tls_cert and tls_key together",
                line_of("tls_")
            ));
        }
        sliver_server::api::AllowedHosts::new(&self.api.allowed_hosts)
            .map_err(|e| format!("{}[api] allowed_hosts: {e}", line_of("allowed_hosts")))?;
        let mut names = std::collections::HashSet::new();
        for host in &self.hosts {
            let at = line_of(&format!("name = \"{}\"", host.name));
            if !names.insert(host.name.as_str()) {
                return Err(format!(
                    "{at}[[hosts]]: host '{}' is listed twice",
                    host.name
                ));
            }
            match (&host.chap_user, &host.chap_secret) {
                (None, None) => {}
                (Some(u), Some(s)) => sliver_server::array::ChapSecret::new(u.as_str(), s.as_str())
                    .map(drop)
                    .map_err(|e| format!("{at}[[hosts]] '{}': {e}", host.name))?,
                _ => {
                    return Err(format!(
                        "{at}[[hosts]] '{}': give both chap_user and chap_secret, or neither",
                        host.name
                    ))
                }
            }
        }
        Ok(())
    }

    /// The API token from `token` or `token_file`.
    pub fn api_token(&self) -> Result<Option<String>, String> {
        if let Some(t) = &self.api.token {
            return Ok(Some(t.clone()));
        }
        match &self.api.token_file {
            None => Ok(None),
            Some(path) => first_line(path, "API token").map(Some),
        }
    }
}

impl Config {
    /// The secret access key from `[replication] secret_access_key_file`, if named.
    pub fn s3_secret(&self) -> Result<Option<String>, String> {
        let Some(path) = self
            .replication
            .as_ref()
            .and_then(|r| r.secret_access_key_file.as_ref())
        else {
            return Ok(None);
        };
        first_line(path, "secret access key").map(Some)
    }
}

/// The first line of a file holding a secret (`what`), trimmed; an empty one is an error.
fn first_line(path: &Path, what: &str) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the {what} file {}: {e}", path.display()))?;
    let line = text.lines().next().unwrap_or("").trim().to_string();
    if line.is_empty() {
        return Err(format!("the {what} file {} is empty", path.display()));
    }
    Ok(line)
}

/// toml's errors span several lines (with a caret under the value); keep the location and
/// the message on one line.
fn one_line(e: &toml::de::Error, text: &str) -> String {
    let message = e.message().trim().to_string();
    match e.span() {
        Some(span) => {
            let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
            let source = text.lines().nth(line - 1).unwrap_or("").trim();
            format!("line {line} (`{source}`): {message}")
        }
        None => message,
    }
}

/// A string value read with `parse`; its error becomes the deserializer's.
fn parsed<'de, D: Deserializer<'de>, T, E: std::fmt::Display>(
    d: D,
    parse: impl FnOnce(&str) -> Result<T, E>,
) -> Result<Option<T>, D::Error> {
    let s = String::deserialize(d)?;
    parse(&s).map(Some).map_err(serde::de::Error::custom)
}

fn size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    parsed(d, sliver_api_types::units::parse_size)
}

fn percent<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    let v = f64::deserialize(d)?;
    if !(1.0..=100.0).contains(&v) {
        return Err(serde::de::Error::custom(format!(
            "{v} is not a percentage between 1 and 100"
        )));
    }
    Ok(Some(v / 100.0))
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<std::time::Duration>, D::Error> {
    parsed(d, sliver_api_types::units::parse_duration)
}

fn poll_us<'de, D: Deserializer<'de>>(d: D) -> Result<Option<std::time::Duration>, D::Error> {
    let us = u64::deserialize(d)?;
    let max = sliver_server::poll::MAX_POLL.as_micros() as u64;
    if us > max {
        return Err(serde::de::Error::custom(format!(
            "poll_us {us} is above {max} (polling longer costs more CPU than it saves)"
        )));
    }
    Ok(Some(std::time::Duration::from_micros(us)))
}

fn gc_priority<'de, D: Deserializer<'de>>(d: D) -> Result<Option<GcPriority>, D::Error> {
    parsed(d, parse_gc_priority)
}

/// Parse a compression setting: none, lz4, zstd or zstd:LEVEL (1..=19).
pub fn parse_compression(s: &str) -> Result<Compression, String> {
    match s {
        "none" => Ok(Compression::None),
        "lz4" => Ok(Compression::Lz4),
        "zstd" => Ok(Compression::Zstd(3)),
        other => other
            .strip_prefix("zstd:")
            .and_then(|l| l.parse::<i32>().ok())
            .filter(|l| (1..=19).contains(l))
            .map(Compression::Zstd)
            .ok_or_else(|| {
                format!("'{s}' is not a compression setting (none, lz4, zstd or zstd:1..19)")
            }),
    }
}

fn compression<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Compression>, D::Error> {
    parsed(d, parse_compression)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"
data_dir = "/var/lib/sliver"
target_name = "iqn.2026-11.com.example:array1"

[iscsi]
listen = ["0.0.0.0:3260", "[::]:3260"]
login_timeout = "20s"
poll_us = 20

[api]
listen = "0.0.0.0:8600"
token = "s3cret-token"
allowed_hosts = ["array1.example.com", "array1"]

[capacity]
size = "2T"
soft_threshold_percent = 75

[gc]
priority = "250MB/s"

[engine]
compression = "zstd:5"
metadata_cache = "512M"

[chap]
user = "array1"
secret = "target-secret-123"

[[hosts]]
name = "esx1"
iqns = ["iqn.1998-01.com.vmware:esx1-12345678"]
chap_user = "esx1"
chap_secret = "host-secret-1234"
"#;

    #[test]
    fn a_full_configuration_parses() {
        let c = Config::parse(FULL).unwrap();
        assert_eq!(c.iscsi.listen.len(), 2);
        assert_eq!(
            c.iscsi.login_timeout,
            Some(std::time::Duration::from_secs(20))
        );
        assert_eq!(c.iscsi.poll_us, Some(std::time::Duration::from_micros(20)));
        assert_eq!(c.capacity.size, Some(2 << 40));
        assert_eq!(c.capacity.soft_threshold_percent, Some(0.75));
        assert_eq!(c.gc.priority, Some(GcPriority::Rate(250_000_000)));
        assert_eq!(c.engine.compression, Some(Compression::Zstd(5)));
        assert_eq!(c.engine.metadata_cache, Some(512 << 20));
        assert_eq!(c.hosts[0].name, "esx1");
        assert_eq!(c.api_token().unwrap().as_deref(), Some("s3cret-token"));
        assert_eq!(c.api.allowed_hosts, ["array1.example.com", "array1"]);
    }

    #[test]
    fn errors_name_the_key_and_the_line() {
        let cases = [
            ("[gc]\npriority = \"fast\"\n", "line 2", "fast"),
            ("[iscsi]\nlisten = [\"nowhere\"]\n", "line 2", "listen"),
            (
                "[capacity]\nsoft_threshold_percent = 150\n",
                "line 2",
                "150",
            ),
            (
                "[api]\nlisten = \"127.0.0.1:8600\"\ntokn = \"x\"\n",
                "line 3",
                "tokn",
            ),
            ("target_nam = \"x\"\n", "line 1", "target_nam"),
            ("[capacity]\nsize = \"lots\"\n", "line 2", "size"),
            (
                "[[hosts]]\nname = \"h\"\niqns = [\"bogus\"]\n",
                "line 3",
                "bogus",
            ),
            (
                "[[hosts]]\nname = \"h\"\niqns = []\nchap_user = \"u\"\n",
                "line 2",
                "chap_secret",
            ),
            ("[chap]\nuser = \"u\"\nsecret = \"short\"\n", "line 1", "12"),
            (
                "[api]\nallowed_hosts = [\"array1:8600\"]\n",
                "line 2",
                "array1:8600",
            ),
        ];
        for (text, line, word) in cases {
            let e = Config::parse(text).unwrap_err();
            assert!(e.contains(line), "{text:?}: {e}");
            assert!(e.contains(word), "{text:?}: {e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }

    #[test]
    fn the_replication_section_parses_and_its_secret_comes_from_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("s3-secret");
        std::fs::write(&secret, "s3cr3t\n").unwrap();
        let text = format!(
            "[replication]\nto = \"s3://bucket/array1\"\nendpoint = \"http://127.0.0.1:8333\"\n\
             access_key_id = \"sliver\"\nsecret_access_key_file = \"{}\"\n\
             interval = \"2s\"\nmax_backlog = \"512M\"\npoints_every = \"30m\"\nkeep_points = 48\n",
            secret.display()
        );
        let c = Config::parse(&text).unwrap();
        let r = c.replication.as_ref().unwrap();
        assert_eq!(r.to.as_deref(), Some("s3://bucket/array1"));
        assert_eq!(r.interval, Some(std::time::Duration::from_secs(2)));
        assert_eq!(r.max_backlog, Some(512 << 20));
        assert_eq!(r.points_every, Some(std::time::Duration::from_secs(1800)));
        assert_eq!(r.keep_points, Some(48));
        assert_eq!(c.s3_secret().unwrap().as_deref(), Some("s3cr3t"));
        std::fs::write(&secret, "\n").unwrap();
        assert!(c.s3_secret().unwrap_err().contains("is empty"));
        assert!(Config::parse("[replication]\nbucket = \"x\"\n").is_err());
    }

    #[test]
    fn volume_settings_parse_and_a_bad_write_cache_names_its_line() {
        let c = Config::parse(
            "[[volumes]]\nname = \"scratch\"\nwrite_cache = \"write-back\"\n\n\
             [[volumes]]\nname = \"vmfs1\"\nwrite_cache = \"write-through\"\n",
        )
        .unwrap();
        let settings: Vec<_> = c
            .volumes
            .iter()
            .map(|v| (v.name.as_str(), v.write_cache))
            .collect();
        use sliver_api_types::WriteCache::*;
        assert_eq!(
            settings,
            [("scratch", Some(WriteBack)), ("vmfs1", Some(WriteThrough))]
        );
        let e =
            Config::parse("[[volumes]]\nname = \"a\"\nwrite_cache = \"writeback\"\n").unwrap_err();
        assert!(e.contains("line 3") && e.contains("writeback"), "{e}");
    }

    #[test]
    fn the_shipped_example_parses() {
        let c = Config::parse(include_str!("../../../dist/sliver.toml")).unwrap();
        assert_eq!(c.data_dir.as_deref(), Some(Path::new("/var/lib/sliver")));
        assert_eq!(c.gc.priority, Some(GcPriority::Medium));
    }

    #[test]
    fn gc_priority_and_compression_spellings() {
        assert_eq!(parse_gc_priority("off").unwrap(), GcPriority::Off);
        assert_eq!(parse_gc_priority("high").unwrap(), GcPriority::High);
        assert!(parse_gc_priority("urgent").is_err());
        assert_eq!(parse_compression("lz4").unwrap(), Compression::Lz4);
        assert!(parse_compression("zstd:99").is_err());
    }

    #[test]
    fn a_poll_window_past_a_millisecond_is_refused() {
        let c = Config::parse("[iscsi]\npoll_us = 0\n").unwrap();
        assert_eq!(c.iscsi.poll_us, Some(std::time::Duration::ZERO));
        let e = Config::parse("[iscsi]\npoll_us = 5000\n").unwrap_err();
        assert!(e.contains("above 1000"), "{e}");
        assert!(Config::parse("[iscsi]\npoll_us = -1\n").is_err());
    }
}
