//! The simulated object store: a [`MemStore`] behind seeded faults. A request fails before it
//! reaches the store, or its answer is lost after the store applied it (a create or delete
//! that happened although the caller saw an error); the connection is lost for a stretch of
//! the run's simulated time; and each request waits a seeded number of scheduler yields, so
//! that concurrent callers (a restore's fetches) see their answers complete in another order.
//!
//! Which request fails is decided by the seed and the request itself (its operation, name,
//! range, and how often the same request was made before), never by the order in which
//! threads make them: a restore's fetchers meet the same faults whatever their interleaving.
//! Conditional creates keep their meaning: a create the store applied answers `false` when
//! sent again.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sliver_clock::{Clock, ManualClock};
use sliver_replica::store::{ObjectStore, StoreError};
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use sliver_replica::store::MemStore;

/// How often each store fault is injected, per request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StoreRates {
    /// A request fails before the store sees it.
    pub fail: f64,
    /// A create, put or delete is applied and its answer lost.
    pub lost_answer: f64,
    /// Most scheduler yields a request waits before it is answered.
    pub delay_yields: u32,
}

impl StoreRates {
    pub const NONE: StoreRates = StoreRates {
        fail: 0.0,
        lost_answer: 0.0,
        delay_yields: 0,
    };

    pub fn draw(rng: &mut StdRng) -> StoreRates {
        StoreRates {
            fail: [0.0, 0.02, 0.1][rng.gen_range(0..3)],
            lost_answer: [0.0, 0.05][rng.gen_range(0..2)],
            delay_yields: [0, 20][rng.gen_range(0..2)],
        }
    }
}

/// The store the simulation's shipper and restores use.
pub struct FaultyStore {
    inner: Arc<MemStore>,
    seed: u64,
    rates: Mutex<StoreRates>,
    /// Times each request (by its identity) was made so far.
    seen: Mutex<HashMap<u64, u32>>,
    clock: Arc<ManualClock>,
    /// The connection is lost until this time on `clock`.
    down_until: Mutex<Option<Instant>>,
    injected: AtomicU64,
}

impl FaultyStore {
    pub fn new(inner: Arc<MemStore>, seed: u64, clock: Arc<ManualClock>) -> Self {
        FaultyStore {
            inner,
            seed,
            rates: Mutex::new(StoreRates::NONE),
            seen: Mutex::new(HashMap::new()),
            clock,
            down_until: Mutex::new(None),
            injected: AtomicU64::new(0),
        }
    }

    pub fn set_rates(&self, rates: StoreRates) {
        *self.rates.lock().unwrap() = rates;
    }

    /// Lose the connection for `stretch` of simulated time from now.
    pub fn lose_connection(&self, stretch: Duration) {
        *self.down_until.lock().unwrap() = Some(self.clock.now() + stretch);
    }

    /// Faults injected so far (requests refused while the connection was lost included).
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    /// The randomness of one request, from the seed and the request's identity.
    fn draw(&self, op: &str, name: &str, extra: (u64, u64)) -> StdRng {
        let mut h = DefaultHasher::new();
        (op, name, extra).hash(&mut h);
        let id = h.finish();
        let n = {
            let mut seen = self.seen.lock().unwrap();
            let n = seen.entry(id).or_insert(0);
            *n += 1;
            *n
        };
        let mut h = DefaultHasher::new();
        (self.seed, id, n).hash(&mut h);
        StdRng::seed_from_u64(h.finish())
    }

    fn failed(&self, op: &'static str, name: &str, reason: &str) -> StoreError {
        self.injected.fetch_add(1, Ordering::Relaxed);
        StoreError::Failed {
            store: self.describe(),
            op,
            name: name.to_string(),
            reason: format!("simulated: {reason}"),
        }
    }

