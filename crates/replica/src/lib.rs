//! Off-site copies of a pool on an S3-compatible object store (RFC 0003,
//! docs/rfcs/0003-object-store-copies.md).
//!
//! In the order a shipped byte meets them:
//! - [`object`]: the objects' names and the checksummed header every one starts with (sans-I/O);
//! - [`store`]: the narrow [`store::ObjectStore`] trait the rest of sliver uses, and its S3
//!   implementation;
//! - [`probe`]: a store is trusted only after it has shown that conditional creates fence.

pub mod object;
pub mod probe;
pub mod restore;
pub mod ship;
pub mod store;
pub mod stream;
