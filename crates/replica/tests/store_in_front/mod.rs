//! A store in front of another that changes some of its calls: how the replica tests make a
//! store misbehave (down, slow, ignoring conditions) without writing out every call.

use sliver_replica::store::{ObjectStore, StoreError};
use std::ops::{Deref, Range};

/// What a conditional create answers: whether it created the object.
pub type Created = Result<bool, StoreError>;

/// What a store in front of another does differently; by default, nothing.
pub trait Change: Send + Sync {
    /// Runs before every call but `describe`: an error fails the call, which is not passed on.
    fn before(&self) -> Result<(), StoreError> {
        Ok(())
    }
    /// A conditional create (after [`Change::before`]).
    fn put_if_absent(&self, store: &dyn ObjectStore, name: &str, bytes: Vec<u8>) -> Created {
        store.put_if_absent(name, bytes)
    }
    fn describe(&self, store: &dyn ObjectStore) -> String {
        store.describe()
    }
}

/// The store behind `inner` with `change` in front of it.
pub struct InFront<C, S> {
    pub change: C,
    pub inner: S,
}

impl<C, S> ObjectStore for InFront<C, S>
where
    C: Change,
    S: Deref + Send + Sync,
    S::Target: ObjectStore + Sized,
{
    fn put_if_absent(&self, name: &str, bytes: Vec<u8>) -> Result<bool, StoreError> {
        self.change.before()?;
        self.change.put_if_absent(&*self.inner, name, bytes)
    }
    fn put(&self, name: &str, bytes: Vec<u8>) -> Result<(), StoreError> {
        self.change.before()?;
        self.inner.put(name, bytes)
    }
    fn get(&self, name: &str) -> Result<Vec<u8>, StoreError> {
        self.change.before()?;
        self.inner.get(name)
    }
    fn get_range(&self, name: &str, range: Range<u64>) -> Result<Vec<u8>, StoreError> {
        self.change.before()?;
        self.inner.get_range(name, range)
    }
    fn list(&self, folder: &str) -> Result<Vec<String>, StoreError> {
        self.change.before()?;
        self.inner.list(folder)
    }
    fn delete(&self, name: &str) -> Result<(), StoreError> {
        self.change.before()?;
        self.inner.delete(name)
    }
    fn describe(&self) -> String {
        self.change.describe(&*self.inner)
    }
}
