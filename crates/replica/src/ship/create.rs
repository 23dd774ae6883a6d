//! Creating an object in the store: put-if-absent, retried with backoff while the store
//! errs; a writer that finds its object taken by another is fenced.

use super::{Shared, ShipState};
use crate::store::StoreError;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Create `name` with `bytes` unless it exists, retrying store errors with backoff until it
/// answers or the shipper stops (`None`). `Some(false)`: another writer created it first.
pub(super) fn create_retrying(shared: &Shared, name: &str, bytes: &[u8]) -> Option<bool> {
    create_counting(shared, name, bytes).map(|(created, _)| created)
}

/// [`create_retrying`], with the number of store errors retried.
pub(super) fn create_counting(shared: &Shared, name: &str, bytes: &[u8]) -> Option<(bool, u32)> {
    let mut delay = Duration::from_millis(100);
    let mut errors = 0;
    loop {
        let failed = match shared.store.put_if_absent(name, bytes.to_vec()) {
            Ok(true) => return Some((true, errors)),
            // A create whose answer was lost and that the client sent again: ours if the
            // object holds exactly these bytes.
            Ok(false) => match shared.store.get(name) {
                Ok(held) => return Some((held == bytes, errors)),
                // Gone again (deleted meanwhile): create it again.
                Err(StoreError::NotFound { .. }) => continue,
                // Only a read that answers can say another writer made it.
                Err(e) => e,
            },
            Err(e) => e,
        };
        errors += 1;
        shared.status.lock().unwrap().last_error = Some(failed.to_string());
        if shared.stop.load(Ordering::Acquire) {
            return None;
        }
        std::thread::sleep(delay);
        delay = (delay * 2).min(Duration::from_secs(30));
    }
}

pub(super) fn fenced(shared: &Shared, name: &str) {
    let why = format!(
        "{name} in {} was created by another writer: this array no longer ships there",
        shared.store.describe()
    );
    tracing::error!("replication fenced: {why}");
    shared.off.store(true, Ordering::Release);
    shared.status.lock().unwrap().state = ShipState::Fenced(why);
}
