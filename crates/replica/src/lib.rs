//! Off-site copies of a pool on an S3-compatible object store (RFC 0003,
//! docs/rfcs/0003-object-store-copies.md).
//!
//! In the order a shipped byte meets them:
//! - [`object`]: the objects' names and the checksummed header every one starts with (sans-I/O);
//! - [`store`]: the narrow [`store::ObjectStore`] trait the rest of sliver uses, and its S3
//!   implementation;
//! - [`probe`]: a store is trusted only after it has shown that conditional creates fence;
//! - [`stream`]: the records of a `stream/<n>` object (the engine's writes, in order);
//! - [`ship`]: the backend that copies those writes and the thread that creates the objects;
//! - [`catalog`]: restore points, the index of complete bases, and what retention deletes;
//! - [`restore`]: a new array from a point or the newest state;
//! - [`hydrate`]: the restored array's backend while its data is still in the store.

pub mod catalog;
pub mod hydrate;
pub mod object;
pub mod probe;
pub mod restore;
pub mod ship;
pub mod store;
pub mod stream;
