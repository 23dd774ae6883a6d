//! Starting a shipper: the tap prepared before the engine opens, then attached to the
//! store (continue the stream or take a base), retried with backoff while the store is away.

use super::local::{self, LocalError, LocalState};
use super::local_error;
use super::retain::retain_loop;
use super::send::ship_loop;
use super::{
    Batch, CatalogState, Queue, Shared, ShipConfig, ShipError, ShipState, ShipStatus, ShipTap,
    Shipper,
};
use crate::catalog;
use crate::object;
use crate::store::ObjectStore;
use sliver_engine::{FileBackend, LogDevice};
use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

impl ShipTap {
    /// Start shipping the array in `dir` (its `FileBackend` opened, the engine not yet) to
    /// `store`: continue the stream after a clean stop, take a base otherwise. Refuses a prefix
    /// that holds another array's pool, and fails when the store cannot be read.
    /// `array_config` is the server's configuration as saved now, for the base (later saves
    /// go through [`ShipTap::record_config`]).
    pub fn start(
        dir: &Path,
        inner: FileBackend,
        store: Arc<dyn ObjectStore>,
        config: ShipConfig,
        array_config: Option<Vec<u8>>,
    ) -> Result<(ShipTap, Shipper), ShipError> {
        let (backend, shipper, local) = prepare(dir, inner, store, config, array_config)?;
        attach(&shipper.shared, dir, local.ours, local.clean, false)?;
        Ok((backend, shipper))
    }

    /// As [`ShipTap::start`], with the store probed first, but a store that cannot be
    /// reached (down, hung, refusing the credentials) does not stop the array: the first
    /// attempt is waited for at most [`ATTACH_WAIT`]; after that the shipper waits for the
    /// store, saying why in its status, tries again with backoff, and once it answers takes a
    /// base (the writes made meanwhile were not recorded). Misconfiguration that retrying
    /// cannot mend (another array's prefix, a store that does not fence) fails the start when
    /// the first attempt finds it, and breaks the copy when a later one does.
    pub fn start_or_wait(
        dir: &Path,
        inner: FileBackend,
        store: Arc<dyn ObjectStore>,
        config: ShipConfig,
        array_config: Option<Vec<u8>>,
    ) -> Result<(ShipTap, Shipper), ShipError> {
        let (backend, shipper, local) = prepare(dir, inner, store, config, array_config)?;
        let (first_tx, first_rx) = mpsc::sync_channel(1);
        let shared = shipper.shared.clone();
        let dir_owned = dir.to_path_buf();
        let waiter = std::thread::Builder::new()
            .name("replica-attach".into())
            .spawn(move || attach_loop(&shared, &dir_owned, local, first_tx))
            .map_err(local_error(dir))?;
        shipper.shared.threads.lock().unwrap().push(waiter);
        let first = first_rx.recv_timeout(ATTACH_WAIT);
        {
            // Under the batch lock, as `attach` starts recording: either it has (the stream
            // may go on) or it learns it is late (the engine may write before it, so a base).
            let _b = shipper.shared.batch.lock().unwrap();
            if shipper.shared.off.load(Ordering::Acquire) {
                shipper.shared.late.store(true, Ordering::Release);
            }
        }
        match first {
            Ok(Err(e @ (ShipError::Refused(_) | ShipError::Local { .. }))) => {
                shipper.shared.stop.store(true, Ordering::Release);
                return Err(e);
            }
            Ok(_) => {}
            Err(_) => {
                let why = format!(
                    "{} did not answer within {} s",
                    shipper.shared.store.describe(),
                    ATTACH_WAIT.as_secs()
                );
                let mut s = shipper.shared.status.lock().unwrap();
                if matches!(s.state, ShipState::Waiting(_)) {
                    s.state = ShipState::Waiting(why);
                }
            }
        }
        if let ShipState::Waiting(why) = &shipper.status().state {
            tracing::warn!("replication: the store cannot be used yet ({why}); the array serves, and the copy starts once the store answers");
        }
        Ok((backend, shipper))
    }
}

