//! Creating and opening an engine: format a new log, or load the root, replay the log after
//! it and repair a torn tail. An array written by format 2 is migrated on open (see
//! [`super::migrate`]).

use super::*;
use crate::meta::tables::CHUNK_LIVE;
use crate::meta::tables::T_NODE_META;

use crate::meta::pager::Pager;
use crate::meta::resident::ResidentTable;
use crate::meta::root::{Root, ROOT_VERSION_V3};
use crate::meta::segment_table::SegmentTable;
use crate::meta::tables::T_SEGMENTS;

/// What replay applies records to: format 3's state, or format 2's for the migration. Each
/// applies every record, segment starts and seals included, and keeps the segment rows
/// itself (`state::row_after`).
pub(super) trait ReplayTarget {
    fn replay(
        &mut self,
        record: &Record<'_>,
        loc: Loc,
        len: u32,
        seq: u64,
    ) -> std::result::Result<(), String>;
}

impl ReplayTarget for MetaState {
    fn replay(
        &mut self,
        record: &Record<'_>,
        loc: Loc,
        len: u32,
        seq: u64,
    ) -> std::result::Result<(), String> {
        self.apply(record, loc, len, seq).map_err(|e| e.to_string())
    }
}

impl Engine {
    /// Format a new engine on empty devices.
    pub fn create(
        devices: impl Into<Devices>,
        config: EngineConfig,
        tuning: Tuning,
    ) -> Result<Self> {
        let devices = devices.into();
        if let Some(problem) = config.size_problem() {
            return Err(EngineError::Invalid(problem));
        }
        let segment_count =
            (devices.log.capacity() / config.segment_size as u64).min(u32::MAX as u64) as u32;
        if segment_count < 8 {
            return Err(EngineError::Invalid(format!(
                "capacity {} bytes holds fewer than 8 segments of {} bytes",
                devices.log.capacity(),
                config.segment_size
            )));
        }
        if devices.root.load_root()?.is_some() || devices.checkpoint.load_checkpoint()?.is_some() {
            return Err(EngineError::Invalid(
                "the backend already holds an engine".into(),
            ));
        }
        let mut key = [0u8; 32];
        rand::Rng::fill(&mut rand::thread_rng(), &mut key[..]);
        let geometry = Geometry {
            chunk_size: config.chunk_size,
            segment_size: config.segment_size,
            segment_count,
            key,
        };
        super::budget::check(&geometry, &tuning)?;
        let pager = new_pager(&devices.meta, &tuning);
        let mut state = MetaState::new(config.chunk_size, segment_count, pager);
        // Segment 0, sequence 1, holds the first record.
        devices.log.allocate(0, config.segment_size as u64)?;
        let mut buf = Vec::new();
        Encoder::new(&mut buf, 1).segment_start(1, 0);
        devices.log.write_at(&buf, 0)?;
        devices.log.sync()?;
        state
            .apply_start(0, 1)
            .map_err(|e| EngineError::Metadata(e.to_string()))?;
        let head = Head {
            segment: 0,
            seq: 1,
            offset: SEGMENT_START_LEN as u32,
        };
        let counters = Counters {
            next_volume: 1,
            ..Default::default()
        };
        let engine = Self::assemble(
            devices,
            geometry,
            state,
            head,
            counters,
            1,
            Slots::default(),
            0,
            tuning,
            false,
            Recovery::default(),
        );
        // The first root: from now on the backend holds an engine.
        engine.checkpoint_locked()?;
        // A new log has allocated nothing it could give back.
        engine.lock_log().segments.nothing_to_discard();
        Ok(engine)
    }

