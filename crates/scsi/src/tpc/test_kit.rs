//! Test kit for the copy manager: LUs over files, a nexus, commands run as the transport runs
//! them, and a volume whose writes fail or pause on demand.

use std::sync::{Arc, Mutex};

use sliver_volume::{BlockStatus, FileVolume, Volume, VolumeError};

use crate::lu::LogicalUnit;
use crate::range_lock::lock_unpoisoned;
use crate::{CopyTargets, LuConfig, Nexus, Request, Response, Status, TaskAttr};

pub(crate) const BS: usize = 512;
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
        LuConfig {
            vendor: "SLIVER".into(),
            product: "sliver".into(),
            revision: "0001".into(),
            serial: format!("serial-{i}"),
            naa: naa(i),
            target_name: "iqn.2024-01.io.sliver:t1".into(),
            target_port_group: 1,
            state_dir: None,
        },
    ))
}

pub(crate) fn array(count: u8) -> Array {
    let dir = tempfile::tempdir().unwrap();
    let lus = (0..count)
        .map(|i| {
            let path = dir.path().join(format!("lu{i}"));
            let volume = FileVolume::open(&path, BLOCKS * BS as u64, BS as u32).unwrap();
            lu_over(Arc::new(volume), i)
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

pub(crate) fn nexus() -> Nexus {
    Nexus {
        initiator_port: "iqn.test:1,i,0x000000000001".into(),
        initiator_name: "iqn.test:1".into(),
        relative_target_port: 1,
    }
}

pub(crate) fn run(
    lu: &LogicalUnit,
    targets: &dyn CopyTargets,
    cdb: &[u8],
    data: &[u8],
) -> Response {
    let n = nexus();
    let req = Request {
        nexus: &n,
        cdb,
        data_out: data,
        attr: TaskAttr::Simple,
        luns: &[0, 1, 2],
        copy_targets: targets,
    };
    let r = lu.execute(&req);
    // Each LU reports POWER ON, RESET once per nexus; absorb it.
    if r.sense.get(12) == Some(&0x29) {
        return lu.execute(&req);
    }
    r
}

pub(crate) fn good(r: &Response) {
    assert_eq!(r.status, Status::Good, "sense {:02x?}", r.sense);
}

/// (key, ASC, ASCQ) from fixed-format sense.
pub(crate) fn sense(r: &Response) -> (u8, u8, u8) {
    assert_eq!(r.status, Status::CheckCondition, "{r:?}");
    (r.sense[2] & 0x0f, r.sense[12], r.sense[13])
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

/// A file volume for copy tests: writes at and beyond `fail_from` fail, and the first
/// copy that reaches it runs `before_copy` first (after the copy command checked its
/// parameters, before any data moved).
pub(crate) struct ScriptedVolume {
    inner: FileVolume,
    fail_from: u64,
    before_copy: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl ScriptedVolume {
    pub(crate) fn new(inner: FileVolume) -> Self {
        ScriptedVolume {
            inner,
            fail_from: u64::MAX,
            before_copy: Mutex::new(None),
        }
    }
    pub(crate) fn failing_from(self, lba: u64) -> Self {
        ScriptedVolume {
            fail_from: lba,
            ..self
        }
    }
    pub(crate) fn before_copy(self, hook: impl FnOnce() + Send + 'static) -> Self {
        ScriptedVolume {
            before_copy: Mutex::new(Some(Box::new(hook))),
            ..self
        }
    }
}

impl Volume for ScriptedVolume {
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn num_blocks(&self) -> u64 {
        self.inner.num_blocks()
    }
    fn read(&self, lba: u64, buf: &mut [u8]) -> sliver_volume::Result<()> {
        self.inner.read(lba, buf)
    }
    fn write(&self, lba: u64, data: &[u8]) -> sliver_volume::Result<()> {
        let end = lba + (data.len() / BS) as u64;
        if end > self.fail_from {
            return Err(VolumeError::Io(std::io::Error::other("injected")));
        }
        self.inner.write(lba, data)
    }
    fn flush(&self) -> sliver_volume::Result<()> {
        self.inner.flush()
    }
    fn unmap(&self, lba: u64, blocks: u64) -> sliver_volume::Result<()> {
        self.inner.unmap(lba, blocks)
    }
    fn copy_from(
        &self,
        source: &dyn Volume,
        src_lba: u64,
        dst_lba: u64,
        blocks: u64,
    ) -> sliver_volume::Result<()> {
        let hook = lock_unpoisoned(&self.before_copy).take();
        if let Some(hook) = hook {
            hook();
        }
        // Through our own `write`, so injected failures apply to copies too.
        sliver_volume::copy_by_data(self, source, src_lba, dst_lba, blocks)
    }
    fn block_status(&self, lba: u64) -> sliver_volume::Result<BlockStatus> {
        self.inner.block_status(lba)
    }
    fn space(&self) -> sliver_volume::Result<sliver_volume::VolumeSpace> {
        self.inner.space()
    }
}
