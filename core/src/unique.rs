//! Unique inserts and idempotency keys: at most one instance per identity
//! among the statuses chosen, enforced by a unique index (see
//! `instances_unique` in `sql/migrations/` and `unique_key` in
//! `sql/functions/`).

use crate::error::{Error, Result};
use crate::instance::Status;
use crate::validate;
use serde_json::{json, Value};
use std::time::Duration;

/// The statuses an instance moves between while it runs: a unique insert's
/// statuses must include all four, so that no engine write takes a row out of
/// the index and back in (which could collide with a duplicate let in meanwhile).
pub const ACTIVE_STATUSES: [Status; 4] = [
    Status::Scheduled,
    Status::Available,
    Status::Executing,
    Status::Awaiting,
];

/// The default: a duplicate is refused while an instance is to run, runs or
/// has completed; a cancelled or discarded one lets it in again (Oban's default).
pub const DEFAULT_STATUSES: [Status; 5] = [
    Status::Scheduled,
    Status::Available,
    Status::Executing,
    Status::Awaiting,
    Status::Completed,
];

/// Every status: a duplicate is refused as long as the instance is kept
/// (finished instances are pruned after the retention).
pub const ALL_STATUSES: [Status; 7] = [
    Status::Scheduled,
    Status::Available,
    Status::Executing,
    Status::Awaiting,
    Status::Completed,
    Status::Cancelled,
    Status::Discarded,
];

/// Most state fields a unique insert may name.
pub const MAX_FIELDS: usize = 64;

/// How an insert is deduplicated. Its identity is the instance's idempotency
/// key when it has one, else its workflow, its concurrency key and its state
/// (all of it, or the named top-level fields); with a period, the identity
/// also holds the period the database's clock is in (fixed windows, aligned
/// on the Unix epoch). An insert whose identity matches an instance in one of
/// the chosen statuses inserts nothing and reports that instance.
///
/// ```
/// use gendurable::{NewInstance, Unique};
/// use serde_json::json;
/// use std::time::Duration;
/// // One report per account per hour, whatever else the state holds.
/// let new = NewInstance::new("Report", json!({"account": 7, "asked_by": "ops"}))
///     .unique(Unique::new().fields(["account"]).period(Duration::from_secs(3600)));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Unique {
    pub(crate) fields: Option<Vec<String>>,
    pub(crate) period: Option<Duration>,
    pub(crate) statuses: Vec<Status>,
}

impl Default for Unique {
    fn default() -> Self {
        Unique::new()
    }
}

impl Unique {
    /// The whole state, no period, [`DEFAULT_STATUSES`].
    pub fn new() -> Self {
        Unique {
            fields: None,
            period: None,
            statuses: DEFAULT_STATUSES.to_vec(),
        }
    }

    /// Compare only these top-level fields of the state (a missing field
    /// counts as null).
    pub fn fields<S: Into<String>>(mut self, fields: impl IntoIterator<Item = S>) -> Self {
        self.fields = Some(fields.into_iter().map(Into::into).collect());
        self
    }

    /// Refuse duplicates only within the same window of this length (at least
    /// one second).
    pub fn period(mut self, period: Duration) -> Self {
        self.period = Some(period);
        self
    }

    /// The statuses in which an instance refuses a duplicate; they must
    /// include [`ACTIVE_STATUSES`].
    pub fn statuses(mut self, statuses: impl IntoIterator<Item = Status>) -> Self {
        self.statuses = statuses.into_iter().collect();
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if let Some(fields) = &self.fields {
            if fields.is_empty() || fields.len() > MAX_FIELDS {
                return Err(Error::input(
                    "unique.fields",
                    format!(
                        "must name 1 to {MAX_FIELDS} state fields, got {}",
                        fields.len()
                    ),
                ));
            }
            for f in fields {
                validate::name("unique.fields", f)?;
            }
        }
        if let Some(p) = self.period {
            if p < Duration::from_secs(1) {
                return Err(Error::input(
                    "unique.period",
                    format!("must be at least 1 second, got {p:?}"),
                ));
            }
        }
        if let Some(missing) = ACTIVE_STATUSES.iter().find(|s| !self.statuses.contains(s)) {
            return Err(Error::input(
                "unique.states",
                format!(
                    "must include scheduled, available, executing and awaiting (missing {missing}): \
                     an instance moves between them while it runs; add completed, cancelled or \
                     discarded to refuse duplicates after it finished"
                ),
            ));
        }
        Ok(())
    }

    /// The specification the SQL function `unique_key` reads.
    pub(crate) fn spec(&self, idempotency_key: Option<&str>) -> Value {
        let mut statuses: Vec<&str> = self.statuses.iter().map(|s| s.as_str()).collect();
        statuses.sort_unstable();
        statuses.dedup();
        json!({
            "key": idempotency_key,
            "fields": self.fields,
            "period": self.period.map(|p| p.as_secs_f64()),
            "states": statuses,
        })
    }
}

/// An idempotency key: 1 to 1024 bytes, no NUL.
pub(crate) fn validate_key(key: &str) -> Result<()> {
    const FIELD: &str = "idempotency_key";
    if key.is_empty() {
        return Err(Error::input(FIELD, "must not be empty"));
    }
    if key.len() > validate::MAX_KEY_BYTES {
        return Err(Error::input(
            FIELD,
            format!(
                "is {} bytes long; the limit is {}",
                key.len(),
                validate::MAX_KEY_BYTES
            ),
        ));
    }
    if key.contains('\0') {
        return Err(Error::input(FIELD, "must not contain NUL bytes"));
    }
    Ok(())
}

/// What an insert did with one instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Inserted {
    /// The new instance's id, or the existing one's on a conflict.
    pub id: i64,
    /// Whether a unique insert or idempotency key matched an existing
    /// instance (then nothing was inserted).
    pub conflict: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_must_cover_the_active_ones() {
        assert!(Unique::new().validate().is_ok());
        assert!(Unique::new().statuses(ALL_STATUSES).validate().is_ok());
        let e = Unique::new()
            .statuses([Status::Available, Status::Scheduled])
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("missing executing"), "{e}");
    }

    #[test]
    fn fields_and_period_are_checked() {
        let none: [&str; 0] = [];
        assert!(Unique::new().fields(none).validate().is_err());
        assert!(Unique::new().fields([""]).validate().is_err());
        assert!(Unique::new().fields(["a"]).validate().is_ok());
        let e = Unique::new()
            .period(Duration::from_millis(500))
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("at least 1 second"), "{e}");
    }

    #[test]
    fn spec_is_canonical() {
        let a = Unique::new().statuses([
            Status::Completed,
            Status::Scheduled,
            Status::Available,
            Status::Executing,
            Status::Awaiting,
            Status::Completed,
        ]);
        assert_eq!(a.spec(None), Unique::new().spec(None));
        assert_eq!(a.spec(Some("k"))["key"], "k");
    }

    #[test]
    fn idempotency_keys() {
        assert!(validate_key("charge:42").is_ok());
        assert!(validate_key("").is_err());
        assert!(validate_key("a\0").is_err());
        assert!(validate_key(&"k".repeat(1025)).is_err());
    }
}
