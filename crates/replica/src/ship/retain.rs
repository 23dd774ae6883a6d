//! Retention: what no restore point or base needs any more is deleted from the store.

use super::{CatalogState, Shared};
use crate::catalog;
use crate::object::{Kind, ObjectName};
use crate::store::StoreError;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Delete what no restore needs whenever a point or a base was added or a point deleted.
pub(super) fn retain_loop(shared: &Shared) {
    loop {
        {
            let mut c = shared.catalog.lock().unwrap();
            while !c.retain_due {
                if shared.stop.load(Ordering::Acquire) {
                    return;
                }
                c = shared
                    .retain_wake
                    .wait_timeout(c, Duration::from_millis(200))
                    .unwrap()
                    .0;
            }
            c.retain_due = false;
        }
        if shared.off.load(Ordering::Acquire) {
            return;
        }
        if let Err(e) = retain_once(shared) {
            tracing::warn!("replication retention: {e} (tried again at the next point)");
            shared.status.lock().unwrap().last_error = Some(format!("retention: {e}"));
        }
    }
}

/// One pass of retention: expired points first (so no point ever names deleted objects), then
/// the stream objects nothing needs, then index entries of bases nothing builds on.
fn retain_once(shared: &Shared) -> Result<(), StoreError> {
    // Restores in progress elsewhere (arrays restored on demand, still fetching) pin what
    // they need; expired pins (an abandoned restore) go.
    let (pins, expired) = catalog::load_pins(shared.store.as_ref(), shared.config.clock.wall_ms())?;
    for n in expired {
        let _ = shared
            .store
            .delete(&ObjectName::new(Kind::Pin, n).to_string());
    }
    let pinned: Vec<Range<u64>> = pins.iter().map(|p| p.needs()).collect();
    let plan = {
        let c = shared.catalog.lock().unwrap();
        catalog::plan(
            &c.stream,
            &c.bases,
            &c.points,
            shared.config.keep_points,
            &pinned,
        )
    };
    let mut deleted = 0u64;
    let outcome = delete_planned(shared, &plan, &mut deleted);
    if deleted > 0 {
        tracing::info!("replication retention: deleted {deleted} objects no restore needs");
    }
    shared.status.lock().unwrap().deleted_objects += deleted;
    outcome
}

/// Delete what `plan` names, in its order, each object dropped from the catalog once the
/// store has deleted it; `deleted` counts them (also when a deletion fails).
fn delete_planned(
    shared: &Shared,
    plan: &catalog::Plan,
    deleted: &mut u64,
) -> Result<(), StoreError> {
    let mut gone = |kind: Kind, n: u64, forget: &dyn Fn(&mut CatalogState)| {
        shared.store.delete(&ObjectName::new(kind, n).to_string())?;
        forget(&mut shared.catalog.lock().unwrap());
        *deleted += 1;
        Ok::<(), StoreError>(())
    };
    for &n in &plan.points {
        gone(Kind::Point, n, &|c| c.points.retain(|p| p.number != n))?;
    }
    for n in plan.stream.iter().flat_map(|r| r.clone()) {
        if shared.stop.load(Ordering::Acquire) {
            return Ok(());
        }
        gone(Kind::Stream, n, &|c| {
            let held = std::mem::take(&mut c.stream);
            c.stream = catalog::subtract(&held, std::slice::from_ref(&(n..n + 1)));
        })?;
    }
    for &start in &plan.bases {
        gone(Kind::BaseIndex, start, &|c| {
            c.bases.retain(|b| b.start != start)
        })?;
    }
    Ok(())
}
