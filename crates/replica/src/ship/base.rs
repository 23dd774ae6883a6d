//! A base: every extent of the files that holds data, read from the live files.

use super::{Mark, Shared, ShipState};
use crate::stream::Record;
use sliver_engine::{LogDevice, MetaArea, RootStore};
use std::io;
use std::sync::atomic::Ordering;

/// Every extent of the files that holds data, as base records, then the base's end. Read from
/// the live files while hosts write (see `stream`: a restore puts the writes made meanwhile
/// over it). Stops when a newer base starts (`generation`) or the shipper stops.
pub(super) fn read_base(shared: &Shared, generation: u64) -> io::Result<()> {
    let inner = &shared.inner;
    // A piece never fills a batch alone (see `Shared::batch_limit`).
    let piece = (4u64 << 20).min(shared.batch_limit() as u64);
    let mut buf = Vec::new();
    let mut bytes = 0u64;
    let current = || {
        !shared.stop.load(Ordering::Acquire)
            && shared.generation.load(Ordering::Acquire) == generation
    };
    for (meta, extents) in [
        (false, inner.log_data_extents()?),
        (true, inner.meta_data_extents()?),
    ] {
        for (start, len) in extents {
            let mut at = start;
            while at < start + len {
                if !current() {
                    return Ok(());
                }
                let n = piece.min(start + len - at) as usize;
                buf.resize(n, 0);
                let rec = if meta {
                    inner.meta_read(&mut buf, at)?;
                    Record::Meta {
                        offset: at,
                        bytes: &buf,
                        base: true,
                    }
                } else {
                    inner.read_at(&mut buf, at)?;
                    Record::Log {
                        offset: at,
                        bytes: &buf,
                        base: true,
                    }
                };
                if !shared.record_base(rec, generation) {
                    return Ok(());
                }
                shared.throttle();
                at += n as u64;
                bytes += n as u64;
            }
        }
    }
    if let Some(root) = inner.load_root()? {
        let rec = Record::Root {
            bytes: &root,
            base: true,
        };
        if !shared.record_base(rec, generation) {
            return Ok(());
        }
    }
    let config = shared.array_config.lock().unwrap().clone();
    if let Some(bytes) = config {
        let rec = Record::Config {
            bytes: &bytes,
            base: true,
        };
        if !shared.record_base(rec, generation) {
            return Ok(());
        }
    }
    let end = Mark::BaseEnd { generation, bytes };
    if shared.record_base_marked(Record::BaseEnd, generation, Some(end)) {
        shared.cut();
        let mut s = shared.status.lock().unwrap();
        if s.state == ShipState::Base && shared.generation.load(Ordering::Acquire) == generation {
            s.state = ShipState::Streaming;
        }
    }
    Ok(())
}
