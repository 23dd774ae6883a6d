//! The pool's settings and their one owner: the soft threshold and the garbage collector's
//! priority belong to the engine's pool, not to one volume. The API, the configuration file
//! (at start) and MODE SELECT (through [`sliver_volume::Pool`], which every engine
//! LU holds) all change them here: checked against one range, applied to the engine, saved in
//! the array's configuration, announced in the event log.

use std::sync::{Arc, Mutex};

use sliver_engine::{Engine, GcPriority, Tuning};
use sliver_volume::{SettingError, SOFT_THRESHOLD_RANGE};

use super::config_store::{lock_events, ConfigStore};
use super::{now_ms, ArrayError, Result, Settings};
use crate::events::{EventLog, NewEvent};

pub(super) struct Pool {
    engine: Arc<Engine>,
    config: Arc<ConfigStore>,
    events: Arc<Mutex<EventLog>>,
}

impl Pool {
    pub(super) fn new(
        engine: Arc<Engine>,
        config: Arc<ConfigStore>,
        events: Arc<Mutex<EventLog>>,
    ) -> Self {
        Pool {
            engine,
            config,
            events,
        }
    }

    /// Change the soft threshold (a share of capacity in use, in [`SOFT_THRESHOLD_RANGE`])
    /// and keep it.
    pub(super) fn change_soft_threshold(&self, share: f64) -> Result<()> {
        check_soft_threshold(share)?;
        self.change(
            |s| s.soft_threshold = Some(share),
            |t| t.soft_threshold = share,
            "soft_threshold_changed",
            || format!("soft threshold set to {:.0} % of capacity", share * 100.0),
        )
    }

    /// Change the garbage collector's priority and keep it.
    pub(super) fn change_gc_priority(&self, priority: GcPriority) -> Result<()> {
        self.change(
            |s| s.gc_priority = Some(gc_priority_name(priority)),
            |t| t.gc = priority,
            "gc_priority_changed",
            || format!("GC priority set to {}", gc_priority_name(priority)),
        )
    }

    /// Keep a setting (`kept`), then apply it to the engine (`tuned`) under the same lock;
    /// an event of `kind` when the kept value changed.
    fn change(
        &self,
        kept: impl FnOnce(&mut Settings),
        tuned: impl FnOnce(&mut Tuning),
        kind: &'static str,
        message: impl FnOnce() -> String,
    ) -> Result<()> {
        let changed = self.config.update_settings(kept, || {
            let mut tuning = self.engine.tuning();
            tuned(&mut tuning);
            self.engine.set_tuning(tuning);
        })?;
        if changed {
            self.record(kind, message());
        }
        Ok(())
    }

    fn record(&self, kind: &'static str, message: String) {
        lock_events(&self.events).record(
            now_ms(),
            NewEvent {
                kind,
                message,
                ..NewEvent::default()
            },
        );
    }
}

/// The soft thresholds the pool takes, from any source.
pub(super) fn check_soft_threshold(share: f64) -> Result<()> {
    if SOFT_THRESHOLD_RANGE.contains(&share) {
        Ok(())
    } else {
        Err(ArrayError::InvalidSetting(
            SettingError::SoftThresholdOutOfRange(share).to_string(),
        ))
    }
}

impl sliver_volume::Pool for Pool {
    fn soft_threshold_exceeded(&self) -> bool {
        self.engine.soft_threshold_exceeded()
    }

    fn available_bytes(&self) -> u64 {
        self.engine.available_bytes()
    }

    fn soft_threshold(&self) -> (f64, u64) {
        (
            self.engine.tuning().soft_threshold,
            self.engine.capacity_bytes(),
        )
    }

    fn set_soft_threshold(&self, share: f64) -> std::result::Result<(), SettingError> {
        self.change_soft_threshold(share).map_err(|e| match e {
            ArrayError::InvalidSetting(_) => SettingError::SoftThresholdOutOfRange(share),
            other => SettingError::NotKept(other.to_string()),
        })
    }
}

/// `off`, `low`, `medium`, `high`, or a rate in bytes per second such as `100000000B/s`.
pub fn gc_priority_name(p: GcPriority) -> String {
    match p {
        GcPriority::Off => "off".into(),
        GcPriority::Low => "low".into(),
        GcPriority::Medium => "medium".into(),
        GcPriority::High => "high".into(),
        GcPriority::Rate(r) => format!("{r}B/s"),
    }
}

/// A GC priority that is none of the spellings [`parse_gc_priority`] takes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not a GC priority (off, low, medium, high or a rate such as 100MB/s)")]
pub struct BadGcPriority(String);

/// Parse a GC priority: `off`, `low`, `medium`, `high`, or a rate (`100MB/s`, `5000000B/s`,
/// `1GB/s`; decimal or binary units, as `units` reads sizes). The API, the configuration file
/// and the command line all read it here.
pub fn parse_gc_priority(s: &str) -> std::result::Result<GcPriority, BadGcPriority> {
    match s {
        "off" => return Ok(GcPriority::Off),
        "low" => return Ok(GcPriority::Low),
        "medium" => return Ok(GcPriority::Medium),
        "high" => return Ok(GcPriority::High),
        _ => {}
    }
    let bad = || BadGcPriority(s.to_string());
    // The `/s` is required here, unlike elsewhere: it tells a rate from a misspelt word.
    let amount = s.strip_suffix("/s").ok_or_else(bad)?;
    let rate = sliver_api_types::units::parse_size(amount).map_err(|_| bad())?;
    if !(1..=1_000_000_000_000).contains(&rate) {
        return Err(bad());
    }
    Ok(GcPriority::Rate(rate))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gc_priorities_parse_and_name_back() {
        for p in [
            GcPriority::Off,
            GcPriority::Low,
            GcPriority::Medium,
            GcPriority::High,
            GcPriority::Rate(100_000_000),
        ] {
            assert_eq!(parse_gc_priority(&gc_priority_name(p)), Ok(p));
        }
        assert_eq!(parse_gc_priority("1GiB/s"), Ok(GcPriority::Rate(1 << 30)));
        for bad in ["urgent", "100MB", "0B/s", "2TB/s", "/s", ""] {
            let e = parse_gc_priority(bad).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!(
                    "'{bad}' is not a GC priority (off, low, medium, high or a rate such as 100MB/s)"
                )
            );
        }
    }
}
