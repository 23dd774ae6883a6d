//! What the crate's tests share: logical units over files in a temporary directory, nexuses,
//! requests made and run as the transport makes and runs them, a command's status and sense,
//! and a file volume whose answers a test can change.

use std::path::Path;
use std::sync::Mutex;

use sliver_volume::{BlockStatus, FileVolume, Volume, VolumeError, VolumeSpace};

use crate::range_lock::lock_unpoisoned;
use crate::{CopyTargets, LogicalUnit, LuConfig, Nexus, Request, Response, Status, TaskAttr};

/// The block size of every test volume.
pub(crate) const BS: usize = 512;

/// A file volume of `blocks` blocks of [`BS`] bytes, the file `name` in `dir`.
pub(crate) fn file_volume(dir: &Path, name: &str, blocks: u64) -> FileVolume {
    FileVolume::open(&dir.join(name), blocks * BS as u64, BS as u32).unwrap()
}

/// A test LU's configuration; tests tell LUs apart by serial number and NAA.
pub(crate) fn lu_config(serial: String, naa: [u8; 16]) -> LuConfig {
    LuConfig {
        vendor: "SLIVER".into(),
        product: "sliver".into(),
        revision: "0001".into(),
        serial,
        naa,
        target_name: "iqn.2024-01.io.sliver:t1".into(),
        target_port_group: 1,
        state_dir: None,
    }
}

/// Nexus `n` (a single digit): initiator `iqn.test:<n>` through target port 1.
pub(crate) fn nexus(n: u8) -> Nexus {
    Nexus {
        initiator_port: format!("iqn.test:{n},i,0x00000000000{n}"),
        initiator_name: format!("iqn.test:{n}"),
        relative_target_port: 1,
    }
}

/// A SIMPLE task from `nexus`, which sees `luns` and reaches the LUs `copy_targets` finds.
pub(crate) fn request<'a>(
    nexus: &'a Nexus,
    cdb: &'a [u8],
    data_out: &'a [u8],
    luns: &'a [u64],
    copy_targets: &'a dyn CopyTargets,
) -> Request<'a> {
    Request {
        nexus,
        cdb,
        data_out,
        attr: TaskAttr::Simple,
        luns,
        copy_targets,
    }
}

/// Runs `req` on `lu`, and again if it only reported POWER ON, RESET (which each LU reports
/// once per nexus), so a test sees the command's own outcome.
pub(crate) fn execute_past_power_on(lu: &LogicalUnit, req: &Request) -> Response {
    let r = lu.execute(req);
    if r.sense.get(12) == Some(&0x29) {
        return lu.execute(req);
    }
    r
}

pub(crate) fn good(r: &Response) {
    assert_eq!(r.status, Status::Good, "sense {:02x?}", r.sense);
}

/// (key, ASC, ASCQ) from fixed-format sense.
pub(crate) fn sense_codes(r: &Response) -> (u8, u8, u8) {
    assert_eq!(r.status, Status::CheckCondition, "{r:?}");
    (r.sense[2] & 0x0f, r.sense[12], r.sense[13])
}

/// A file volume with some answers changed, to reach rules a plain file volume does not:
/// by default it answers as the file volume does (and as the `Volume` defaults do where the
/// file volume's own answers are not passed on), and each builder method changes one answer.
pub(crate) struct TestVolume {
    inner: FileVolume,
    /// Crash-atomic write limit to claim (the engine provides real atomicity).
    atomic_bytes: u64,
    /// Longest provisioning run to report at once.
    status_run: u64,
    /// Whether reads say they can be done without waiting ([`Volume::read_cached`]).
    cached_reads: bool,
    /// Writes ending beyond this LBA fail.
    fail_from: u64,
    /// Runs when the first copy into this volume starts: after the copy command checked its
    /// parameters, before any data moved.
    before_copy: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl TestVolume {
    pub(crate) fn new(inner: FileVolume) -> Self {
        TestVolume {
            inner,
            atomic_bytes: 0,
            status_run: u64::MAX,
            cached_reads: false,
            fail_from: u64::MAX,
            before_copy: Mutex::new(None),
        }
    }
    pub(crate) fn reads_cached(self) -> Self {
        TestVolume {
            cached_reads: true,
            ..self
        }
    }
    pub(crate) fn atomic_writes_up_to(self, bytes: u64) -> Self {
        TestVolume {
            atomic_bytes: bytes,
            ..self
        }
    }
    pub(crate) fn status_runs_of(self, blocks: u64) -> Self {
        TestVolume {
            status_run: blocks,
            ..self
        }
    }
    /// Writes at and beyond `lba` fail.
    pub(crate) fn failing_from(self, lba: u64) -> Self {
        TestVolume {
            fail_from: lba,
            ..self
        }
    }
    pub(crate) fn before_copy(self, hook: impl FnOnce() + Send + 'static) -> Self {
        TestVolume {
            before_copy: Mutex::new(Some(Box::new(hook))),
            ..self
        }
    }
}

impl Volume for TestVolume {
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn num_blocks(&self) -> u64 {
        self.inner.num_blocks()
    }
    fn read(&self, lba: u64, buf: &mut [u8]) -> sliver_volume::Result<()> {
        self.inner.read(lba, buf)
    }
    fn read_cached(&self, lba: u64, buf: &mut [u8]) -> sliver_volume::Result<bool> {
        if !self.cached_reads {
            return Ok(false);
        }
        self.inner.read(lba, buf)?;
        Ok(true)
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
        let s = self.inner.block_status(lba)?;
        Ok(BlockStatus {
            blocks: s.blocks.min(self.status_run),
            ..s
        })
    }
    fn space(&self) -> sliver_volume::Result<VolumeSpace> {
        self.inner.space()
    }
    fn max_atomic_write_bytes(&self) -> u64 {
        self.atomic_bytes
    }
}
