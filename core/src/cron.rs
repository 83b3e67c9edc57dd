//! Periodic workflows: a cron expression, a time zone and the instance each
//! tick inserts. Which ticks are due is decided here, from the last tick the
//! database records; the engine's cron service (engine/cron.rs) inserts them.

use crate::error::{Error, Result};
use crate::instance::NewInstance;
use chrono::{DateTime, Timelike, Utc};
use chrono_tz::Tz;
use std::str::FromStr;
use std::time::Duration;

/// Most ticks of one schedule inserted in one round under [`Missed::All`];
/// the next round goes on from there.
pub const MAX_TICKS_PER_ROUND: usize = 1000;

/// How late a tick may be inserted under [`Missed::Skip`].
pub const SKIP_GRACE: Duration = Duration::from_secs(60);

/// What a schedule does with ticks that passed while no node ran it (or the
/// database was down).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Missed {
    /// Insert the latest tick that passed, once: a daily report that should
    /// have run during an outage runs when a node is back.
    #[default]
    Latest,
    /// Insert every tick that passed, oldest first.
    All,
    /// Insert a tick only up to a minute ([`SKIP_GRACE`]) after its time.
    Skip,
}

impl Missed {
    /// The policy named `name`: `latest`, `all` or `skip`.
    pub fn from_name(name: &str) -> Option<Missed> {
        match name {
            "latest" => Some(Missed::Latest),
            "all" => Some(Missed::All),
            "skip" => Some(Missed::Skip),
            _ => None,
        }
    }

    /// The policy's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Missed::Latest => "latest",
            Missed::All => "all",
            Missed::Skip => "skip",
        }
    }
}

/// A periodic workflow: every tick of `schedule`, in `timezone`, inserts
/// `instance` (scheduled at the tick's time), exactly once across the
/// cluster however many nodes configure it.
///
/// ```
/// use gendurable::{CronEntry, NewInstance};
/// use serde_json::json;
/// // Every day at 06:00 in Paris.
/// let daily = CronEntry::new("0 6 * * *", NewInstance::new("Report", json!({"kind": "daily"})))
///     .name("daily-report")
///     .timezone("Europe/Paris");
/// ```
#[derive(Debug, Clone)]
pub struct CronEntry {
    pub(crate) name: Option<String>,
    pub(crate) schedule: String,
    pub(crate) timezone: String,
    pub(crate) instance: NewInstance,
    pub(crate) missed: Missed,
}

impl CronEntry {
    /// Insert `instance` at every tick of `schedule`: five fields (minute,
    /// hour, day of month, month, day of week), or six with seconds first;
    /// `@hourly`, `@daily`, ... and `L`, `W`, `#` are understood. UTC unless
    /// [`CronEntry::timezone`] says otherwise.
    pub fn new(schedule: impl Into<String>, instance: NewInstance) -> Self {
        CronEntry {
            name: None,
            schedule: schedule.into(),
            timezone: "UTC".into(),
            instance,
            missed: Missed::default(),
        }
    }

    /// The name its ticks are recorded under (default: the workflow's name);
    /// two entries of one engine need different names.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// An IANA time zone (`"Europe/Paris"`): the schedule follows its
    /// daylight-saving changes.
    pub fn timezone(mut self, timezone: impl Into<String>) -> Self {
        self.timezone = timezone.into();
        self
    }

    /// What to do with ticks missed while no node ran (default [`Missed::Latest`]).
    pub fn missed(mut self, missed: Missed) -> Self {
        self.missed = missed;
        self
    }

    /// The name its ticks are recorded under.
    pub fn entry_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.instance.workflow)
    }

    /// The schedule, parsed and checked with its time zone and instance.
    pub(crate) fn parse(&self) -> Result<Schedule> {
        let name = self.entry_name();
        let bad = |what: String| Error::config(format!("cron {name:?}: {what}"));
        crate::validate::name("cron name", name).map_err(|e| bad(e.to_string()))?;
        let cron = croner::Cron::from_str(&self.schedule)
            .map_err(|e| bad(format!("schedule {:?}: {e}", self.schedule)))?;
        let tz = Tz::from_str(&self.timezone)
            .map_err(|_| bad(format!("unknown time zone {:?}", self.timezone)))?;
        self.instance
            .validate()
            .map_err(|e| bad(format!("instance: {e}")))?;
        Ok(Schedule { cron, tz })
    }
}

/// A parsed schedule in its time zone.
#[derive(Debug, Clone)]
pub(crate) struct Schedule {
    cron: croner::Cron,
    tz: Tz,
}