    /// Open an existing engine: load the root, replay the log after it, repair a torn tail.
    /// With `read_only` nothing is written (for the offline checker). A format 2 array is
    /// migrated first (read-only: converted in memory only).
    pub fn open(devices: impl Into<Devices>, tuning: Tuning, read_only: bool) -> Result<Self> {
        let started = Instant::now();
        let devices = devices.into();
        let Some(bytes) = devices.root.load_root()? else {
            if devices.checkpoint.load_checkpoint()?.is_some() {
                return Self::migrate(devices, tuning, read_only);
            }
            return Err(EngineError::Metadata(
                "no root and no checkpoint: not an engine".into(),
            ));
        };
        let root = Root::decode(&bytes).map_err(|e| EngineError::Metadata(e.to_string()))?;
        let geometry = root.geometry;
        if geometry.segment_count as u64 * geometry.segment_size as u64 > devices.log.capacity() {
            return Err(EngineError::Metadata(
                "the log is smaller than the root says".into(),
            ));
        }
        super::budget::check(&geometry, &tuning)?;
        if !read_only && devices.checkpoint.load_checkpoint()?.is_some() {
            // A migration that wrote its root but was stopped before setting the format 2
            // checkpoint aside: the root is the array now.
            devices.checkpoint.retire_checkpoint()?;
        }
        let mut state = load_state(&devices.meta, &root, &tuning)?;
        let slots = Slots::from_used(used_slots(state.pager()));
        let mut counters = root.counters;
        let mut recovery = Recovery::default();
        let end = replay(
            &*devices.log,
            &geometry,
            &mut state,
            &mut counters,
            root.head,
            &mut recovery,
        )?;
        state.reset_chunk_allocation();
        Self::finish_open(
            devices,
            geometry,
            state,
            counters,
            root.head,
            end,
            slots,
            root.generation,
            // Format 4 writers sync at least every MAX_UNSYNCED_SEGMENTS segment switches
            // (and every open writes a format 4 root before it takes writes); earlier ones
            // did not.
            if root.version >= crate::meta::root::ROOT_VERSION {
                MAX_UNSYNCED_SEGMENTS
            } else {
                u64::MAX
            },
            tuning,
            read_only,
            recovery,
            started,
        )
    }

    /// After replay: repair the tail, write a root at the new head (unless read-only) and
    /// start serving.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn finish_open(
        devices: Devices,
        geometry: Geometry,
        mut state: MetaState,
        counters: Counters,
        from: Head,
        end: LogEnd,
        slots: Slots,
        generation: u64,
        unsynced_bound: u64,
        tuning: Tuning,
        read_only: bool,
        mut recovery: Recovery,
        started: Instant,
    ) -> Result<Self> {
        let mut head = match end {
            LogEnd::Torn(h) => {
                recovery.torn_tail = true;
                h
            }
            LogEnd::AfterSeal(h) => h,
        };
        if !read_only {
            head = repair_tail(
                &*devices.log,
                &geometry,
                &mut state,
                end,
                from,
                unsynced_bound,
            )?;
        }
        let engine = Self::assemble(
            devices,
            geometry,
            state,
            head,
            counters,
            from.seq,
            slots,
            generation,
            tuning,
            read_only,
            Recovery::default(),
        );
        if !read_only {
            // A root at the new head: recovery never again depends on the log before it
            // (whose tail may hold records of the lost history), and the segments left
            // behind become collectable at once.
            engine.checkpoint_locked()?;
        }
        recovery.duration = started.elapsed();
        let mut engine = engine;
        engine.recovery = recovery;
        Ok(engine)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn assemble(
        devices: Devices,
        geometry: Geometry,
        state: MetaState,
        head: Head,
        counters: Counters,
        checkpoint_seq: u64,
        slots: Slots,
        generation: u64,
        tuning: Tuning,
        read_only: bool,
        recovery: Recovery,
    ) -> Self {
        let free: Vec<u32> = (0..geometry.segment_count)
            .rev()
            .filter(|&i| state.segment(i).state == SegState::Free)
            .collect();
        // A crash can leave freed segments' space allocated: all wait to be given back when
        // idle (adjacent segments go in one call).
        devices
            .meta
            .reserve_meta(super::checkpointing::meta_reserve(
                &state,
                tuning.metadata_cache,
            ));
        Engine {
            log_device: devices.log,
            meta_area: devices.meta,
            root_store: devices.root,
            geometry,
            meta: RankedMutex::new(
                Rank::State,
                Meta {
                    state,
                    counters,
                    checkpoint: CheckpointMarks::opened(checkpoint_seq, generation),
                    locality: Locality::new(LOCALITY_PAGES),
                },
            ),
            log: RankedMutex::new(
                Rank::Log,
                Log {
                    head: LogHead::new(head),
                    segments: FreeSegments::new(free),
                },
            ),
            slots: RankedMutex::new(Rank::Slots, slots),
            usage: RankedMutex::new(Rank::Leaf, HashMap::new()),
            metadata_written: AtomicU64::new(0),
            longest_hold: AtomicU64::new(0),
            total_hold_ns: AtomicU64::new(0),
            holds: Default::default(),
            data_chunks_written: AtomicU64::new(0),
            dedup_chunks: AtomicU64::new(0),
            log_syncs: AtomicU64::new(0),
            preparer: SegmentPreparer::default(),
            read_pins: Default::default(),
            flush: RankedMutex::new(
                Rank::Flush,
                FlushState {
                    durable: 0,
                    syncing: false,
                },
            ),
            flushed: Condvar::new(),
            group_commit: Default::default(),
            inflight: Default::default(),
            poison: RankedMutex::new(Rank::Leaf, None),
            poisoned: AtomicBool::new(false),
            maintenance: RankedMutex::new(Rank::Maintenance, ()),
            tuning: RankedMutex::new(Rank::Leaf, tuning),
            stop: AtomicBool::new(false),
            collector: Collector::default(),
            host_activity: AtomicU64::new(0),
            activity_at_last_round: AtomicU64::new(0),
            read_only,
            recovery,
            #[cfg(test)]
            between_relocation_holds: RankedMutex::new(Rank::TestHook, None),
        }
    }
}

