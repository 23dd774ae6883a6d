//! Deterministic simulation (issue 41, RFC 0005 step 17; TigerBeetle's VOPR and SlateDB's DST
//! are the models): one seed decides everything, the engine runs on the calling thread against
//! a storage that fails, delays and loses power, and a model says what every block may read.
//! A failure names its seed; the same seed replays the same run.
//!
//! - [`disk`]: the storage, a [`sliver_engine::MemBackend`] behind seeded faults;
//! - [`model`]: what each block of each volume may read;
//! - [`run`]: the driver, one seeded run;
//! - [`store`]: the object store, a [`store::MemStore`] behind seeded faults;
//! - [`ship`]: shipping and restore through that store.

pub mod disk;
pub mod model;
pub mod run;
pub mod ship;
pub mod store;

pub use run::{run, Outcome};
pub use ship::{run_shipping, ShipOutcome};
