//! A vector kept in fixed-size blocks shared copy-on-write.
//!
//! The chunk and segment tables are the bulk of the metadata (a chunk entry per 4 KiB of
//! unique data: about 100 MB per 10 GiB). A checkpoint needs a consistent copy of them while
//! hosts keep writing; copying a plain `Vec` under the metadata lock stalled every command for
//! the length of a memcpy of the whole table. Cloning a `CowVec` copies one pointer per block
//! (4,096 entries), and a block is copied only when it is first changed while a clone still
//! shares it.

use std::ops::{Index, IndexMut};
use std::sync::Arc;

/// Entries per block (a power of two, so indexing is a shift and a mask).
const BLOCK: usize = 4096;

#[derive(Clone)]
pub struct CowVec<T> {
    blocks: Vec<Arc<Vec<T>>>,
    len: usize,
}

impl<T: Clone> Default for CowVec<T> {
    fn default() -> Self {
        CowVec {
            blocks: Vec::new(),
            len: 0,
        }
    }
}

impl<T: Clone> CowVec<T> {
    /// `n` copies of `value`.
    pub fn from_elem(value: T, n: usize) -> Self {
        let mut v = CowVec::default();
        v.resize(n, value);
        v
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, i: usize) -> Option<&T> {
        if i >= self.len {
            return None;
        }
        Some(&self.blocks[i / BLOCK][i % BLOCK])
    }

    /// The entry, copying its block first if a clone shares it.
    pub fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        if i >= self.len {
            return None;
        }
        Some(&mut Arc::make_mut(&mut self.blocks[i / BLOCK])[i % BLOCK])
    }

    pub fn push(&mut self, value: T) {
        match self.blocks.last_mut() {
            Some(last) if last.len() < BLOCK => Arc::make_mut(last).push(value),
            _ => {
                let mut block = Vec::with_capacity(BLOCK);
                block.push(value);
                self.blocks.push(Arc::new(block));
            }
        }
        self.len += 1;
    }

    /// Grow with copies of `value`, or shrink, to `n` entries.
    pub fn resize(&mut self, n: usize, value: T) {
        while self.len > n {
            let last = self.blocks.last_mut().expect("len > 0 has a block");
            let remove = last.len().min(self.len - n);
            if remove == last.len() {
                self.blocks.pop();
            } else {
                let keep = last.len() - remove;
                Arc::make_mut(last).truncate(keep);
            }
            self.len -= remove;
        }
        while self.len < n {
            match self.blocks.last_mut() {
                Some(last) if last.len() < BLOCK => {
                    let add = (BLOCK - last.len()).min(n - self.len);
                    let block = Arc::make_mut(last);
                    block.resize(block.len() + add, value.clone());
                    self.len += add;
                }
                _ => {
                    let add = BLOCK.min(n - self.len);
                    let mut block = Vec::with_capacity(BLOCK);
                    block.resize(add, value.clone());
                    self.blocks.push(Arc::new(block));
                    self.len += add;
                }
            }
        }
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &T> + '_ {
        self.blocks.iter().flat_map(|b| b.iter())
    }

    /// Mutable iteration (unshares every block).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> + '_ {
        self.blocks
            .iter_mut()
            .flat_map(|b| Arc::make_mut(b).iter_mut())
    }
}

impl<T: Clone> From<Vec<T>> for CowVec<T> {
    fn from(v: Vec<T>) -> Self {
        let mut out = CowVec::default();
        for x in v {
            out.push(x);
        }
        out
    }
}

impl<T: Clone> Index<usize> for CowVec<T> {
    type Output = T;
    fn index(&self, i: usize) -> &T {
        self.get(i)
            .unwrap_or_else(|| panic!("index {i} out of range for length {}", self.len))
    }
}

impl<T: Clone> IndexMut<usize> for CowVec<T> {
    fn index_mut(&mut self, i: usize) -> &mut T {
        let len = self.len;
        self.get_mut(i)
            .unwrap_or_else(|| panic!("index {i} out of range for length {len}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Push(u32),
        Set(usize, u32),
        Resize(usize, u32),
        /// Keep a clone aside: it must not see later changes.
        Freeze,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            any::<u32>().prop_map(Op::Push),
            (0..20_000usize, any::<u32>()).prop_map(|(i, v)| Op::Set(i, v)),
            (0..20_000usize, any::<u32>()).prop_map(|(n, v)| Op::Resize(n, v)),
            Just(Op::Freeze),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Behaves like a Vec, and a clone keeps the contents it was taken with.
        #[test]
        fn matches_a_vec_and_clones_are_snapshots(ops in prop::collection::vec(op(), 1..40)) {
            let mut model: Vec<u32> = Vec::new();
            let mut v: CowVec<u32> = CowVec::default();
            let mut frozen: Vec<(CowVec<u32>, Vec<u32>)> = Vec::new();
            for op in ops {
                match op {
                    Op::Push(x) => { model.push(x); v.push(x); }
                    Op::Set(i, x) => {
                        if let Some(m) = model.get_mut(i) { *m = x; v[i] = x; }
                        else { prop_assert!(v.get_mut(i).is_none()); }
                    }
                    Op::Resize(n, x) => { model.resize(n, x); v.resize(n, x); }
                    Op::Freeze => frozen.push((v.clone(), model.clone())),
                }
                prop_assert_eq!(v.len(), model.len());
            }
            prop_assert_eq!(v.iter().copied().collect::<Vec<_>>(), model.clone());
            for (i, m) in model.iter().enumerate().step_by(97) {
                prop_assert_eq!(v[i], *m);
            }
            for (snap, then) in frozen {
                prop_assert_eq!(snap.iter().copied().collect::<Vec<_>>(), then);
            }
        }
    }

    #[test]
    fn a_clone_shares_blocks_until_one_is_changed() {
        let mut v = CowVec::from_elem(0u64, 3 * BLOCK);
        let snap = v.clone();
        v[BLOCK + 5] = 7;
        assert!(Arc::ptr_eq(&v.blocks[0], &snap.blocks[0]));
        assert!(!Arc::ptr_eq(&v.blocks[1], &snap.blocks[1]));
        assert!(Arc::ptr_eq(&v.blocks[2], &snap.blocks[2]));
        assert_eq!((v[BLOCK + 5], snap[BLOCK + 5]), (7, 0));
    }
}
