//! Deadlines from configured durations, which may be of any size.

use std::time::{Duration, Instant};

/// The furthest ahead a deadline is set: thirty years (a configured
/// `Duration` may be of any size, and an instant that far ahead overflows).
const FAR: Duration = Duration::from_secs(30 * 365 * 86_400);

/// The instant `d` from now, or thirty years from now if that is sooner.
pub(crate) fn after(d: Duration) -> Instant {
    Instant::now() + d.min(FAR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_duration_gives_a_deadline() {
        assert!(after(Duration::MAX) > Instant::now());
        assert!(after(Duration::ZERO) <= Instant::now());
    }
}
