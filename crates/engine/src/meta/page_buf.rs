//! Page buffers carved from blocks of their own, so the page cache cannot fragment the heap.
//!
//! Why not `Arc<[u8; 4096]>` from the global allocator: the cache allocates and frees pages
//! all the time (faults, evictions, copies of pages a checkpoint holds), and every other
//! allocation of the engine shares the heap with them. Small allocations settle in the holes
//! evicted pages leave, so the next pages extend the heap instead of reusing the holes.
//! Measured with `bench/scale` (`scale fill --to 64G --metadata-cache 512M`): 115,000 resident
//! pages (450 MiB) held 754 MiB of RSS with the pages in the heap and 524 MiB with the pages
//! in blocks of their own; glibc's `MALLOC_ARENA_MAX=1` (652 MiB), a fixed mmap threshold
//! (754 MiB) and mimalloc (681 MiB) did not close the gap (RFC 0001, "RAM").
//!
//! A [`PagePool`] hands out [`PageBuf`]s: reference-counted 4 KiB buffers (like an `Arc`)
//! living in 1 MiB blocks that hold nothing else. A buffer whose last handle drops returns to
//! its pool's free list and is the next one handed out. Blocks are zeroed by the allocator
//! (`calloc`: fresh pages cost no RSS until used) and are kept until the pool and every buffer
//! taken from it are gone, so the pool's footprint is the most pages the cache has held at
//! once: its capacity plus the pages a checkpoint holds beside their changed copies.

use super::page_store::{PageBody, PAGE_BYTES};
use std::alloc::{alloc_zeroed, dealloc, handle_alloc_error, Layout};
use std::ops::Deref;
use std::ptr::{addr_of, addr_of_mut, NonNull};
use std::sync::atomic::{fence, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Buffers per block: 1 MiB of page bodies.
const SLOTS_PER_BLOCK: usize = 256;

/// One buffer and what it needs to find its way back. An all-zero `Slot` is a valid free slot
/// (no handles, no pool, a zero page), which is what `alloc_zeroed` makes.
#[repr(C)]
struct Slot {
    /// Handles to this buffer; 0 while it is free.
    refs: AtomicUsize,
    /// While handed out: a strong count of the pool it returns to (`Arc::into_raw`), so a
    /// buffer that outlives every [`PagePool`] handle keeps the blocks alive.
    pool: *const PoolInner,
    body: PageBody,
}

struct Blocks {
    /// Free slots, the most recently freed last (its bytes are the likeliest to be cached).
    free: Vec<NonNull<Slot>>,
    /// The first slot of every block, for freeing them.
    blocks: Vec<NonNull<Slot>>,
}

struct PoolInner {
    blocks: Mutex<Blocks>,
}

// SAFETY: the raw pointers in `Blocks` are only used under the mutex; the slots they name are
// owned by the pool (free) or by the `PageBuf`s handed out, which synchronise as below.
unsafe impl Send for PoolInner {}
unsafe impl Sync for PoolInner {}

fn block_layout() -> Layout {
    Layout::array::<Slot>(SLOTS_PER_BLOCK).expect("a block's layout fits")
}

impl PoolInner {
    fn take(&self) -> NonNull<Slot> {
        let mut b = self.blocks.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = b.free.pop() {
            return slot;
        }
        let layout = block_layout();
        // SAFETY: the layout has a non-zero size; zero bytes are a valid `Slot`.
        let first = unsafe { alloc_zeroed(layout) } as *mut Slot;
        let Some(first) = NonNull::new(first) else {
            handle_alloc_error(layout)
        };
        b.blocks.push(first);
        // Hand out the first slot; the rest go to the free list, lowest address last so the
        // block fills from its start.
        for k in (1..SLOTS_PER_BLOCK).rev() {
            // SAFETY: k is within the block just allocated.
            b.free.push(unsafe { first.add(k) });
        }
        first
    }

    fn give_back(&self, slot: NonNull<Slot>) {
        let mut b = self.blocks.lock().unwrap_or_else(|e| e.into_inner());
        b.free.push(slot);
    }
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        let b = self.blocks.get_mut().unwrap_or_else(|e| e.into_inner());
        debug_assert_eq!(
            b.free.len(),
            b.blocks.len() * SLOTS_PER_BLOCK,
            "a pool is dropped only when no buffer is out"
        );
        for block in b.blocks.drain(..) {
            // SAFETY: allocated in `take` with this layout; no buffer of it is out (each
            // holds a strong count of the pool).
            unsafe { dealloc(block.as_ptr() as *mut u8, block_layout()) };
        }
    }
}

