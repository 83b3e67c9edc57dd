//! A node with something to look at, for trying the dashboard:
//!
//! ```sh
//! DATABASE_URL=postgres://localhost/app cargo run -p gendurable-dashboard --example load
//! gendurable dashboard --allow-actions          # in another terminal
//! ```
//!
//! Keys held, a full gate, a rate limit, failures, awaits, a workflow no node
//! runs; steps take a few seconds, and a new batch comes every 10 s.

#[path = "../tests/support/load.rs"]
mod load;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL")?;
    let (engine, _) = load::start(&url, "gendurable", std::time::Duration::from_secs(3)).await;
    println!("node running with a load; Ctrl-C stops it");
    let mut every = tokio::time::interval(std::time::Duration::from_secs(10));
    loop {
        tokio::select! {
            _ = every.tick() => {
                for i in 0..20 {
                    let new = gendurable::NewInstance::new("Account.Sync", serde_json::json!({ "n": i }))
                        .concurrency_key(format!("account:{}", i % 5));
                    engine.insert(new).await?;
                }
            }
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    engine.shutdown().await?;
    Ok(())
}
