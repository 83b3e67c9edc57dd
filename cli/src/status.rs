//! `gendurable status`.

use anyhow::{bail, Result};
use gendurable::{Engine, GateConfig};

/// `--gate NAME=LIMIT[/SHARDS]`.
pub fn parse_gate(s: &str) -> Result<(String, GateConfig), String> {
    gendurable::config::parse_gate(s).map_err(|e| e.to_string())
}

/// What `status` prints besides the cluster's status.
pub struct Show {
    /// Keys whose effective K to show, under `gates`.
    pub keys: Vec<String>,
    pub gates: Vec<(String, GateConfig)>,
    /// One JSON object instead of text.
    pub json: bool,
}

pub async fn run(engine: &Engine, show: &Show) -> Result<()> {
    let status = engine.status().await?;
    let mut limits = Vec::new();
    if !show.keys.is_empty() {
        // The nodes' gate config is not stored: take it from --gate.
        let mut b = Engine::builder().pool(engine.pool().clone()).migrate(false);
        for (name, g) in &show.gates {
            b = b.concurrency_limit(name, g.clone());
        }
        let local = b.build().await?;
        for k in &show.keys {
            if let Err(e) = gendurable::validate::key("key", k) {
                bail!("{e}");
            }
            limits.push((k.clone(), local.key_limit(k)));
        }
    }
    if show.json {
        let keys: serde_json::Map<String, serde_json::Value> = limits
            .iter()
            .map(|(k, l)| (k.clone(), serde_json::to_value(l).unwrap_or_default()))
            .collect();
        let mut v = serde_json::to_value(&status)?;
        v["key_limits"] = serde_json::Value::Object(keys);
        println!("{v}");
        return Ok(());
    }
    print!("{status}");
    if !limits.is_empty() {
        println!("\neffective K");
        for (k, l) in limits {
            println!("  {}", l.describe(&k));
        }
    }
    Ok(())
}
