//! The ROD tokens one LU made and the outcomes of the token commands it received: the copy
//! manager's per-LU state for `rod`, which the LU holds and the commands (in `rod`) change.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::range_lock::lock_unpoisoned;
use crate::{Nexus, Sense, SenseReason, Status};

/// A ROD token's size.
pub const TOKEN_LEN: usize = 512;
/// Live tokens kept per LU; making one more drops the oldest not in use. Every write to
/// the LU looks at the ranges of its live point-in-time tokens, so this also bounds that.
const MAX_TOKENS: usize = 64;
/// Finished token command results kept per LU for RECEIVE ROD TOKEN INFORMATION.
const RETAINED_RESULTS: usize = 64;

/// One live token made by POPULATE TOKEN on this LU.
pub(super) struct RodToken {
    pub(super) bytes: Box<[u8; TOKEN_LEN]>,
    /// (lba, blocks) on this LU, in the order the token represents them.
    pub(super) ranges: Vec<(u64, u64)>,
    pub(super) block_size: u32,
    /// Set when a represented block changes (point-in-time tokens only).
    pub(super) revoked: Arc<AtomicBool>,
    pub(super) timeout: Duration,
    pub(super) use_state: Mutex<UseState>,
}

pub(super) struct UseState {
    /// WRITE USING TOKEN commands using it now; it does not expire meanwhile.
    pub(super) in_use: usize,
    pub(super) last_active: Instant,
    pub(super) deleted: bool,
}

impl RodToken {
    pub(super) fn blocks(&self) -> u64 {
        self.ranges.iter().map(|r| r.1).sum()
    }

    fn expired(&self, now: Instant) -> bool {
        let u = lock_unpoisoned(&self.use_state);
        u.deleted || (u.in_use == 0 && now.duration_since(u.last_active) > self.timeout)
    }
}

/// Outcome of one POPULATE TOKEN or WRITE USING TOKEN, by (I_T nexus, LIST IDENTIFIER).
#[derive(Clone)]
pub(super) struct TokenRecord {
    pub(super) initiator_port: String,
    pub(super) relative_target_port: u16,
    pub(super) list_id: u32,
    pub(super) service_action: u8,
    /// None while the command runs.
    pub(super) outcome: Option<(Status, Option<Sense>)>,
    pub(super) transfer_blocks: u64,
    pub(super) token: Option<Box<[u8; TOKEN_LEN]>>,
}

impl TokenRecord {
    fn belongs_to(&self, nexus: &Nexus) -> bool {
        self.initiator_port == nexus.initiator_port
            && self.relative_target_port == nexus.relative_target_port
    }
}

/// Tokens made from one LU, and results of token commands received by it.
#[derive(Default)]
pub(crate) struct TokenCopy {
    pub(super) tokens: Mutex<Vec<Arc<RodToken>>>,
    results: Mutex<VecDeque<TokenRecord>>,
    pub(super) next_token_id: AtomicU64,
}

impl TokenCopy {
    /// Register a command about to run. A LIST IDENTIFIER still in use by a running command
    /// of this nexus is refused with OPERATION IN PROGRESS (SPC-4): its outcome would land
    /// in the wrong record. Windows makes a new identifier per command.
    pub(super) fn record(
        &self,
        nexus: &Nexus,
        list_id: u32,
        service_action: u8,
    ) -> Result<(), SenseReason> {
        let mut results = lock_unpoisoned(&self.results);
        let same = |r: &TokenRecord| r.list_id == list_id && r.belongs_to(nexus);
        if results.iter().any(|r| same(r) && r.outcome.is_none()) {
            return Err(SenseReason::OperationInProgress);
        }
        results.retain(|r| !same(r));
        results.push_back(TokenRecord {
            initiator_port: nexus.initiator_port.clone(),
            relative_target_port: nexus.relative_target_port,
            list_id,
            service_action,
            outcome: None,
            transfer_blocks: 0,
            token: None,
        });
        while results.len() > RETAINED_RESULTS {
            let Some(oldest) = results.iter().position(|r| r.outcome.is_some()) else {
                break;
            };
            results.remove(oldest);
        }
        Ok(())
    }

    pub(super) fn finish(&self, nexus: &Nexus, list_id: u32, f: impl FnOnce(&mut TokenRecord)) {
        let mut results = lock_unpoisoned(&self.results);
        if let Some(r) = results
            .iter_mut()
            .find(|r| r.list_id == list_id && r.belongs_to(nexus))
        {
            f(r);
        }
    }

    pub(super) fn find(&self, nexus: &Nexus, list_id: u32) -> Option<TokenRecord> {
        lock_unpoisoned(&self.results)
            .iter()
            .find(|r| r.list_id == list_id && r.belongs_to(nexus))
            .cloned()
    }

    /// Keep `token`, dropping expired tokens and, when full, the oldest one not in use.
    pub(super) fn keep(&self, token: Arc<RodToken>, now: Instant) {
        let mut tokens = lock_unpoisoned(&self.tokens);
        tokens.retain(|t| !t.expired(now));
        if tokens.len() >= MAX_TOKENS {
            if let Some(oldest) = tokens
                .iter()
                .position(|t| lock_unpoisoned(&t.use_state).in_use == 0)
            {
                tokens.remove(oldest);
            }
        }
        tokens.push(token);
    }

    /// The live token with exactly these bytes at `now`, marked in use.
    pub(super) fn take(&self, bytes: &[u8], now: Instant) -> Result<Arc<RodToken>, SenseReason> {
        let mut tokens = lock_unpoisoned(&self.tokens);
        let Some(i) = tokens.iter().position(|t| t.bytes[..] == *bytes) else {
            return Err(SenseReason::TokenUnknown);
        };
        if tokens[i].expired(now) {
            tokens.remove(i);
            return Err(SenseReason::TokenExpired);
        }
        if tokens[i].revoked.load(Ordering::SeqCst) {
            tokens.remove(i);
            return Err(SenseReason::TokenRevoked);
        }
        let token = Arc::clone(&tokens[i]);
        lock_unpoisoned(&token.use_state).in_use += 1;
        Ok(token)
    }

    /// A WRITE USING TOKEN is done with `token`; DEL_TKN deletes it.
    pub(super) fn release(&self, token: &RodToken, delete: bool, now: Instant) {
        let mut u = lock_unpoisoned(&token.use_state);
        u.in_use -= 1;
        u.last_active = now;
        u.deleted |= delete;
        let gone = u.deleted || token.revoked.load(Ordering::SeqCst);
        drop(u);
        if gone {
            lock_unpoisoned(&self.tokens).retain(|t| !std::ptr::eq(t.as_ref(), token));
        }
    }

    /// The nexus is gone: its results go with it (its tokens stay usable by others).
    pub(crate) fn nexus_lost(&self, nexus: &Nexus) {
        lock_unpoisoned(&self.results).retain(|r| !r.belongs_to(nexus));
    }

    /// A reset discards the results; tokens survive it, as a host may still hold them.
    pub(crate) fn clear_results(&self) {
        lock_unpoisoned(&self.results).clear();
    }
}
