//! The ship loop: cut batches created in the store in order, one at a time, with
//! put-if-absent and retries; a writer that finds its object taken is fenced.

use super::create::{create_counting, fenced};
use super::points::{schedule, shipped};
use super::{Local, Shared};
use crate::catalog;
use crate::object::{self, Kind, ObjectName};
use crate::store::StoreError;
use crate::stream;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Create the cut batches in the store, in order, one at a time; cut the batch on the timer;
/// take scheduled points and bases.
pub(super) fn ship_loop(shared: &Shared, next: u64) {
    let mut local = Local {
        pool: shared.status.lock().unwrap().pool,
        next,
        open_base: None,
        waiting: Vec::new(),
        since_base: 0,
        rebasing: false,
        last_point: (shared.config.clock.now(), next - 1),
    };
    loop {
        schedule(shared, &mut local);
        let item = {
            let mut q = shared.queue.lock().unwrap();
            loop {
                if !q.immediate.is_empty() {
                    break Some(Err(std::mem::take(&mut q.immediate)));
                }
                if let Some(front) = q.bodies.front() {
                    break Some(Ok((front.id, Arc::clone(&front.body))));
                }
                if shared.stop.load(Ordering::Acquire) || shared.off.load(Ordering::Acquire) {
                    break None;
                }
                let (g, timeout) = shared
                    .wake
                    .wait_timeout(q, shared.config.cut_interval)
                    .unwrap();
                q = g;
                if timeout.timed_out() {
                    drop(q);
                    let due = {
                        let b = shared.batch.lock().unwrap();
                        let now = shared.config.clock.now();
                        b.since.is_some_and(|t| {
                            now.saturating_duration_since(t) >= shared.config.cut_interval
                        })
                    };
                    if due {
                        shared.cut();
                    }
                    schedule(shared, &mut local);
                    q = shared.queue.lock().unwrap();
                }
            }
        };
        let (id, body) = match item {
            None => return,
            // Marks due at the newest object already in the store.
            Some(Err(marks)) => {
                let newest = local.next - 1;
                if !shipped(shared, &mut local, newest, marks) {
                    return;
                }
                continue;
            }
            Some(Ok(item)) => item,
        };
        let n = local.next;
        let name = ObjectName::new(Kind::Stream, n).to_string();
        // The table first, so that a restore reads what an object holds with one range read
        // and fetches payloads as they are needed (hydration on demand).
        let bytes = match stream::index(&body) {
            Ok((indexed, table_len)) => {
                object::encode_indexed(Kind::Stream, local.pool, 0, n, &indexed, table_len)
            }
            Err(e) => {
                // Only this crate's encoder fills batches: a bug, shipped as it is rather
                // than lost.
                tracing::error!(
                    "stream object {n}: cannot index its body ({e}); shipped interleaved"
                );
                object::encode(Kind::Stream, local.pool, 0, n, &body)
            }
        };
        let errors = match create_counting(shared, &name, &bytes) {
            None => return,
            Some((false, _)) => return fenced(shared, &name),
            Some((true, errors)) => errors,
        };
        local.next += 1;
        local.since_base += body.len() as u64;
        {
            let mut s = shared.status.lock().unwrap();
            s.shipped_through = n;
            s.objects += 1;
            s.bytes += body.len() as u64;
            s.last_error = None;
        }
        {
            let mut c = shared.catalog.lock().unwrap();
            match c.stream.last_mut() {
                Some(r) if r.end == n => r.end = n + 1,
                _ => c.stream.push(n..n + 1),
            }
        }
        // Off the queue with its marks in one step (see `Queue::busy`).
        let marks = {
            let mut q = shared.queue.lock().unwrap();
            if q.bodies.front().is_some_and(|f| f.id == id) {
                let done = q.bodies.pop_front().expect("the front");
                q.bytes -= done.body.len() as u64;
                q.busy = true;
                done.marks
            } else {
                Vec::new()
            }
        };
        // After the store failed for a while, make sure it still holds what it held: a bucket
        // deleted or emptied meanwhile leaves a copy no restore can use.
        if errors > 0 && n > 1 && lost(shared, n - 1) {
            let why = format!(
                "{} no longer holds {}: the bucket was deleted or emptied; copying the whole array again",
                shared.store.describe(),
                ObjectName::new(Kind::Stream, n - 1)
            );
            forget_catalog(shared, n);
            local.open_base = None;
            local.rebasing = false;
            let mut b = shared.batch.lock().unwrap();
            shared.start_over_locked(&mut b, why, marks);
            drop(b);
            shared.queue.lock().unwrap().busy = false;
            continue;
        }
        let going = shipped(shared, &mut local, n, marks);
        shared.queue.lock().unwrap().busy = false;
        shared.wake.notify_all();
        if !going {
            return;
        }
    }
}

/// Whether the store lost stream object `n`, which it held (a failed read is not a loss).
pub(super) fn lost(shared: &Shared, n: u64) -> bool {
    let held = shared
        .catalog
        .lock()
        .unwrap()
        .stream
        .iter()
        .any(|r| r.contains(&n));
    let name = ObjectName::new(Kind::Stream, n).to_string();
    held && matches!(
        shared
            .store
            .get_range(&name, 0..object::HEADER_BYTES as u64),
        Err(StoreError::NotFound { .. })
    )
}

/// The store lost the copy: nothing it held counts any more but object `n`, just created.
pub(super) fn forget_catalog(shared: &Shared, n: u64) {
    let mut c = shared.catalog.lock().unwrap();
    c.stream = catalog::ranges(vec![n]);
    c.bases.clear();
    c.points.clear();
    drop(c);
    shared.status.lock().unwrap().newest_point = None;
}
