//! A SCSI logical unit over an engine volume on a model backend, driven without a network:
//! what the storage-fault tests (`enospc`, `media_errors`) share.

use sliver_engine::{
    Compression, Devices, Engine, EngineConfig, EngineVolume, FormatTwoCheckpoint, GcPriority,
    LogDevice, MemBackend, MetaArea, RootStore, Tuning,
};
use sliver_scsi::{LogicalUnit, LuConfig, Nexus, Request, Response, Status, TaskAttr};
use std::io;
use std::sync::Arc;

/// What a test models of the storage under the engine. Each method stands in for the
/// device method of the same name ([`LogDevice`], [`FormatTwoCheckpoint`]), in front of the
/// memory `mem` that holds the data; by default it passes the call on unchanged (as the
/// trait's own default, where it has one).
pub trait Model: Send + Sync {
    fn write_at(&self, mem: &MemBackend, data: &[u8], offset: u64) -> io::Result<()> {
        mem.write_at(data, offset)
    }
    fn allocate(&self, mem: &MemBackend, offset: u64, len: u64) -> io::Result<()> {
        mem.allocate(offset, len)
    }
    fn allocation_reserves(&self) -> bool {
        true
    }
    fn discard(&self, mem: &MemBackend, offset: u64, len: u64) -> io::Result<()> {
        mem.discard(offset, len)
    }
    fn store_checkpoint(&self, mem: &MemBackend, bytes: &[u8]) -> io::Result<()> {
        mem.store_checkpoint(bytes)
    }
    fn sync(&self, mem: &MemBackend) -> io::Result<()> {
        mem.sync()
    }
}

/// A [`MemBackend`] with `model` in front of it.
pub struct Modelled<M> {
    pub mem: MemBackend,
    pub model: M,
}

impl<M: Model> LogDevice for Modelled<M> {
    fn capacity(&self) -> u64 {
        self.mem.capacity()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.mem.read_at(buf, offset)
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.model.write_at(&self.mem, data, offset)
    }

    fn sync(&self) -> io::Result<()> {
        self.model.sync(&self.mem)
    }

    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        self.model.allocate(&self.mem, offset, len)
    }

    fn allocation_reserves(&self) -> bool {
        self.model.allocation_reserves()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.model.discard(&self.mem, offset, len)
    }
}

impl<M: Model> MetaArea for Modelled<M> {
    fn meta_read(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.mem.meta_read(buf, offset)
    }

    fn meta_write(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.mem.meta_write(data, offset)
    }

    fn meta_sync(&self) -> io::Result<()> {
        self.mem.meta_sync()
    }
}

impl<M: Model> RootStore for Modelled<M> {
    fn load_root(&self) -> io::Result<Option<Vec<u8>>> {
        self.mem.load_root()
    }

    fn store_root(&self, bytes: &[u8]) -> io::Result<()> {
        self.mem.store_root(bytes)
    }
}

impl<M: Model> FormatTwoCheckpoint for Modelled<M> {
    fn retire_checkpoint(&self) -> io::Result<()> {
        self.mem.retire_checkpoint()
    }

    fn load_checkpoint(&self) -> io::Result<Option<Vec<u8>>> {
        self.mem.load_checkpoint()
    }

    fn store_checkpoint(&self, bytes: &[u8]) -> io::Result<()> {
        self.model.store_checkpoint(&self.mem, bytes)
    }
}

pub const MIB: u64 = 1 << 20;
/// The engine's chunk size.
pub const CHUNK: usize = 4096;

/// The engine's tuning: chunks stored verbatim (a test can find a chunk's bytes in the log)
/// and no collector running behind the test's back.
pub fn tuning() -> Tuning {
    Tuning {
        compression: Compression::None,
        gc: GcPriority::Off,
        ..Tuning::default()
    }
}

/// A new engine of 4 KiB chunks and 1 MiB segments on `backend`, with [`tuning`].
pub fn create_engine(backend: impl Into<Devices>) -> Arc<Engine> {
    let config = EngineConfig {
        chunk_size: CHUNK as u32,
        segment_size: MIB as u32,
    };
    Arc::new(Engine::create(backend, config, tuning()).unwrap())
}

/// What tells one test's logical unit from another's.
pub struct Identity<'a> {
    pub serial: &'a str,
    pub naa: [u8; 16],
    pub target_name: &'a str,
}

/// The logical unit of engine volume `id`, with `block_size`-byte blocks.
pub fn lu_over(engine: &Arc<Engine>, id: u32, block_size: u32, who: &Identity) -> LogicalUnit {
    let volume = EngineVolume::new(engine.clone(), id, block_size, false).unwrap();
    LogicalUnit::new(
        Arc::new(volume),
        LuConfig {
            vendor: "SLIVER".into(),
            product: "sliver".into(),
            revision: "0001".into(),
            serial: who.serial.into(),
            naa: who.naa,
            target_name: who.target_name.into(),
            target_port_group: 1,
            state_dir: None,
        },
    )
}

/// Initiator `initiator_name`'s nexus through target port 1.
pub fn nexus(initiator_name: &str) -> Nexus {
    Nexus {
        initiator_port: format!("{initiator_name},i,0x000000000001"),
        initiator_name: initiator_name.into(),
        relative_target_port: 1,
    }
}

/// `cdb` (with `data_out`) from `nexus`, a SIMPLE task on LUN 0.
pub fn run(lu: &LogicalUnit, nexus: &Nexus, cdb: &[u8], data_out: &[u8]) -> Response {
    lu.execute(&Request {
        nexus,
        cdb,
        data_out,
        attr: TaskAttr::Simple,
        luns: &[0],
        copy_targets: &sliver_scsi::NoCopyTargets,
    })
}

/// A 16-byte CDB of operation `op` for `blocks` blocks at `lba`, with FUA if `fua`.
pub fn cdb16(op: u8, lba: u64, blocks: u32, fua: bool) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op;
    if fua {
        c[1] = 0x08;
    }
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// (sense key, ASC, ASCQ) of a CHECK CONDITION.
#[track_caller]
pub fn codes(r: &Response) -> (u8, u8, u8) {
    assert_eq!(r.status, Status::CheckCondition, "expected CHECK CONDITION");
    (r.sense[2] & 0x0f, r.sense[12], r.sense[13])
}

#[track_caller]
pub fn good(r: &Response) {
    assert_eq!(r.status, Status::Good, "sense {:02x?}", r.sense);
}
