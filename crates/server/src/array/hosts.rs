//! Hosts and their connections: creating, editing and deleting hosts (their initiator names
//! and CHAP credentials), the target's own credentials, and connecting volumes to hosts as
//! LUNs.

use sliver_api_types::IscsiName;

use super::{
    quoted_list, validate_name, Array, ArrayError, ChapChange, ChapSecret, ConnectionRecord,
    HostRecord, Result, StoredChap, ANY_HOST,
};
use crate::events::NewEvent;

impl HostRecord {
    /// A host as the array takes it from anyone (the API, the configuration file): a valid
    /// name (or the any-host entry); its names and credentials are valid by their types.
    /// Records read from `array.json` are not checked again: older versions checked less.
    fn new(name: &str, iqns: Vec<IscsiName>, chap: Option<ChapSecret>) -> Result<Self> {
        if name != ANY_HOST {
            validate_name(name)?;
        }
        Ok(HostRecord {
            name: name.into(),
            iqns: stored_names(iqns),
            chap: chap.map(StoredChap::from),
        })
    }
}

impl Array {
    pub fn create_host(
        &self,
        name: &str,
        iqns: Vec<IscsiName>,
        chap: Option<ChapSecret>,
    ) -> Result<()> {
        let record = HostRecord::new(name, iqns, chap)?;
        let mut config = self.config_mut();
        if config.hosts.iter().any(|h| h.name == name) {
            return Err(ArrayError::HostExists(name.into()));
        }
        let chap_text = if record.chap.is_some() {
            ", with CHAP"
        } else {
            ""
        };
        let message = format!(
            "host {name} created ({} initiators{chap_text})",
            record.iqns.len()
        );
        let iqns = record.iqns.clone();
        self.commit(&mut config, |c| c.hosts.push(record))?;
        drop(config);
        self.host_admitted(name, &iqns, "host_created", message);
        Ok(())
    }

    /// Connect `volume` to `host` at `lun` (the lowest free LUN when `None`). Returns the LUN.
    pub fn connect(&self, volume: &str, host: &str, lun: Option<u64>) -> Result<u64> {
        let mut config = self.config_mut();
        if !config.volumes.iter().any(|v| v.name == volume) {
            return Err(ArrayError::NoSuchVolume(volume.into()));
        }
        if host != ANY_HOST && !config.hosts.iter().any(|h| h.name == host) {
            return Err(ArrayError::NoSuchHost(host.into()));
        }
        let used: Vec<u64> = config
            .connections
            .iter()
            .filter(|c| c.host == host)
            .map(|c| c.lun)
            .collect();
        if config
            .connections
            .iter()
            .any(|c| c.host == host && c.volume == volume)
        {
            return Err(ArrayError::AlreadyConnected {
                volume: volume.into(),
                host: host.into(),
            });
        }
        let lun = match lun {
            Some(l) if used.contains(&l) => {
                return Err(ArrayError::LunInUse {
                    host: host.into(),
                    lun: l,
                })
            }
            Some(l) => l,
            None => (0..).find(|l| !used.contains(l)).unwrap_or(0),
        };
        self.commit(&mut config, |c| {
            c.connections.push(ConnectionRecord {
                volume: volume.into(),
                host: host.into(),
                lun,
            })
        })?;
        drop(config);
        self.host_event(
            "volume_connected",
            host,
            Some(volume),
            format!("volume {volume} connected to {host} as LUN {lun}"),
        );
        Ok(lun)
    }

    /// Remove the connection of `volume` to `host`.
    pub fn disconnect(&self, volume: &str, host: &str) -> Result<()> {
        self.disconnect_unrecorded(volume, host).inspect(|_| {
            self.host_event(
                "volume_disconnected",
                host,
                Some(volume),
                format!("volume {volume} disconnected from {host}"),
            )
        })
    }

    fn disconnect_unrecorded(&self, volume: &str, host: &str) -> Result<()> {
        let mut config = self.config_mut();
        if !config.volumes.iter().any(|v| v.name == volume) {
            return Err(ArrayError::NoSuchVolume(volume.into()));
        }
        self.try_commit(&mut config, |c| {
            let before = c.connections.len();
            c.connections
                .retain(|c| !(c.volume == volume && c.host == host));
            if c.connections.len() == before {
                return Err(ArrayError::NotConnected {
                    volume: volume.into(),
                    host: host.into(),
                });
            }
            Ok(())
        })
    }

