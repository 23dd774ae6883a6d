//! The changeable mode parameters one LU holds. MODE SELECT (the parent module) changes
//! them; the LU and the command families read them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Where the mode parameters an initiator saves (MODE SELECT with SP=1) are kept, so they
/// apply again after a restart: the array's record of the volume. Only the caching page is
/// saveable; its WCE is the volume's write cache setting (write-back or write-through).
pub trait SavedModePages: Send + Sync {
    /// Keep `write_cache` as the saved WCE. An error leaves the parameters as they were.
    fn save_write_cache(&self, write_cache: bool) -> Result<(), String>;
}

/// The changeable mode parameters of a logical unit.
pub(crate) struct ModeParams {
    /// WCE now.
    pub(super) write_cache: AtomicBool,
    /// WCE as saved: what the volume starts with.
    pub(super) saved_write_cache: AtomicBool,
    /// Where saved pages go; `None`: nothing is saveable (SP=1 and saved values refused).
    pub(super) saved: Option<Arc<dyn SavedModePages>>,
    pub(super) descriptor_sense: AtomicBool,
    pub(super) write_protect: AtomicBool,
    /// Serializes MODE SELECT so a parameter list is applied all at once.
    pub(super) select: Mutex<()>,
}

impl Default for ModeParams {
    fn default() -> Self {
        ModeParams {
            write_cache: AtomicBool::new(true),
            saved_write_cache: AtomicBool::new(true),
            saved: None,
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

    /// WCE as saved (the value the LU starts with).
    pub fn saved_write_cache(&self) -> bool {
        self.saved_write_cache.load(Ordering::Relaxed)
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