/// How long a start waits for the store before the array serves without it.
pub const ATTACH_WAIT: Duration = Duration::from_secs(10);

/// Attach, and while the store cannot be used, try again with backoff (2 s to 60 s). The first
/// attempt's outcome goes to `first`.
pub(super) fn attach_loop(
    shared: &Arc<Shared>,
    dir: &Path,
    local: LocalState,
    first: mpsc::SyncSender<Result<(), ShipError>>,
) {
    let mut clean = local.clean;
    let mut first = Some(first);
    let mut delay = Duration::from_secs(2);
    loop {
        let outcome = attach(shared, dir, local.ours, clean.take(), true);
        let state = match &outcome {
            Ok(()) => None,
            Err(ShipError::Store(e)) => Some(ShipState::Waiting(e.to_string())),
            Err(e) => {
                tracing::error!("replication: {e}");
                Some(ShipState::Broken(e.to_string()))
            }
        };
        let done = !matches!(state, Some(ShipState::Waiting(_)));
        if let Some(state) = state {
            shared.status.lock().unwrap().state = state;
        }
        if let Some(tx) = first.take() {
            let _ = tx.send(outcome);
        }
        if done {
            return;
        }
        let until = Instant::now() + delay;
        while Instant::now() < until {
            if shared.stop.load(Ordering::Acquire) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        delay = (delay * 2).min(Duration::from_secs(60));
    }
}

/// The tap and the shipper, not yet attached to the store (nothing is recorded until
/// [`attach`] has run).
pub(super) fn prepare(
    dir: &Path,
    inner: FileBackend,
    store: Arc<dyn ObjectStore>,
    config: ShipConfig,
    array_config: Option<Vec<u8>>,
) -> Result<(ShipTap, Shipper, LocalState), ShipError> {
    let local = local::take(dir).map_err(|e| match e {
        LocalError::Io(e) => local_error(dir)(e),
        LocalError::DamagedPool(path) => {
            ShipError::Refused(format!("{} is damaged", path.display()))
        }
    })?;
    let capacity = inner.capacity();
    let inner = Arc::new(inner);
    let shared = Arc::new_cyclic(|me| Shared {
        store,
        config,
        capacity,
        batch: Mutex::new(Batch {
            body: Vec::new(),
            records: 0,
            marks: Vec::new(),
            since: None,
        }),
        queue: Mutex::new(Queue {
            bodies: VecDeque::new(),
            next_id: 0,
            bytes: 0,
            immediate: Vec::new(),
            busy: false,
        }),
        wake: Condvar::new(),
        status: Mutex::new(ShipStatus {
            state: ShipState::Waiting("connecting to the store".into()),
            pool: local.ours.unwrap_or_default(),
            shipped_through: 0,
            backlog_bytes: 0,
            objects: 0,
            bytes: 0,
            last_error: None,
            resyncs: 0,
            last_restart: None,
            lag: None,
            newest_point: None,
            deleted_objects: 0,
        }),
        // Nothing is recorded before the store has been read.
        off: AtomicBool::new(true),
        late: AtomicBool::new(false),
        restarting: AtomicBool::new(false),
        catalog: Mutex::new(CatalogState {
            stream: Vec::new(),
            bases: Vec::new(),
            points: Vec::new(),
            next_point: 1,
            retain_due: false,
        }),
        retain_wake: Condvar::new(),
        stop: AtomicBool::new(false),
        inner: inner.clone(),
        array_config: Mutex::new(array_config),
        generation: std::sync::atomic::AtomicU64::new(0),
        base: Mutex::new(None),
        threads: Mutex::new(Vec::new()),
        me: me.clone(),
    });
    Ok((
        ShipTap {
            inner,
            shared: shared.clone(),
        },
        Shipper {
            shared,
            dir: dir.to_path_buf(),
        },
        local,
    ))
}

/// Read the store (probed first if `probe`), decide the pool and whether the stream goes on,
/// and start recording and shipping.
pub(super) fn attach(
    shared: &Arc<Shared>,
    dir: &Path,
    ours: Option<[u8; 16]>,
    clean: Option<([u8; 16], u64, u64)>,
    probe: bool,
) -> Result<(), ShipError> {
    let err = local_error(dir);
    let store = &shared.store;
    if probe {
        match crate::probe::probe(store.clone()) {
            Ok(_) => {}
            Err(crate::probe::ProbeError::Store(e)) => return Err(ShipError::Store(e)),
            Err(e) => return Err(ShipError::Refused(e.to_string())),
        }
    }
    let cat = catalog::load(store.as_ref())?;
    if let Some(d) = cat.damaged.first() {
        if cat.pool.is_none() {
            return Err(ShipError::Refused(d.clone()));
        }
        tracing::warn!(
            "replication: {} catalog object(s) damaged, not used: {d}",
            cat.damaged.len()
        );
    }
    let newest = cat.stream.last().map(|r| r.end - 1).zip(cat.pool);
    let pool = match (ours, newest) {
        (Some(p), Some((_, theirs))) if p != theirs => {
            return Err(ShipError::Refused(format!(
            "{} holds the copy of array {}, not of this one ({}): give this array its own prefix",
            store.describe(),
            object::hex(&theirs),
            object::hex(&p)
        )))
        }
        (None, Some((_, theirs))) => {
            return Err(ShipError::Refused(format!(
                "{} already holds the copy of array {}: give this array its own prefix",
                store.describe(),
                object::hex(&theirs)
            )))
        }
        (Some(p), _) => p,
        (None, None) => {
            let p: [u8; 16] = rand::random();
            local::record_pool(dir, &p).map_err(&err)?;
            p
        }
    };
    let last = newest.map(|(n, _)| n).unwrap_or(0);
    let continues = clean == Some((pool, last, shared.capacity)) && last > 0;
    // A stream shipped before the base index existed: a scheduled base gives it one.
    let needs_index = continues && cat.bases.is_empty();
    {
        let mut s = shared.status.lock().unwrap();
        s.state = if continues {
            ShipState::Streaming
        } else {
            ShipState::Base
        };
        s.pool = pool;
        s.shipped_through = last;
        s.newest_point = cat.points.iter().max_by_key(|p| p.number).cloned();
    }
    {
        let mut c = shared.catalog.lock().unwrap();
        c.next_point = cat.last_point_number + 1;
        c.stream = cat.stream;
        c.bases = cat.bases;
        c.points = cat.points;
        c.retain_due = true;
    }
    if continues {
        tracing::info!(
            "replicating to {}: continuing the copy at object {}",
            store.describe(),
            last + 1
        );
    } else {
        tracing::info!(
            "replicating to {}: copying the whole array (a base) from object {}, following its writes meanwhile",
            store.describe(),
            last + 1
        );
    }
    {
        // Recording starts under the batch lock with the base's start record first: no write
        // the engine completes from now on goes before it, and every one before is in the
        // files the base reads.
        let mut b = shared.batch.lock().unwrap();
        if shared.stop.load(Ordering::Acquire) {
            return Err(ShipError::Refused("the array stopped".into()));
        }
        if continues && shared.late.load(Ordering::Acquire) {
            // The engine may have written since the start: the stream cannot go on.
            shared.status.lock().unwrap().state = ShipState::Base;
            shared.off.store(false, Ordering::Release);
            shared.begin_base_locked(&mut b, false);
        } else {
            shared.off.store(false, Ordering::Release);
            if !continues || needs_index {
                shared.begin_base_locked(&mut b, continues);
            }
        }
    }
    let ship = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("replica-ship".into())
            .spawn(move || ship_loop(&shared, last + 1))
            .map_err(&err)?
    };
    let retain = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("replica-retain".into())
            .spawn(move || retain_loop(&shared))
            .map_err(&err)?
    };
    shared.threads.lock().unwrap().extend([ship, retain]);
    Ok(())
}
