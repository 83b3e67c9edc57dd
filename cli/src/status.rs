//! `gendurable status`.

use anyhow::{bail, Result};
use gendurable::{Engine, GateConfig};

/// `--gate NAME=LIMIT[/SHARDS]`.
pub fn parse_gate(s: &str) -> Result<(String, GateConfig), String> {
    gendurable::config::parse_gate(s).map_err(|e| e.to_string())
}

pub async fn run(
    engine: Engine,
    keys: Vec<String>,
    gates: Vec<(String, GateConfig)>,
) -> Result<()> {
    print!("{}", engine.status().await?);
    if !keys.is_empty() {
        // The nodes' gate config is not stored: take it from --gate.
        let mut b = Engine::builder().pool(engine.pool().clone()).migrate(false);
        for (name, g) in gates {
            b = b.concurrency_limit(name, g);
        }
        let local = b.build().await?;
        println!("\neffective K");
        for k in keys {
            if let Err(e) = gendurable::validate::key("key", &k) {
                bail!("{e}");
            }
            println!("  {}", local.key_limit(&k).describe(&k));
        }
    }
    Ok(())
}
