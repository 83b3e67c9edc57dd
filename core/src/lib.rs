//! gendurable: a durable step engine on PostgreSQL.

pub mod bulkhead;
pub mod embedded;
