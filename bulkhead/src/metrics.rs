//! What a bulkhead shows to monitoring: its counters, and the Prometheus
//! text of a set of bulkheads.

use std::fmt::Write;
use std::sync::atomic::Ordering::Relaxed;

use super::Bulkhead;

impl Bulkhead {
    /// Counts refusals from now on, for [`saturated`](Bulkhead::saturated).
    /// Off until called: a refusal is then one load, where counting adds an
    /// atomic add to each (about 4.5 ns, more when many threads are refused at
    /// once). Registering the bulkhead with an engine for its metrics calls
    /// this. Calling it again changes nothing.
    pub fn count_saturated(&self) {
        self.core.counts.counting.store(true, Relaxed);
    }

    /// Acquires refused with [`Saturated`](crate::Saturated) since
    /// [`count_saturated`](Bulkhead::count_saturated) was first called;
    /// `None` if it never was.
    pub fn saturated(&self) -> Option<u64> {
        let c = &self.core.counts;
        c.counting.load(Relaxed).then(|| c.saturated.load(Relaxed))
    }

    /// Holders whose slot was taken back because they outlived
    /// `reclaim_after` (always counted: reclaims happen off the callers'
    /// path).
    pub fn reclaimed(&self) -> u64 {
        self.core.counts.reclaimed.load(Relaxed)
    }
}

/// The Prometheus text (format 0.0.4) of these bulkheads, each labelled with
/// its name (`name="search"`): `gendurable_bulkhead_in_flight`, `_limit` and
/// `_waiting` (gauges), `gendurable_bulkhead_reclaimed_total` and, for the
/// bulkheads that [count them](Bulkhead::count_saturated),
/// `gendurable_bulkhead_saturated_total` (counters). Each family is written
/// once, with its `HELP` and `TYPE` lines, however many bulkheads there are;
/// give each bulkhead its own name.
pub fn prometheus<'a>(bulkheads: impl IntoIterator<Item = (&'a str, &'a Bulkhead)>) -> String {
    // One reading per bulkhead, shared by every family.
    let read: Vec<_> = bulkheads
        .into_iter()
        .map(|(name, b)| {
            let counts = [
                Some(b.in_flight() as u64),
                Some(b.limit() as u64),
                Some(b.waiting() as u64),
                b.saturated(),
                Some(b.reclaimed()),
            ];
            (escape(name), counts)
        })
        .collect();
    let families = [
        ("in_flight", "gauge", "Permits held by live holders."),
        ("limit", "gauge", "How many permits may be held at once."),
        ("waiting", "gauge", "Callers waiting for a permit."),
        (
            "saturated_total",
            "counter",
            "Acquires refused because every permit was in use.",
        ),
        (
            "reclaimed_total",
            "counter",
            "Permits taken back from holders that outlived reclaim_after.",
        ),
    ];
    let mut out = String::new();
    for (i, (family, kind, help)) in families.into_iter().enumerate() {
        let _ = writeln!(out, "# HELP gendurable_bulkhead_{family} {help}");
        let _ = writeln!(out, "# TYPE gendurable_bulkhead_{family} {kind}");
        for (name, counts) in &read {
            if let Some(v) = counts[i] {
                let _ = writeln!(out, "gendurable_bulkhead_{family}{{name=\"{name}\"}} {v}");
            }
        }
    }
    out
}

/// A label value: backslash, double quote and newline escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(all(test, not(gendurable_loom)))]
mod tests {
    use super::*;
    use crate::BulkheadConfig;
    use std::time::Duration;

    #[test]
    fn refusals_are_counted_once_asked_for() {
        let b = Bulkhead::new(BulkheadConfig::new(1, Duration::from_secs(60))).unwrap();
        let _held = b.try_acquire().unwrap();
        assert!(b.try_acquire().is_err());
        assert_eq!(b.saturated(), None);
        b.count_saturated();
        assert_eq!(b.saturated(), Some(0));
        assert!(b.try_acquire().is_err());
        assert!(b.call(|| ()).is_err());
        assert_eq!(b.saturated(), Some(2));
        assert_eq!(b.reclaimed(), 0);
    }

    #[test]
    fn each_family_is_written_once() {
        let a = Bulkhead::new(BulkheadConfig::new(2, Duration::from_secs(60))).unwrap();
        let b = Bulkhead::new(BulkheadConfig::new(3, Duration::from_secs(60))).unwrap();
        b.count_saturated();
        let _held = a.try_acquire().unwrap();
        let text = prometheus([("a", &a), ("say \"b\"", &b)]);
        let lines: Vec<&str> = text.lines().collect();
        for family in [
            "in_flight",
            "limit",
            "waiting",
            "saturated_total",
            "reclaimed_total",
        ] {
            let at = |l: &&str| l.contains(&format!("gendurable_bulkhead_{family}"));
            let first = lines.iter().position(at).unwrap();
            let last = lines.iter().rposition(at).unwrap();
            assert!(lines[first..=last].iter().all(at), "{family} is split");
        }
        assert!(lines.contains(&"gendurable_bulkhead_in_flight{name=\"a\"} 1"));
        assert!(lines.contains(&"gendurable_bulkhead_limit{name=\"say \\\"b\\\"\"} 3"));
        assert!(lines.contains(&"gendurable_bulkhead_saturated_total{name=\"say \\\"b\\\"\"} 0"));
        assert!(!lines.contains(&"gendurable_bulkhead_saturated_total{name=\"a\"} 0"));
    }
}
