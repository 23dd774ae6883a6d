//! The changeable mode parameters one LU holds. MODE SELECT (the parent module) changes
//! them; the LU and the command families read them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// The changeable mode parameters of a logical unit.
pub(crate) struct ModeParams {
    pub(super) write_cache: AtomicBool,
    pub(super) descriptor_sense: AtomicBool,
    pub(super) write_protect: AtomicBool,
    /// Serializes MODE SELECT so a parameter list is applied all at once.
    pub(super) select: Mutex<()>,
}

impl Default for ModeParams {
    fn default() -> Self {
        ModeParams {
            write_cache: AtomicBool::new(true),
            descriptor_sense: AtomicBool::new(false),
            write_protect: AtomicBool::new(false),
            select: Mutex::new(()),
        }
    }
}

impl ModeParams {
    /// WCE: writes may complete before they are durable.
    pub fn write_cache(&self) -> bool {
        self.write_cache.load(Ordering::Relaxed)
    }

    /// D_SENSE: report sense in descriptor format.
    pub fn descriptor_sense(&self) -> bool {
        self.descriptor_sense.load(Ordering::Relaxed)
    }

    /// SWP: the initiator asked for the medium to be write protected.
    pub fn write_protected(&self) -> bool {
        self.write_protect.load(Ordering::Relaxed)
    }
}