/// The state a root names: directories read from the directory pages it lists, the tables
/// kept whole in RAM loaded, everything else left on disk until it is needed.
fn load_state(meta: &Arc<dyn MetaArea>, root: &Root, tuning: &Tuning) -> Result<MetaState> {
    let g = &root.geometry;
    let mut pager = new_pager(meta, tuning);
    pager
        .load_directories(&root.tables, root.version)
        .map_err(|e| EngineError::Metadata(e.to_string()))?;
    if root.version == ROOT_VERSION_V3 {
        // Format 3's directory pages hold places without generations: the first checkpoint
        // writes every directory page in format 4 with the root that names them.
        pager.rewrite_all_directories();
    }
    pager
        .load_journal()
        .map_err(|e| EngineError::Metadata(e.to_string()))?;
    let entries = |table: u8| {
        root.tables
            .iter()
            .find(|t| t.table == table)
            .map_or(0, |t| t.entries)
    };
    let meta = |e: crate::meta::PageError| EngineError::Metadata(e.to_string());
    let segments = SegmentTable::load(&pager, entries(T_SEGMENTS)).map_err(meta)?;
    if segments.len() != g.segment_count as u64 {
        return Err(EngineError::Metadata(format!(
            "the segment table holds {} segments, the root says {}",
            segments.len(),
            g.segment_count
        )));
    }
    let nodes = ResidentTable::load(T_NODE_META, &pager, entries(T_NODE_META)).map_err(meta)?;
    let live = ResidentTable::load(CHUNK_LIVE, &pager, entries(CHUNK_LIVE)).map_err(meta)?;
    Ok(MetaState::loaded(pager, segments, nodes, live, root))
}

/// Every slot of the metadata area a root (through its directories) names.
pub(super) fn used_slots(pager: &Pager) -> Vec<u64> {
    (0..=255u8)
        .flat_map(|t| pager.directory(t).iter())
        .filter(|l| !l.is_none())
        .map(|l| l.slot)
        .collect()
}

/// Where replay stopped.
pub(super) enum LogEnd {
    /// At an invalid record inside the head segment: the tail from here was never durable.
    Torn(Head),
    /// Right after a Seal whose next segment never got its start record.
    AfterSeal(Head),
}

