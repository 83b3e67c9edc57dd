//! Runnable examples: `cargo run -p gendurable-examples --example account_sync`.
