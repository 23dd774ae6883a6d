//! `--watch`: the daemon. Like the VMFS-6 crawler it re-runs a pass whenever dead space may
//! have appeared — here, when a file system's free space has grown by `min_growth` since the
//! lowest value seen after the last pass — each mount with its own limiter.

use crate::limiter::{Clock, Limiter, RateSpec, RealClock};
use crate::trim::{self, PassReport, Target};
use crate::Priority;
use serde::Deserialize;
use sliver_api_types::units::{parse_duration, parse_rate, parse_size};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Default path of the config file.
pub const DEFAULT_CONFIG: &str = "/etc/sliver/reclaim.toml";
/// Default period between free-space checks.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(300);
/// Default free-space growth that triggers a pass.
pub const DEFAULT_MIN_GROWTH: u64 = 1 << 30;

/// Settings of one mount (all optional in the file).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MountConfig {
    pub path: Option<PathBuf>,
    pub priority: Option<String>,
    pub rate: Option<String>,
    pub burst: Option<String>,
    pub burst_rate: Option<String>,
    pub min_extent: Option<String>,
    pub window: Option<String>,
    pub min_growth: Option<String>,
}

/// The TOML config file.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    pub interval: Option<String>,
    #[serde(default)]
    pub defaults: MountConfig,
    #[serde(default, rename = "mount")]
    pub mounts: Vec<MountConfig>,
}

/// Fully resolved settings of one watched mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSettings {
    pub path: PathBuf,
    pub limit: RateSpec,
    pub min_extent: Option<u64>,
    pub window: Option<u64>,
    pub min_growth: u64,
}

/// The resolved daemon configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchConfig {
    pub interval: Duration,
    pub mounts: Vec<MountSettings>,
}

fn field<T>(
    what: &str,
    v: Option<&String>,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<Option<T>, String> {
    v.map(|s| parse(s).map_err(|e| format!("{what}: {e}")))
        .transpose()
}

fn rate_value(s: &str) -> Result<Option<u64>, String> {
    if s == "unlimited" {
        Ok(None)
    } else {
        parse_rate(s).map(Some)
    }
}

fn resolve(m: &MountConfig, d: &MountConfig, ctx: &str) -> Result<MountSettings, String> {
    let pick = |a: &Option<String>, b: &Option<String>| a.clone().or_else(|| b.clone());
    let path = m
        .path
        .clone()
        .ok_or_else(|| format!("{ctx}: every [[mount]] needs a path"))?;
    let ctx = format!("{ctx} ({})", path.display());
    let priority = pick(&m.priority, &d.priority);
    let rate = pick(&m.rate, &d.rate);
    let rate = match (&m.rate, &m.priority) {
        (Some(_), Some(_)) => return Err(format!("{ctx}: give either rate or priority, not both")),
        // A mount's own priority beats a default rate and vice versa.
        (None, Some(p)) => Some(
            Priority::parse(p)
                .map_err(|e| format!("{ctx}: {e}"))?
                .rate(),
        ),
        (Some(r), None) => rate_value(r).map_err(|e| format!("{ctx}: rate: {e}"))?,
        (None, None) => match (&rate, &priority) {
            (Some(r), _) => rate_value(r).map_err(|e| format!("{ctx}: rate: {e}"))?,
            (None, Some(p)) => Some(
                Priority::parse(p)
                    .map_err(|e| format!("{ctx}: {e}"))?
                    .rate(),
            ),
            (None, None) => Some(Priority::Low.rate()),
        },
    };
    let burst = field("burst", pick(&m.burst, &d.burst).as_ref(), parse_size)
        .map_err(|e| format!("{ctx}: {e}"))?
        .unwrap_or(0);
    let burst_rate = match pick(&m.burst_rate, &d.burst_rate) {
        Some(s) => rate_value(&s).map_err(|e| format!("{ctx}: burst_rate: {e}"))?,
        None => Some(crate::DEFAULT_BURST_RATE),
    };
    Ok(MountSettings {
        path,
        limit: RateSpec {
            rate,
            burst,
            burst_rate,
        },
        min_extent: field(
            "min_extent",
            pick(&m.min_extent, &d.min_extent).as_ref(),
            parse_size,
        )
        .map_err(|e| format!("{ctx}: {e}"))?,
        window: field("window", pick(&m.window, &d.window).as_ref(), parse_size)
            .map_err(|e| format!("{ctx}: {e}"))?,
        min_growth: field(
            "min_growth",
            pick(&m.min_growth, &d.min_growth).as_ref(),
            parse_size,
        )
        .map_err(|e| format!("{ctx}: {e}"))?
        .unwrap_or(DEFAULT_MIN_GROWTH),
    })
}

/// Parses and resolves a config file's text.
pub fn parse_config(text: &str, origin: &Path) -> Result<WatchConfig, String> {
    let file: ConfigFile =
        toml::from_str(text).map_err(|e| format!("{}: {e}", origin.display()))?;
    let o = origin.display().to_string();
    let interval = field("interval", file.interval.as_ref(), parse_duration)
        .map_err(|e| format!("{o}: {e}"))?
        .unwrap_or(DEFAULT_INTERVAL);
    if file.defaults.path.is_some() {
        return Err(format!("{o}: [defaults] cannot have a path"));
    }
    let mounts = file
        .mounts
        .iter()
        .map(|m| resolve(m, &file.defaults, &o))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(WatchConfig { interval, mounts })
}

/// Reads a config file.
pub fn load_config(path: &Path) -> Result<WatchConfig, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the config file {}: {e}", path.display()))?;
    parse_config(&text, path)
}

