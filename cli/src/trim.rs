//! Giving the allocator's idle memory back to the system.
//!
//! glibc keeps the pages freed after a peak (a backlog's burst of claims, a
//! large insert) in its per-thread arenas for reuse, so a node's RSS rose in
//! steps at each peak and never came down while the heap in use stayed flat
//! (benchmarks/README.md, "Soak"). The CLI's processes trim them
//! periodically; an application embedding the engine chooses its own
//! allocator and policy (docs/operations.md, "Memory").

use std::time::Duration;

/// How often the arenas are trimmed: rarely enough to cost nothing
/// measurable (a trim walks the free lists), often enough that a peak's
/// pages go back within seconds.
const EVERY: Duration = Duration::from_secs(10);

/// Trim the allocator's arenas every `EVERY` on a thread of its own, for
/// the life of the process (glibc only; nothing elsewhere).
pub(crate) fn start() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let _ = std::thread::Builder::new()
            .name("malloc-trim".into())
            .spawn(|| loop {
                std::thread::sleep(EVERY);
                // SAFETY: malloc_trim only returns free pages of the
                // allocator's own arenas to the system; it is thread-safe.
                unsafe { libc::malloc_trim(0) };
            });
    }
}