    /// Run `call` as request `op` on `name`: delayed, refused, or answered (and, for a change,
    /// its answer lost after it was applied).
    fn request<T>(
        &self,
        op: &'static str,
        name: &str,
        extra: (u64, u64),
        changes: bool,
        call: impl FnOnce(&MemStore) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let rates = *self.rates.lock().unwrap();
        let mut rng = self.draw(op, name, extra);
        for _ in 0..rng.gen_range(0..=rates.delay_yields) {
            std::thread::yield_now();
        }
        if self
            .down_until
            .lock()
            .unwrap()
            .is_some_and(|t| self.clock.now() < t)
        {
            return Err(self.failed(op, name, "connection lost"));
        }
        if rates.fail > 0.0 && rng.gen_bool(rates.fail) {
            return Err(self.failed(op, name, "request failed"));
        }
        let answer = call(&self.inner)?;
        if changes && rates.lost_answer > 0.0 && rng.gen_bool(rates.lost_answer) {
            return Err(self.failed(op, name, "answer lost"));
        }
        Ok(answer)
    }
}

impl ObjectStore for FaultyStore {
    fn put_if_absent(&self, name: &str, bytes: Vec<u8>) -> Result<bool, StoreError> {
        self.request("put_if_absent", name, (0, 0), true, |s| {
            s.put_if_absent(name, bytes)
        })
    }
    fn put(&self, name: &str, bytes: Vec<u8>) -> Result<(), StoreError> {
        self.request("put", name, (0, 0), true, |s| s.put(name, bytes))
    }
    fn get(&self, name: &str) -> Result<Vec<u8>, StoreError> {
        self.request("get", name, (0, 0), false, |s| s.get(name))
    }
    fn get_range(&self, name: &str, range: Range<u64>) -> Result<Vec<u8>, StoreError> {
        let extra = (range.start, range.end);
        self.request("get_range", name, extra, false, |s| {
            s.get_range(name, range)
        })
    }
    fn list(&self, folder: &str) -> Result<Vec<String>, StoreError> {
        self.request("list", folder, (0, 0), false, |s| s.list(folder))
    }
    fn delete(&self, name: &str) -> Result<(), StoreError> {
        self.request("delete", name, (0, 0), true, |s| s.delete(name))
    }
    fn describe(&self) -> String {
        "simulated store".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_create_whose_answer_was_lost_exists_and_a_second_one_says_so() {
        let clock = Arc::new(ManualClock::new());
        let store = FaultyStore::new(Arc::default(), 1, clock.clone());
        store.set_rates(StoreRates {
            lost_answer: 1.0,
            ..StoreRates::NONE
        });
        assert!(store.put_if_absent("stream/1", vec![1]).is_err());
        store.set_rates(StoreRates::NONE);
        assert!(!store.put_if_absent("stream/1", vec![2]).unwrap());
        assert_eq!(store.get("stream/1").unwrap(), vec![1]);
        store.lose_connection(Duration::from_secs(5));
        assert!(store.get("stream/1").is_err());
        clock.advance(Duration::from_secs(5));
        assert_eq!(store.get("stream/1").unwrap(), vec![1]);
        assert_eq!(store.injected(), 2);
    }

    #[test]
    fn faults_follow_the_request_not_the_order_of_requests() {
        let faults = |names: &[&str]| {
            let store = FaultyStore::new(Arc::default(), 9, Arc::new(ManualClock::new()));
            store.set_rates(StoreRates {
                fail: 0.5,
                ..StoreRates::NONE
            });
            let mut failed: Vec<String> = names
                .iter()
                .filter(|n| {
                    store
                        .get(n)
                        .is_err_and(|e| e.to_string().contains("simulated"))
                })
                .map(|n| n.to_string())
                .collect();
            failed.sort();
            failed
        };
        let names = ["a", "b", "c", "d", "e", "f", "g", "h"];
        let mut reversed = names;
        reversed.reverse();
        assert_eq!(faults(&names), faults(&reversed));
        assert!(!faults(&names).is_empty());
    }
}