/// What the daemon reports.
pub enum WatchEvent<'a> {
    Pass(&'a PassReport),
    Error { mount: &'a Path, message: &'a str },
}

struct Watched {
    settings: MountSettings,
    target: Target,
    limiter: Limiter<RealClock>,
    /// Lowest free space seen since the last pass; `None` before the first pass.
    low_water: Option<u64>,
}

/// Runs until `stop` is set. Every mount is validated first (an unusable mount is an error at
/// start, not a silent no-op); later errors are reported and retried at the next interval.
pub fn watch(
    config: &WatchConfig,
    stop: &'static AtomicBool,
    on_event: &mut dyn FnMut(WatchEvent),
) -> Result<(), String> {
    if config.mounts.is_empty() {
        return Err(
            "--watch needs at least one mount (on the command line or in the config file)".into(),
        );
    }
    let mut watched = Vec::new();
    for m in &config.mounts {
        let target = Target::prepare(&m.path, m.min_extent, m.window)?;
        watched.push(Watched {
            limiter: Limiter::new(RealClock::new(stop), m.limit),
            settings: m.clone(),
            target,
            low_water: None,
        });
    }
    let clock = RealClock::new(stop);
    while !stop.load(Ordering::Relaxed) {
        for w in watched.iter_mut() {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let free = match w.target.free_bytes() {
                Ok(f) => f,
                Err(e) => {
                    on_event(WatchEvent::Error {
                        mount: &w.settings.path,
                        message: &e,
                    });
                    continue;
                }
            };
            let due = match w.low_water {
                None => true,
                Some(low) => free >= low.saturating_add(w.settings.min_growth),
            };
            if !due {
                w.low_water = Some(w.low_water.map_or(free, |l| l.min(free)));
                continue;
            }
            // A new batch of dead space: like ESXi, start it with the full burst allowance.
            w.limiter.refill_burst();
            match trim::pass(&w.target, &mut w.limiter, stop, None) {
                Ok(report) => {
                    on_event(WatchEvent::Pass(&report));
                    w.low_water = Some(w.target.free_bytes().unwrap_or(free));
                }
                Err(e) => on_event(WatchEvent::Error {
                    mount: &w.settings.path,
                    message: &e,
                }),
            }
        }
        clock.sleep(config.interval);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_resolution() {
        // Three mounts; each case below appends the last mount's own settings.
        let up_to_mount_c = r#"
interval = "30s"
[defaults]
priority = "medium"
burst = "10GiB"
min_growth = "256MiB"

[[mount]]
path = "/srv/a"

[[mount]]
path = "/srv/b"
rate = "500MB/s"
min_extent = "64KiB"
burst_rate = "unlimited"

[[mount]]
path = "/srv/c"
"#;
        let p = Path::new("test.toml");
        let rate_and_priority =
            format!("{up_to_mount_c}priority = \"high\"\nrate = \"unlimited\"\n");
        let e = parse_config(&rate_and_priority, p).unwrap_err();
        assert!(e.contains("either rate or priority"), "{e}");

        let c = parse_config(&format!("{up_to_mount_c}rate = \"unlimited\"\n"), p).unwrap();
        assert_eq!(c.interval, Duration::from_secs(30));
        assert_eq!(c.mounts.len(), 3);
        let a = &c.mounts[0];
        assert_eq!(a.limit.rate, Some(75_000_000));
        assert_eq!(a.limit.burst, 10 << 30);
        assert_eq!(a.limit.burst_rate, Some(crate::DEFAULT_BURST_RATE));
        assert_eq!(a.min_growth, 256 << 20);
        assert_eq!(a.min_extent, None);
        let b = &c.mounts[1];
        assert_eq!(b.limit.rate, Some(500_000_000));
        assert_eq!(b.limit.burst_rate, None);
        assert_eq!(b.min_extent, Some(65536));
        assert_eq!(c.mounts[2].limit.rate, None);
    }

    #[test]
    fn config_errors_are_specific() {
        let p = Path::new("x.toml");
        let e = parse_config("[[mount]]\nrate = \"5MB/s\"\n", p).unwrap_err();
        assert!(e.contains("needs a path"), "{e}");
        let e = parse_config("[[mount]]\npath = \"/a\"\nspeed = 3\n", p).unwrap_err();
        assert!(e.contains("speed"), "{e}");
        let e = parse_config("[[mount]]\npath = \"/a\"\npriority = \"urgent\"\n", p).unwrap_err();
        assert!(e.contains("urgent"), "{e}");
        let e = parse_config("interval = \"soon\"\n", p).unwrap_err();
        assert!(e.contains("interval"), "{e}");
        let e = parse_config("[[mount]]\npath = \"/a\"\nburst = \"lots\"\n", p).unwrap_err();
        assert!(e.contains("burst") && e.contains("/a"), "{e}");
        let c = parse_config("", p).unwrap();
        assert_eq!(c.interval, DEFAULT_INTERVAL);
        assert!(c.mounts.is_empty());
        assert!(load_config(Path::new("/nonexistent/reclaim.toml")).is_err());
    }
}