/// Where page buffers come from (one per [`super::pager::Pager`]). Cloning shares the pool.
#[derive(Clone)]
pub struct PagePool(Arc<PoolInner>);

/// What a pool holds, for tests and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// Buffers the pool's blocks hold, handed out or free.
    pub buffers: usize,
    pub free: usize,
}

impl Default for PagePool {
    fn default() -> Self {
        Self::new()
    }
}

impl PagePool {
    pub fn new() -> Self {
        PagePool(Arc::new(PoolInner {
            blocks: Mutex::new(Blocks {
                free: Vec::new(),
                blocks: Vec::new(),
            }),
        }))
    }

    /// A buffer holding whatever its last user left in it: the caller overwrites it.
    pub fn take(&self) -> PageBuf {
        let slot = self.0.take();
        let pool = Arc::into_raw(self.0.clone());
        // SAFETY: a free slot has no handles, so nothing else reads or writes it.
        unsafe {
            (*addr_of!((*slot.as_ptr()).refs)).store(1, Ordering::Relaxed);
            addr_of_mut!((*slot.as_ptr()).pool).write(pool);
        }
        PageBuf { slot }
    }

    /// A buffer of zeros.
    pub fn zeroed(&self) -> PageBuf {
        let mut buf = self.take();
        PageBuf::get_mut(&mut buf)
            .expect("a buffer just taken is ours")
            .fill(0);
        buf
    }

    /// A buffer holding a copy of `body`.
    pub fn copy_of(&self, body: &PageBody) -> PageBuf {
        let mut buf = self.take();
        PageBuf::get_mut(&mut buf)
            .expect("a buffer just taken is ours")
            .copy_from_slice(body);
        buf
    }

    pub fn stats(&self) -> PoolStats {
        let b = self.0.blocks.lock().unwrap_or_else(|e| e.into_inner());
        PoolStats {
            buffers: b.blocks.len() * SLOTS_PER_BLOCK,
            free: b.free.len(),
        }
    }
}

/// A shared, read-only page buffer; writable through [`PageBuf::get_mut`] while it is the
/// only handle (the cache changes a page in place unless a checkpoint holds it).
pub struct PageBuf {
    slot: NonNull<Slot>,
}

// SAFETY: like `Arc<[u8; 4096]>`: the body is plain bytes, written only through the one
// handle (`get_mut`), and the count is atomic.
unsafe impl Send for PageBuf {}
unsafe impl Sync for PageBuf {}

impl PageBuf {
    fn refs(&self) -> &AtomicUsize {
        // SAFETY: the slot is alive while a handle exists; only the count is borrowed.
        unsafe { &*addr_of!((*self.slot.as_ptr()).refs) }
    }

    /// The body to change, if no other handle shares it.
    pub fn get_mut(this: &mut Self) -> Option<&mut PageBody> {
        // Acquire: see every write of handles dropped before the count fell to one.
        if this.refs().load(Ordering::Acquire) == 1 {
            // SAFETY: ours is the only handle and we hold it mutably.
            Some(unsafe { &mut *addr_of_mut!((*this.slot.as_ptr()).body) })
        } else {
            None
        }
    }
}

