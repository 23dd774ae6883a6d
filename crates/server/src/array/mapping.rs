//! The LUN map: whether an initiator may log in, the host it logs in as, and the LUNs it
//! sees. Logins and sessions read the array only through these, and re-read the LUNs when the
//! generation moves.

use std::collections::BTreeMap;
use std::sync::Arc;

use sliver_scsi::LogicalUnit;

use super::{Array, StoredChap, ANY_HOST};

/// A mapped LUN as one initiator sees it.
#[derive(Clone)]
pub struct MappedLun {
    pub lun: u64,
    pub volume: String,
    pub unit: Arc<LogicalUnit>,
}

/// How an initiator may log in.
pub enum Access {
    /// No host matches the initiator.
    Unknown,
    /// Allowed; CHAP required when credentials are present.
    Allowed(Option<StoredChap>),
}

impl Array {
    /// How `initiator` may log in: through a host listing its IQN, or the `*` host.
    pub fn access(&self, initiator: &str) -> Access {
        let config = self.config.read();
        if let Some(host) = config
            .hosts
            .iter()
            .find(|h| h.iqns.iter().any(|i| i == initiator))
        {
            return Access::Allowed(host.chap.clone());
        }
        let any_host = config.hosts.iter().find(|h| h.name == ANY_HOST);
        let any_connected = config.connections.iter().any(|c| c.host == ANY_HOST);
        match any_host {
            Some(h) => Access::Allowed(h.chap.clone()),
            None if any_connected => Access::Allowed(None),
            None => Access::Unknown,
        }
    }

    /// The host `initiator` logs in as: the one listing it, else `*` when the wildcard host
    /// would admit it; `None` when no host would.
    pub fn host_of(&self, initiator: &str) -> Option<String> {
        let config = self.config.read();
        if let Some(h) = config
            .hosts
            .iter()
            .find(|h| h.iqns.iter().any(|i| i == initiator))
        {
            return Some(h.name.clone());
        }
        drop(config);
        match self.access(initiator) {
            Access::Allowed(_) => Some(ANY_HOST.into()),
            Access::Unknown => None,
        }
    }

    /// Moves whenever what [`Array::luns_for`] returns may have changed (hosts, connections,
    /// volumes).
    pub fn generation(&self) -> u64 {
        self.config.generation()
    }

    /// LUNs `initiator` may address, sorted by LUN. A host's own mapping wins over `*` for the
    /// same LUN number.
    pub fn luns_for(&self, initiator: &str) -> Vec<MappedLun> {
        let config = self.config.read();
        let units = self.units.read().unwrap();
        let own_hosts: Vec<&str> = config
            .hosts
            .iter()
            .filter(|h| h.iqns.iter().any(|i| i == initiator))
            .map(|h| h.name.as_str())
            .collect();
        let mut map: BTreeMap<u64, MappedLun> = BTreeMap::new();
        for pass_own in [false, true] {
            for c in &config.connections {
                let matches = if pass_own {
                    own_hosts.contains(&c.host.as_str())
                } else {
                    c.host == ANY_HOST
                };
                if let (true, Some(unit)) = (matches, units.get(&c.volume)) {
                    map.insert(
                        c.lun,
                        MappedLun {
                            lun: c.lun,
                            volume: c.volume.clone(),
                            unit: unit.clone(),
                        },
                    );
                }
            }
        }
        map.into_values().collect()
    }
}
