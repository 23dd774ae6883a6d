//! Each volume's write cache setting (issue 40): write-through (WCE=0, every write durable
//! before it is answered) or write-back (WCE=1, durable at the host's flush). The volume's
//! record keeps the saved value; the API, the CLI, the console and the configuration file
//! change it through [`Array::set_write_cache`], and a host through MODE SELECT with SP=1
//! ([`SavedCachingPage`]). Either way the record is written first, then the LU changes.

use std::sync::{Arc, Mutex};

use sliver_api_types::WriteCache;
use sliver_scsi::SavedModePages;

use super::config_store::{lock_events, ConfigStore};
use super::{now_ms, Array, ArrayError, Result};
use crate::events::{EventLog, NewEvent};

/// Volumes recorded before the setting existed answered from the page cache: they keep it.
pub(super) fn recorded_before_the_setting() -> WriteCache {
    WriteCache::WriteBack
}

/// Where an LU's saved caching page goes: its volume's record (found by id, which survives
/// renames), with an event saying a host changed it.
pub(super) struct SavedCachingPage {
    config: Arc<ConfigStore>,
    events: Arc<Mutex<EventLog>>,
    volume_id: String,
}

impl SavedCachingPage {
    pub(super) fn new(
        config: Arc<ConfigStore>,
        events: Arc<Mutex<EventLog>>,
        volume_id: &str,
    ) -> Self {
        SavedCachingPage {
            config,
            events,
            volume_id: volume_id.into(),
        }
    }
}

impl SavedModePages for SavedCachingPage {
    fn save_write_cache(&self, wce: bool) -> std::result::Result<(), String> {
        let setting = WriteCache::from_wce(wce);
        let name = self
            .config
            .update_volume(&self.volume_id, |v| v.write_cache = setting)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("volume {} is no longer configured", self.volume_id))?;
        record_change(
            &self.events,
            &name,
            format!("volume {name}: write cache set to {setting} by a host (MODE SELECT, saved)"),
        );
        Ok(())
    }
}

fn record_change(events: &Mutex<EventLog>, volume: &str, message: String) {
    lock_events(events).record(
        now_ms(),
        NewEvent {
            kind: "write_cache_changed",
            message,
            volume: Some(volume.into()),
            ..NewEvent::default()
        },
    );
}

impl Array {
    /// Set volume `name`'s write cache: kept in its record, then in effect (a write-back
    /// volume turned write-through first makes every write it answered durable), and every
    /// host told by a unit attention (MODE PARAMETERS CHANGED).
    pub fn set_write_cache(&self, name: &str, setting: WriteCache) -> Result<()> {
        let record = self
            .volumes()
            .into_iter()
            .find(|v| v.name == name)
            .ok_or_else(|| ArrayError::NoSuchVolume(name.into()))?;
        let unit = self
            .unit(name)
            .ok_or_else(|| ArrayError::NoSuchVolume(name.into()))?;
        if record.write_cache == setting && unit.write_cache() == setting.wce() {
            return Ok(());
        }
        self.config
            .update_volume(&record.id, |v| v.write_cache = setting)?;
        unit.set_write_cache(setting.wce())?;
        record_change(
            &self.events,
            name,
            format!("volume {name}: write cache set to {setting}"),
        );
        Ok(())
    }
}
