//! The copy manager's state in one LU: what the LU holds for third-party copy. The commands
//! that change it are in `lid1`, `rod` and `receive`.

use super::results::CopyResults;
use super::tokens::TokenCopy;
use crate::Nexus;

/// The copy manager's state in one LU: results of copies it received and tokens made from it.
#[derive(Default)]
pub(crate) struct CopyManager {
    pub(super) results: CopyResults,
    pub(super) tokens: TokenCopy,
}

impl CopyManager {
    /// The nexus is gone: its results go with it (its tokens stay usable by others).
    pub(crate) fn nexus_lost(&self, nexus: &Nexus) {
        self.results.nexus_lost(nexus);
        self.tokens.nexus_lost(nexus);
    }

    /// A reset discards every result; tokens survive it, as a host may still hold them.
    pub(crate) fn reset(&self) {
        self.results.clear();
        self.tokens.clear_results();
    }
}
