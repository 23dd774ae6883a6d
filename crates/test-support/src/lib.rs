//! What the integration tests of every sliver crate share, so that each test file says what it
//! checks and not how to start a target:
//!
//! - [`target`]: an array in a temporary directory served by an in-process target on an
//!   ephemeral loopback port, stopped when dropped;
//! - [`data`]: test data that dedup and compression cannot shrink, different per seed;
//! - [`hosts`]: two hosts and their volumes, for access-control tests;
//! - [`layers`]: the cycles of a crate's module graph, for the test that keeps crates layered;
//! - [`slowdown`]: the failed-login slowdown as a client sees it;
//! - [`tidy`]: the sizes of source files and functions, for the tidy test's ratchet.
//!
//! Only integration tests (`tests/*.rs`) use it: it links the server, so a crate's own unit
//! tests would get a second copy of the crate they test.

pub mod data;
pub mod hosts;
pub mod layers;
pub mod slowdown;
pub mod target;
pub mod tidy;
