//! Test kit for the copy manager: LUs over files that may reach each other, commands run as
//! the transport runs them, and the blocks the LUs hold.

use std::sync::Arc;

use sliver_volume::Volume;

use crate::lu::LogicalUnit;
use crate::test_kit::{execute_past_power_on, file_volume, lu_config, nexus, request, BS};
use crate::{CopyTargets, Response};

pub(crate) const BLOCKS: u64 = 4096;

/// LUs over files in a temporary directory; LU `i` has NAA `[0x60, i, i, ...]`.
pub(crate) struct Array {
    _dir: tempfile::TempDir,
    pub lus: Vec<Arc<LogicalUnit>>,
}

pub(crate) fn naa(i: u8) -> [u8; 16] {
    let mut n = [i; 16];
    n[0] = 0x60;
    n
}

pub(crate) fn lu_over(volume: Arc<dyn Volume>, i: u8) -> Arc<LogicalUnit> {
    Arc::new(LogicalUnit::new(
        volume,
        lu_config(format!("serial-{i}"), naa(i)),
    ))
}

pub(crate) fn array(count: u8) -> Array {
    array_on(count, Arc::new(sliver_clock::SystemClock))
}

/// [`array`], its LUs reading the time from `clock`.
pub(crate) fn array_on(count: u8, clock: Arc<dyn sliver_clock::Clock>) -> Array {
    let dir = tempfile::tempdir().unwrap();
    let lus = (0..count)
        .map(|i| {
            let volume = file_volume(dir.path(), &format!("lu{i}"), BLOCKS);
            let config = lu_config(format!("serial-{i}"), naa(i));
            Arc::new(LogicalUnit::new(Arc::new(volume), config).with_clock(clock.clone()))
        })
        .collect();
    Array { _dir: dir, lus }
}

/// The LUs a nexus may reach, as the transport would supply them.
pub(crate) struct Reachable(pub Vec<Arc<LogicalUnit>>);

impl CopyTargets for Reachable {
    fn find_by_naa(&self, naa: &[u8]) -> Option<Arc<LogicalUnit>> {
        self.0.iter().find(|lu| lu.naa() == naa).cloned()
    }
}

/// Runs `cdb` from nexus 1, which sees LUNs 0 to 2 and reaches the LUs `targets` finds, past
/// the power-on unit attention.
pub(crate) fn run(
    lu: &LogicalUnit,
    targets: &dyn CopyTargets,
    cdb: &[u8],
    data: &[u8],
) -> Response {
    let n = nexus(1);
    execute_past_power_on(lu, &request(&n, cdb, data, &[0, 1, 2], targets))
}

pub(crate) fn write(lu: &LogicalUnit, lba: u64, data: &[u8]) {
    lu.volume().write(lba, data).unwrap();
}

pub(crate) fn read(lu: &LogicalUnit, lba: u64, blocks: usize) -> Vec<u8> {
    let mut buf = vec![0u8; blocks * BS];
    lu.volume().read(lba, &mut buf).unwrap();
    buf
}

pub(crate) fn pattern(blocks: usize, seed: u8) -> Vec<u8> {
    (0..blocks * BS)
        .map(|i| (i / BS) as u8 ^ seed ^ (i as u8))
        .collect()
}
