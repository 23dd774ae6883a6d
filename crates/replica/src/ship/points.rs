//! Restore points and scheduled bases: asked for, scheduled, and taken once the objects
//! they need are in the store.

use super::create::{create_retrying, fenced};
use super::{Local, Mark, PointRequest, Shared};
use crate::catalog::{self, BaseEntry, Point};
use crate::object::{self, Kind, ObjectName};
use std::sync::atomic::Ordering;

/// Ask for a scheduled point when one is due, and begin a scheduled base when the stream since
/// the newest base has grown past the bound.
pub(super) fn schedule(shared: &Shared, local: &mut Local) {
    if shared.off.load(Ordering::Acquire) || shared.stop.load(Ordering::Acquire) {
        return;
    }
    let every = shared.config.points_every;
    let newest = local.next - 1;
    let now = shared.config.clock.now();
    let since = now.saturating_duration_since(local.last_point.0);
    if !every.is_zero() && since >= every && newest > local.last_point.1 {
        local.last_point = (now, newest);
        shared.request_point(PointRequest {
            name: None,
            time_ms: shared.config.clock.wall_ms(),
            reply: None,
        });
    }
    let newest_base = {
        let c = shared.catalog.lock().unwrap();
        catalog::newest_base(&c.bases).copied()
    };
    if let Some(base) = newest_base {
        let bound = (base.bytes as f64 * shared.config.rebase_ratio)
            .max(shared.config.rebase_min_bytes as f64);
        if !local.rebasing
            && !shared.restarting.load(Ordering::Acquire)
            && local.since_base as f64 >= bound
        {
            tracing::info!(
                "replication: {} bytes shipped since the newest base; copying the whole array again so that older objects can go",
                local.since_base
            );
            local.rebasing = true;
            let mut b = shared.batch.lock().unwrap();
            shared.begin_base_locked(&mut b, true);
        }
    }
}

/// Object `n` (holding the batch the marks came with) is in the store: record bases, take
/// points. Returns false when the shipper must end (fenced or stopped).
pub(super) fn shipped(shared: &Shared, local: &mut Local, n: u64, marks: Vec<Mark>) -> bool {
    for mark in marks {
        match mark {
            Mark::BaseStart {
                record,
                generation,
                continues,
            } => {
                local.open_base = Some((n, record, generation, continues));
                local.since_base = 0;
            }
            Mark::BaseEnd { generation, bytes } => {
                let Some((start, record, g, continues)) = local.open_base else {
                    continue;
                };
                if g != generation {
                    continue;
                }
                local.open_base = None;
                let entry = BaseEntry {
                    start,
                    record,
                    end: n,
                    continues,
                    bytes,
                };
                let name = ObjectName::new(Kind::BaseIndex, start).to_string();
                let obj = object::encode(Kind::BaseIndex, local.pool, 0, start, &entry.encode());
                match create_retrying(shared, &name, &obj) {
                    None => return false,
                    Some(false) => {
                        fenced(shared, &name);
                        return false;
                    }
                    Some(true) => {}
                }
                // Only the newest generation's end clears a restart: an older base's end
                // (one a restart replaced) never reaches here, its mark being dropped.
                if generation == shared.generation.load(Ordering::Acquire) {
                    shared.restarting.store(false, Ordering::Release);
                }
                local.rebasing = false;
                {
                    let mut c = shared.catalog.lock().unwrap();
                    c.bases.push(entry);
                    c.retain_due = true;
                }
                shared.retain_wake.notify_all();
                for req in std::mem::take(&mut local.waiting) {
                    if !take_point(shared, local, n, req) {
                        return false;
                    }
                }
            }
            Mark::Point(req) => {
                let has_base = !shared.catalog.lock().unwrap().bases.is_empty();
                if shared.restarting.load(Ordering::Acquire) || !has_base || n == 0 {
                    local.waiting.push(req);
                } else if !take_point(shared, local, n, req) {
                    return false;
                }
            }
        }
    }
    true
}

/// Create the point `req` through object `n`, on the newest complete base.
pub(super) fn take_point(shared: &Shared, local: &mut Local, n: u64, req: PointRequest) -> bool {
    let (number, base) = {
        let mut c = shared.catalog.lock().unwrap();
        let Some(base) = catalog::newest_base(&c.bases).copied() else {
            drop(c);
            req.answer(Err(
                "no complete copy of the array is in the store yet".into()
            ));
            return true;
        };
        if let Some(name) = &req.name {
            if c.points.iter().any(|p| &p.name == name) {
                drop(c);
                let msg = format!("a restore point named {name:?} exists");
                req.answer(Err(msg));
                return true;
            }
        }
        let number = c.next_point;
        c.next_point += 1;
        (number, base)
    };
    let name = match &req.name {
        Some(n) => n.clone(),
        None => {
            // Two scheduled points in one second (a short schedule) get their numbers too.
            let n = catalog::scheduled_name(req.time_ms);
            let taken = shared
                .catalog
                .lock()
                .unwrap()
                .points
                .iter()
                .any(|p| p.name == n);
            if taken {
                format!("{n}-{number}")
            } else {
                n
            }
        }
    };
    let point = Point {
        number,
        name,
        scheduled: req.name.is_none(),
        time_ms: req.time_ms,
        through: n,
        base: base.start,
        base_record: base.record,
    };
    let name = ObjectName::new(Kind::Point, number).to_string();
    let obj = object::encode(Kind::Point, local.pool, 0, number, &point.encode());
    match create_retrying(shared, &name, &obj) {
        None => {
            req.answer(Err("the array is stopping".into()));
            return false;
        }
        Some(false) => {
            req.answer(Err("another writer took the point's number".into()));
            fenced(shared, &name);
            return false;
        }
        Some(true) => {}
    }
    tracing::info!(
        "replication: restore point {} through object {n}",
        point.name
    );
    {
        let mut c = shared.catalog.lock().unwrap();
        c.points.push(point.clone());
        c.retain_due |= point.scheduled;
    }
    shared.retain_wake.notify_all();
    shared.status.lock().unwrap().newest_point = Some(point.clone());
    req.answer(Ok(point));
    true
}

impl Shared {
    /// Ask for a point covering every write completed before now: marked in the batch and cut,
    /// or, with nothing waiting, due at the newest object in the store.
    pub(super) fn request_point(&self, req: PointRequest) {
        let mut b = self.batch.lock().unwrap();
        if !b.body.is_empty() {
            b.marks.push(Mark::Point(req));
            self.cut_locked(&mut b);
            return;
        }
        let mut q = self.queue.lock().unwrap();
        match q.bodies.back_mut() {
            Some(last) => last.marks.push(Mark::Point(req)),
            None => q.immediate.push(Mark::Point(req)),
        }
        self.wake.notify_all();
    }
}