pub(super) fn replay(
    log: &dyn LogDevice,
    geometry: &Geometry,
    state: &mut dyn ReplayTarget,
    counters: &mut Counters,
    start: Head,
    recovery: &mut Recovery,
) -> Result<LogEnd> {
    let seg = geometry.segment_size as u64;
    let mut head = start;
    let mut buf = vec![0u8; seg as usize];
    loop {
        let base = head.segment as u64 * seg;
        log.read_at(&mut buf, base)?;
        let mut pos = head.offset as usize;
        loop {
            let decoded = format::decode(&buf[pos..], head.seq);
            let (record, len) = match decoded {
                Ok(x) => x,
                Err(format::DecodeError::Malformed(why)) => {
                    return Err(EngineError::Metadata(format!(
                        "segment {} offset {pos}: {why}",
                        head.segment
                    )))
                }
                Err(_) => {
                    return Ok(LogEnd::Torn(Head {
                        offset: pos as u32,
                        ..head
                    }))
                }
            };
            recovery.records_replayed += 1;
            recovery.bytes_replayed += len as u64;
            let loc = Loc {
                segment: head.segment,
                offset: pos as u32,
            };
            let misplaced = |e: String| {
                EngineError::Metadata(format!("segment {} offset {pos}: {e}", head.segment))
            };
            match record {
                Record::Seal {
                    next_segment,
                    next_seq,
                } => {
                    state
                        .replay(&record, loc, len as u32, head.seq)
                        .map_err(misplaced)?;
                    // Sequences grow by one per segment, and jump after a recovery (see
                    // `repair_tail`).
                    if next_segment >= geometry.segment_count || next_seq <= head.seq {
                        return Err(EngineError::Metadata("seal points outside the log".into()));
                    }
                    let mut start = vec![0u8; SEGMENT_START_LEN];
                    log.read_at(&mut start, next_segment as u64 * seg)?;
                    match format::decode(&start, next_seq) {
                        Ok((started @ Record::SegmentStart { seq, segment }, _))
                            if seq == next_seq && segment == next_segment =>
                        {
                            let at = Loc {
                                segment: next_segment,
                                offset: 0,
                            };
                            state
                                .replay(&started, at, SEGMENT_START_LEN as u32, next_seq)
                                .map_err(EngineError::Metadata)?;
                            head = Head {
                                segment: next_segment,
                                seq: next_seq,
                                offset: SEGMENT_START_LEN as u32,
                            };
                            break;
                        }
                        _ => {
                            return Ok(LogEnd::AfterSeal(Head {
                                segment: next_segment,
                                seq: next_seq,
                                offset: 0,
                            }))
                        }
                    }
                }
                other => {
                    state
                        .replay(&other, loc, len as u32, head.seq)
                        .map_err(misplaced)?;
                    if let Record::VolumeCreate { volume, .. }
                    | Record::VolumeClone { dst: volume, .. } = other
                    {
                        counters.next_volume = counters.next_volume.max(volume + 1);
                    }
                    if let Record::Batch { inner } = other {
                        for (_, r) in format::covered_records(inner, head.seq).flatten() {
                            if let Record::Chunk { data, .. } = r {
                                // Host and collector writes are not told apart in the log;
                                // count them as host bytes (the figure is advisory).
                                counters.host_bytes +=
                                    (RECORD_HEADER + CHUNK_PREFIX + data.len()) as u64;
                            }
                        }
                    }
                }
            }
            pos += len;
            if pos >= buf.len() {
                return Ok(LogEnd::Torn(Head {
                    offset: pos as u32,
                    ..head
                }));
            }
        }
    }
}