    /// Delete a host: refused while volumes are connected to it.
    pub fn delete_host(&self, name: &str) -> Result<()> {
        self.delete_host_unrecorded(name).inspect(|_| {
            self.host_event("host_deleted", name, None, format!("host {name} deleted"))
        })
    }

    fn delete_host_unrecorded(&self, name: &str) -> Result<()> {
        let mut config = self.config_mut();
        let connected = config.connections.iter().filter(|c| c.host == name);
        if let Some(volumes) = quoted_list(connected.map(|c| c.volume.as_str())) {
            return Err(ArrayError::HostInUse {
                host: name.into(),
                volumes,
            });
        }
        if !config.hosts.iter().any(|h| h.name == name) {
            return Err(ArrayError::NoSuchHost(name.into()));
        }
        self.commit(&mut config, |c| c.hosts.retain(|h| h.name != name))
    }

    /// Create `name` or make an existing host match (the configuration file declares hosts).
    pub fn ensure_host(
        &self,
        name: &str,
        iqns: Vec<IscsiName>,
        chap: Option<ChapSecret>,
    ) -> Result<()> {
        let record = HostRecord::new(name, iqns, chap)?;
        let mut config = self.config_mut();
        let existing = config.hosts.iter().position(|h| h.name == name);
        if existing.is_some_and(|i| config.hosts[i] == record) {
            return Ok(());
        }
        self.commit(&mut config, |c| match existing {
            Some(i) => c.hosts[i] = record,
            None => c.hosts.push(record),
        })
    }

    /// Edit a host in place: its initiator names (when `iqns` is given) and its CHAP
    /// credentials. Connections stay; sessions already logged in keep running until they
    /// log out (the names are checked at login). Returns the host as saved.
    pub fn update_host(
        &self,
        name: &str,
        iqns: Option<Vec<IscsiName>>,
        chap: ChapChange,
    ) -> Result<HostRecord> {
        let iqns = iqns.map(stored_names);
        let mut config = self.config_mut();
        let saved = self.try_commit(&mut config, |c| {
            let host = c
                .hosts
                .iter_mut()
                .find(|h| h.name == name)
                .ok_or_else(|| ArrayError::NoSuchHost(name.into()))?;
            if let Some(iqns) = iqns {
                host.iqns = iqns;
            }
            match chap {
                ChapChange::Keep => {}
                ChapChange::Clear => host.chap = None,
                ChapChange::Set(c) => host.chap = Some(c.into()),
            }
            Ok(host.clone())
        })?;
        drop(config);
        let chap_text = if saved.chap.is_some() {
            "CHAP"
        } else {
            "no CHAP"
        };
        let message = format!(
            "host {name} changed ({} initiators, {chap_text})",
            saved.iqns.len()
        );
        self.host_admitted(name, &saved.iqns, "host_updated", message);
        Ok(saved)
    }

    /// Set (or clear) the target's own CHAP credentials (mutual CHAP).
    pub fn set_target_chap(&self, chap: Option<ChapSecret>) -> Result<()> {
        let chap = chap.map(StoredChap::from);
        let mut config = self.config_mut();
        if config.target_chap == chap {
            return Ok(());
        }
        self.commit(&mut config, |c| c.target_chap = chap)
    }

    /// A host that now lists `iqns`: they leave the refused list, and the change is an event.
    fn host_admitted(&self, host: &str, iqns: &[String], kind: &'static str, message: String) {
        let mut events = self.events();
        for iqn in iqns {
            events.forget_refused(iqn);
        }
        drop(events);
        self.host_event(kind, host, None, message);
    }

    fn host_event(&self, kind: &'static str, host: &str, volume: Option<&str>, message: String) {
        self.record_event(NewEvent {
            kind,
            message,
            host: Some(host.into()),
            volume: volume.map(str::to_string),
            ..NewEvent::default()
        });
    }
}

/// Initiator names as a host record keeps them. The record keeps strings: an array written by
/// a version that checked less still opens, and its names are matched at login as they are.
fn stored_names(iqns: Vec<IscsiName>) -> Vec<String> {
    iqns.into_iter().map(String::from).collect()
}