impl Schedule {
    /// The first tick after `t`.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron
            .find_next_occurrence(&whole_second(t).with_timezone(&self.tz), false)
            .ok()
            .map(|d| d.with_timezone(&Utc))
    }

    /// The last tick at or before `t`.
    pub fn latest_until(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron
            .find_previous_occurrence(&whole_second(t).with_timezone(&self.tz), true)
            .ok()
            .map(|d| d.with_timezone(&Utc))
    }

    /// The ticks to insert now, given the last tick recorded, and the tick to
    /// record: ticks after `last` up to `now`, as `missed` says. An empty
    /// list with a new last tick skips ticks.
    pub fn due(
        &self,
        last: DateTime<Utc>,
        now: DateTime<Utc>,
        missed: Missed,
    ) -> (Vec<DateTime<Utc>>, DateTime<Utc>) {
        let Some(latest) = self.latest_until(now).filter(|t| *t > last) else {
            return (Vec::new(), last);
        };
        match missed {
            Missed::Latest => (vec![latest], latest),
            Missed::Skip if (now - latest).to_std().unwrap_or_default() <= SKIP_GRACE => {
                (vec![latest], latest)
            }
            Missed::Skip => (Vec::new(), latest),
            Missed::All => {
                let mut ticks = Vec::new();
                let mut t = last;
                while ticks.len() < MAX_TICKS_PER_ROUND {
                    match self.next_after(t).filter(|n| *n <= now) {
                        Some(n) => {
                            ticks.push(n);
                            t = n;
                        }
                        None => break,
                    }
                }
                (ticks, t)
            }
        }
    }
}

/// `t` without its fraction of a second: ticks fall on whole seconds (the
/// parser would carry a fraction through).
fn whole_second(t: DateTime<Utc>) -> DateTime<Utc> {
    t.with_nanosecond(0).unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn schedule(expr: &str, tz: &str) -> Schedule {
        CronEntry::new(expr, NewInstance::new("W", json!({})))
            .timezone(tz)
            .parse()
            .unwrap()
    }

    #[test]
    fn ticks_follow_the_time_zone() {
        let s = schedule("0 6 * * *", "Europe/Paris");
        // 06:00 in Paris is 05:00 UTC in winter, 04:00 in summer.
        assert_eq!(
            s.next_after(at("2026-01-10T00:00:00Z")),
            Some(at("2026-01-10T05:00:00Z"))
        );
        assert_eq!(
            s.next_after(at("2026-07-10T00:00:00Z")),
            Some(at("2026-07-10T04:00:00Z"))
        );
        let every_2s = schedule("*/2 * * * * *", "UTC");
        assert_eq!(
            every_2s.next_after(at("2026-01-10T00:00:01.5Z")),
            Some(at("2026-01-10T00:00:02Z"))
        );
        assert_eq!(
            every_2s.latest_until(at("2026-01-10T00:00:02.5Z")),
            Some(at("2026-01-10T00:00:02Z"))
        );
    }

    #[test]
    fn missed_ticks_follow_the_policy() {
        let s = schedule("*/5 * * * *", "UTC");
        let last = at("2026-01-10T10:00:00Z");
        let now = at("2026-01-10T10:17:00Z");
        let t = |m: &str| at(&format!("2026-01-10T10:{m}:00Z"));
        assert_eq!(s.due(last, now, Missed::Latest), (vec![t("15")], t("15")));
        assert_eq!(
            s.due(last, now, Missed::All),
            (vec![t("05"), t("10"), t("15")], t("15"))
        );
        assert_eq!(s.due(last, now, Missed::Skip), (vec![], t("15")));
        let on_time = at("2026-01-10T10:15:30Z");
        assert_eq!(s.due(last, on_time, Missed::Skip), (vec![t("15")], t("15")));
        // Nothing after the last tick: nothing to do.
        assert_eq!(s.due(t("15"), now, Missed::All), (vec![], t("15")));
        // A long outage under All: at most a round's worth, then on from there.
        let every_s = schedule("* * * * * *", "UTC");
        let (ticks, next) = every_s.due(last, at("2026-01-11T10:00:00Z"), Missed::All);
        assert_eq!(ticks.len(), MAX_TICKS_PER_ROUND);
        assert_eq!(next, *ticks.last().unwrap());
    }

    #[test]
    fn bad_entries_are_named() {
        let e = |entry: CronEntry| entry.parse().unwrap_err().to_string();
        let new = || NewInstance::new("Report", json!({}));
        assert!(e(CronEntry::new("61 * * * *", new()))
            .starts_with("invalid configuration: cron \"Report\": schedule \"61 * * * *\""));
        assert_eq!(
            e(CronEntry::new("* * * * *", new()).timezone("Mars/Olympus")),
            "invalid configuration: cron \"Report\": unknown time zone \"Mars/Olympus\""
        );
        assert!(e(CronEntry::new("* * * * *", new().priority(12)).name("r"))
            .contains("cron \"r\": instance: invalid priority"));
    }
}