/// Make the log appendable again after replay: seal a torn segment (stale bytes after the tear
/// must never be read as records) and open a fresh head segment, which the caller records in
/// a new checkpoint.
///
/// The writes lost in the crash may have reached other segments: a crash keeps any subset of
/// what was not synced, so segments the lost history opened after the tear (with the sequence
/// numbers that come next) can hold complete, checksummed records. Were the new head to reuse
/// those sequence numbers, replay would one day run from the new records into the lost ones.
/// Between two syncs each segment is opened at most once (a segment only becomes free again
/// after the collector synced), and a writer of format 4 opens at most `unsynced_bound`
/// segments after the start of its last sync ([`MAX_UNSYNCED_SEGMENTS`]), so the lost history
/// used at most that many sequence numbers after the last one replay saw (at most
/// `segment_count` for older writers): the new head skips all of them. Records carry the low
/// 32 bits of their segment's sequence, so the skip also bounds how many crashes can pass
/// before a sequence comes round again; a skip that grew with the array (the segment count,
/// 4 Mi at 16 TiB) would let it come round after a thousand crashes.
///
/// The new head is a free segment or, when there is none, a segment holding neither live
/// chunks nor records the current checkpoint's replay needs: an old one, or the torn head
/// itself when nothing after the checkpoint was found (a clean restart). So repeated restarts
/// of a full array do not run out of segments.
pub(super) fn repair_tail(
    log: &dyn LogDevice,
    geometry: &Geometry,
    state: &mut MetaState,
    end: LogEnd,
    checkpoint: Head,
    unsynced_bound: u64,
) -> Result<Head> {
    let seg = geometry.segment_size as u64;
    let (last_seq, torn) = match end {
        // The seal is durable; the lost history started the segment it names.
        LogEnd::AfterSeal(h) => (h.seq, None),
        LogEnd::Torn(h) => {
            if h.offset as u64 + SEAL_LEN as u64 > seg {
                return Err(EngineError::Metadata(format!(
                    "segment {} has no room for its seal",
                    h.segment
                )));
            }
            (h.seq, Some(h))
        }
    };
    let seq = last_seq + unsynced_bound.min(geometry.segment_count as u64) + 1;
    let segments = state.segments();
    let garbage = |i: u32| {
        let s = &segments[i as usize];
        s.state == SegState::Sealed && s.live == 0 && s.seq < checkpoint.seq
    };
    // Replay stopped right at the checkpoint's head: the torn segment holds nothing the
    // checkpoint's replay needs before that point, and the bytes there, which stop that
    // replay, stay as they are (only the segment's start record is rewritten).
    let reusable_head = torn.filter(|&h| h == checkpoint && segments[h.segment as usize].live == 0);
    let mut candidates: Vec<u32> = (0..geometry.segment_count)
        .filter(|&i| segments[i as usize].state == SegState::Free)
        .chain((0..geometry.segment_count).filter(|&i| garbage(i)))
        .filter(|&i| !matches!(torn, Some(h) if h.segment == i))
        .collect();
    candidates.extend(reusable_head.map(|h| h.segment));
    let mut segment = None;
    for i in candidates {
        match log.allocate(i as u64 * seg, seg) {
            Ok(()) => {
                segment = Some(i);
                break;
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    let Some(segment) = segment else {
        // Every segment holds live chunks or records replay needs. Then the lost history
        // opened no segment either (it could only have taken one that is free or garbage
        // here), so its records can only lie in the torn segment after the tear: wipe them
        // and go on appending there, with the same sequence number.
        let h = torn.ok_or(EngineError::NoSpace)?;
        let from = h.segment as u64 * seg + h.offset as u64;
        log.write_at(&vec![0u8; (seg - h.offset as u64) as usize], from)?;
        log.sync()?;
        state.resume_torn(h.segment, h.seq, h.offset);
        return Ok(h);
    };
    if let Some(h) = torn.filter(|h| h.segment != segment) {
        let mut seal = Vec::new();
        Encoder::new(&mut seal, h.seq).seal(segment, seq);
        log.write_at(&seal, h.segment as u64 * seg + h.offset as u64)?;
        let at = Loc {
            segment: h.segment,
            offset: h.offset,
        };
        state
            .apply_seal(at, h.seq, segment, seq)
            .map_err(|e| EngineError::Metadata(e.to_string()))?;
    }
    // No record anywhere carries the new sequence number: the segment needs no wiping.
    let mut start = Vec::new();
    Encoder::new(&mut start, seq).segment_start(seq, segment);
    log.write_at(&start, segment as u64 * seg)?;
    log.sync()?;
    state
        .apply_start(segment, seq)
        .map_err(|e| EngineError::Metadata(e.to_string()))?;
    Ok(Head {
        segment,
        seq,
        offset: SEGMENT_START_LEN as u32,
    })
}
