//! Bulkheads by service name, for the language bindings.
//!
//! Lookups take a read lock on a global map. That is fine because the map is
//! not on the admission path: callers look a bulkhead up once and keep the
//! `Arc`.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, PoisonError, RwLock};

use super::{Bulkhead, BulkheadConfig, BulkheadError, NotFound};

type Registry = RwLock<HashMap<String, Arc<Bulkhead>>>;

static REGISTRY: LazyLock<Registry> = LazyLock::new(Default::default);

fn read<R>(f: impl FnOnce(&HashMap<String, Arc<Bulkhead>>) -> R) -> R {
    // The map is never left half-updated (every write is one insert or
    // remove), so a panic elsewhere while holding the lock does not matter.
    f(&REGISTRY.read().unwrap_or_else(PoisonError::into_inner))
}

fn write<R>(f: impl FnOnce(&mut HashMap<String, Arc<Bulkhead>>) -> R) -> R {
    f(&mut REGISTRY.write().unwrap_or_else(PoisonError::into_inner))
}

impl Bulkhead {
    /// Builds a bulkhead from `config` and registers it under `name`,
    /// replacing any bulkhead registered under that name before.
    ///
    /// Replacing does not affect permits taken from the old bulkhead: they
    /// release into it, and whoever still holds its `Arc` keeps using it. Only
    /// later lookups see the new one.
    pub fn configure(
        name: impl Into<String>,
        config: BulkheadConfig,
    ) -> Result<Arc<Bulkhead>, BulkheadError> {
        let bulkhead = Arc::new(Bulkhead::new(config)?);
        write(|m| m.insert(name.into(), Arc::clone(&bulkhead)));
        Ok(bulkhead)
    }

    /// The bulkhead registered under `name`, if any.
    pub fn named(name: &str) -> Option<Arc<Bulkhead>> {
        read(|m| m.get(name).cloned())
    }

    /// Removes the bulkhead registered under `name` and returns it.
    pub fn unregister(name: &str) -> Option<Arc<Bulkhead>> {
        write(|m| m.remove(name))
    }

    /// [`in_flight`](Bulkhead::in_flight) of the bulkhead registered under
    /// `name`; 0 if there is none.
    pub fn in_flight_of(name: &str) -> usize {
        read(|m| m.get(name).map_or(0, |b| b.in_flight()))
    }

    /// [`limit`](Bulkhead::limit) of the bulkhead registered under `name`.
    pub fn limit_of(name: &str) -> Option<usize> {
        read(|m| m.get(name).map(|b| b.limit()))
    }

    /// [`reset`](Bulkhead::reset) the bulkhead registered under `name`.
    pub fn reset_named(name: &str) -> Result<(), NotFound> {
        // Clone out of the lock: reset wakes waiters, no need to hold it then.
        let bulkhead = Bulkhead::named(name).ok_or_else(|| NotFound(name.to_owned()))?;
        bulkhead.reset();
        Ok(())
    }
}