impl Deref for PageBuf {
    type Target = PageBody;
    fn deref(&self) -> &PageBody {
        // SAFETY: shared handles only read the body.
        unsafe { &*addr_of!((*self.slot.as_ptr()).body) }
    }
}

impl Clone for PageBuf {
    fn clone(&self) -> Self {
        // Relaxed, as `Arc`: a new handle is made from an existing one.
        let old = self.refs().fetch_add(1, Ordering::Relaxed);
        assert!(old < usize::MAX / 2, "page buffer handle count overflow");
        PageBuf { slot: self.slot }
    }
}

impl Drop for PageBuf {
    fn drop(&mut self) {
        if self.refs().fetch_sub(1, Ordering::Release) != 1 {
            return;
        }
        // The last handle: every other handle's use happened before this point.
        fence(Ordering::Acquire);
        // SAFETY: no handle remains; the pool pointer was set by `take` from `Arc::into_raw`.
        let pool = unsafe {
            let field = addr_of_mut!((*self.slot.as_ptr()).pool);
            let pool = field.read();
            field.write(std::ptr::null());
            Arc::from_raw(pool)
        };
        pool.give_back(self.slot);
    }
}

impl std::fmt::Debug for PageBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PageBuf({} bytes)", PAGE_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_is_writable_only_while_unshared_and_keeps_its_bytes() {
        let pool = PagePool::new();
        let mut a = pool.zeroed();
        PageBuf::get_mut(&mut a).unwrap()[7] = 9;
        let b = a.clone();
        assert!(PageBuf::get_mut(&mut a).is_none(), "shared: read-only");
        assert_eq!(b[7], 9);
        drop(b);
        assert_eq!(PageBuf::get_mut(&mut a).unwrap()[7], 9, "unshared again");
        let c = pool.copy_of(&a);
        assert_eq!(c[..], a[..]);
        assert_ne!(
            &*c as *const PageBody, &*a as *const PageBody,
            "a copy is another buffer"
        );
    }

    #[test]
    fn freed_buffers_are_reused_before_the_pool_grows() {
        let pool = PagePool::new();
        let held: Vec<PageBuf> = (0..SLOTS_PER_BLOCK + 1).map(|_| pool.take()).collect();
        assert_eq!(
            pool.stats(),
            PoolStats {
                buffers: 2 * SLOTS_PER_BLOCK,
                free: SLOTS_PER_BLOCK - 1
            }
        );
        let addrs: std::collections::HashSet<usize> =
            held.iter().map(|b| &**b as *const _ as usize).collect();
        assert_eq!(
            addrs.len(),
            held.len(),
            "every buffer is a buffer of its own"
        );
        drop(held);
        assert_eq!(pool.stats().free, 2 * SLOTS_PER_BLOCK);
        for _ in 0..2 {
            let again: Vec<PageBuf> = (0..2 * SLOTS_PER_BLOCK).map(|_| pool.zeroed()).collect();
            assert!(again.iter().all(|b| b.iter().all(|&x| x == 0)));
        }
        assert_eq!(pool.stats().buffers, 2 * SLOTS_PER_BLOCK, "no growth");
    }

    #[test]
    fn a_buffer_outlives_its_pool_handle_and_crosses_threads() {
        let pool = PagePool::new();
        let mut buf = pool.take();
        PageBuf::get_mut(&mut buf).unwrap().fill(5);
        let probe = pool.clone();
        drop(pool);
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let b = buf.clone();
                std::thread::spawn(move || {
                    let copies: Vec<PageBuf> = (0..1000).map(|_| b.clone()).collect();
                    copies.iter().map(|c| c[100] as u64).sum::<u64>()
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), 5000);
        }
        assert!(PageBuf::get_mut(&mut buf).is_some(), "every clone dropped");
        assert_eq!(probe.stats().free, SLOTS_PER_BLOCK - 1);
        drop(buf);
        assert_eq!(probe.stats().free, SLOTS_PER_BLOCK);
    }
}
