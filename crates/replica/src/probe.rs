//! A store is trusted only after it has shown that conditional creates fence (RFC 0003, "The
//! store is probed before it is trusted").
//!
//! Everything that keeps two arrays from writing one pool rests on "create if absent": the
//! manifest chain is extended by creating its next link, and a second writer's create must
//! fail. A store that ignores `If-None-Match` (older S3-compatible servers, some gateways,
//! a proxy that drops the header) lets both succeed, and the pool would fork silently. So before
//! shipping or restoring, [`probe`] has several threads create one fresh key at the same moment
//! and requires exactly one to win and the object to hold the winner's bytes.

use crate::object::{self, Kind, ObjectName};
use crate::store::{ObjectStore, StoreError};
use rand::RngCore;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// Concurrent creators of the probe key.
pub const CREATORS: usize = 16;

/// What a successful probe saw.
#[derive(Debug, Clone)]
pub struct ProbeReport {
    pub creators: usize,
    pub elapsed: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error(
        "the object store at {store} does not honour conditional writes ({winners} of {creators} \
         concurrent creates succeeded); sliver cannot fence writers on it"
    )]
    NoFence {
        store: String,
        winners: usize,
        creators: usize,
    },
    #[error(
        "the object store at {store} reported one winner of {creators} concurrent creates but \
         kept another creator's bytes; sliver cannot fence writers on it"
    )]
    WrongWinner { store: String, creators: usize },
    #[error("probing the object store: {0}")]
    Store(#[from] StoreError),
}

/// Have [`CREATORS`] threads create one random `probe/` key at once; exactly one must win.
/// The key is deleted afterwards (a leftover probe object is harmless: nothing reads it).
pub fn probe(store: Arc<dyn ObjectStore>) -> Result<ProbeReport, ProbeError> {
    let started = Instant::now();
    let number = rand::thread_rng().next_u64();
    let name = ObjectName::new(Kind::Probe, number).to_string();
    let start = Arc::new(Barrier::new(CREATORS));
    let creators: Vec<_> = (0..CREATORS)
        .map(|k| {
            let (store, start, name) = (store.clone(), start.clone(), name.clone());
            std::thread::spawn(move || {
                // Each creator's body says who it is, so the survivor can be checked.
                let body =
                    object::encode(Kind::Probe, [0; 16], 0, number, &(k as u64).to_le_bytes());
                start.wait();
                store.put_if_absent(&name, body)
            })
        })
        .collect();
    let mut winners = Vec::new();
    let mut failure = None;
    for (k, creator) in creators.into_iter().enumerate() {
        match creator.join().expect("a probe thread panicked") {
            Ok(true) => winners.push(k as u64),
            Ok(false) => {}
            Err(e) => failure = Some(e),
        }
    }
    let stored = store.get(&name);
    let _ = store.delete(&name);
    if let Some(e) = failure {
        return Err(e.into());
    }
    if winners.len() != 1 {
        return Err(ProbeError::NoFence {
            store: store.describe(),
            winners: winners.len(),
            creators: CREATORS,
        });
    }
    let stored = stored?;
    let expected = object::Expected {
        array: [0; 16],
        kind: Kind::Probe,
        number,
    };
    let kept = object::decode(&name, &stored, &expected)
        .ok()
        .map(|(_, body)| body.to_vec());
    if kept.as_deref() != Some(&winners[0].to_le_bytes()[..]) {
        return Err(ProbeError::WrongWinner {
            store: store.describe(),
            creators: CREATORS,
        });
    }
    Ok(ProbeReport {
        creators: CREATORS,
        elapsed: started.elapsed(),
    })
}
