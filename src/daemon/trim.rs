//! Memory a burst of work freed, given back to the system (Linux with glibc only): the
//! `memory-trim` task.

use std::time::Duration;

use crate::util::task::Task;

/// How often [`GiveBackMemory`] looks at glibc's free memory.
const TRIM_EVERY: Duration = Duration::from_secs(10);

/// How much free memory glibc may gain since the last trim before the next one.
const TRIM_ABOVE: usize = 2 << 20;

/// Gives the memory a burst freed back to the system, within [`TRIM_EVERY`] of it.
///
/// glibc keeps freed memory in its arenas (one per worker thread that allocated under
/// contention) and returns to the system only the free top of each: after a burst of 10,000
/// concurrent Allocates over 200 connections, 60 MiB stayed resident though free
/// (BENCHMARKS.md, issue 42). `malloc_trim` returns every free page of every arena. It runs
/// only when the free memory grew by [`TRIM_ABOVE`] since the last trim, so an idle daemon
/// never trims; `mallinfo2`, the look, walks the arenas' bins, not their chunks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GiveBackMemory;

impl Task for GiveBackMemory {
    async fn run(self) {
        let mut tick = tokio::time::interval(TRIM_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Free bytes held after the last trim (or the least seen since).
        let mut kept = usize::MAX;
        loop {
            tick.tick().await;
            // SAFETY: takes no arguments; glibc locks each arena while it reads it.
            let free = unsafe { libc::mallinfo2() }.fordblks;
            if free > kept.saturating_add(TRIM_ABOVE) {
                // SAFETY: takes a size only; glibc locks each arena while it trims it.
                unsafe { libc::malloc_trim(0) };
                // SAFETY: as above.
                kept = unsafe { libc::mallinfo2() }.fordblks;
            } else {
                kept = kept.min(free);
            }
        }
    }
}
