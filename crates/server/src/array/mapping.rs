//! The LUN map: whether an initiator may log in, the host it logs in as, and the LUNs it
//! sees. A transport's logins and sessions read the array only through [`LunMap`], and re-read
//! the LUNs when the generation moves: the iSCSI target today, a second protocol's controller
//! or a peer node's mirror of the configuration beside it later, and a simulation's fixed map
//! in tests.

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

/// What logins and sessions read of an array's configuration.
pub trait LunMap: Send + Sync {
    /// How `initiator` may log in.
    fn access(&self, initiator: &str) -> Access;

    /// The host `initiator` logs in as; `None` when no host would admit it.
    fn host_of(&self, initiator: &str) -> Option<String>;

    /// Moves whenever what [`LunMap::luns_for`] returns may have changed.
    fn generation(&self) -> u64;

    /// The LUNs `initiator` may address, sorted by LUN.
    fn luns_for(&self, initiator: &str) -> Vec<MappedLun>;
}

impl LunMap for Array {
    /// Through a host listing its IQN, or the `*` host.
    fn access(&self, initiator: &str) -> Access {
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

    /// The one listing it, else `*` when the wildcard host would admit it.
    fn host_of(&self, initiator: &str) -> Option<String> {
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

    /// With every change of hosts, connections or volumes.
    fn generation(&self) -> u64 {
        self.config.generation()
    }

    /// A host's own mapping wins over `*` for the same LUN number.
    fn luns_for(&self, initiator: &str) -> Vec<MappedLun> {
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
