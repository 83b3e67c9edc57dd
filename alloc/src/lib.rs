//! The allocator of the language bindings (the NIF and the Python
//! extension), which each declare it their global allocator:
//!
//! ```ignore
//! #[global_allocator]
//! static GLOBAL: gendurable_alloc::Allocator = gendurable_alloc::Allocator;
//! ```
//!
//! In both, Rust's memory is made on one kind of thread and freed on another
//! (a claimed row's values on the runtime's threads, dropped on a scheduler
//! or a step thread; an outcome the other way round), which glibc's arenas
//! pay for with locks and consolidation; mimalloc frees across threads
//! without a lock (docs/performance.md, "The bindings' allocator"). The
//! `gendurable` crate itself leaves the allocator to the application.

use libmimalloc_sys::mi_option_t;
use mimalloc::MiMalloc;
use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// mimalloc's `mi_option_arena_eager_commit` (`mimalloc.h`), which the
/// crate does not name.
const ARENA_EAGER_COMMIT: mi_option_t = 4;

static CONFIGURED: AtomicBool = AtomicBool::new(false);

/// mimalloc, its arenas committed as they are used: by default, on a system
/// that overcommits, it commits each 1 GiB arena when it reserves it, and a
/// worker process's resident memory grew by 30-55 MB for nothing.
pub struct Allocator;

/// Set the options before the first allocation reserves an arena. Two
/// threads racing here both store the same value.
#[inline]
fn configure() {
    if !CONFIGURED.load(Relaxed) {
        // SAFETY: sets a plain option; the value is one mimalloc documents.
        unsafe { libmimalloc_sys::mi_option_set(ARENA_EAGER_COMMIT, 0) };
        CONFIGURED.store(true, Relaxed);
    }
}

// SAFETY: every call is forwarded to mimalloc's, which upholds the contract.
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        configure();
        MiMalloc.alloc(layout)
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        configure();
        MiMalloc.alloc_zeroed(layout)
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        MiMalloc.dealloc(ptr, layout)
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        MiMalloc.realloc(ptr, layout, new_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arenas_are_committed_as_used() {
        let v = vec![1u8; 1 << 20];
        assert_eq!(v.iter().map(|&b| b as usize).sum::<usize>(), 1 << 20);
        // SAFETY: reads an option.
        let eager = unsafe { libmimalloc_sys::mi_option_get(ARENA_EAGER_COMMIT) };
        assert_eq!(eager, 0);
    }

    #[global_allocator]
    static GLOBAL: Allocator = Allocator;
}
