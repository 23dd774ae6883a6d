//! The pool's settings and their one owner: the soft threshold and the garbage collector's
//! priority belong to the engine's pool, not to one volume. The API, the configuration file
//! (at start) and MODE SELECT (through [`sliver_volume::Pool`], which every engine
//! LU holds) all change them here: checked against one range, applied to the engine, saved in
//! the array's configuration, announced in the event log.

use std::sync::{Arc, Mutex};

use sliver_engine::{Engine, GcPriority, Tuning};
use sliver_volume::{SettingError, SOFT_THRESHOLD_RANGE};

use super::config_store::{lock_events, ConfigStore};
use super::{gc_priority_name, now_ms, ArrayError, Result, Settings};
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
