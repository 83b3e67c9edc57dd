//! The core's tracing spans: one per insert call, claim call and step run,
//! with the fields a tracing subscriber (OpenTelemetry, say) records; and
//! the warnings it logs.

mod support;

use gendurable::{NewInstance, Transition};
use serde_json::json;
use std::sync::{Arc, Mutex};
use tracing::span::{Attributes, Id};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// Records the name and fields of every span opened.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, _id: &Id, _ctx: Context<'_, S>) {
        struct Fields(String);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                self.0.push_str(&format!(" {}={:?}", f.name(), v));
            }
        }
        let mut fields = Fields(attrs.metadata().name().to_owned());
        attrs.record(&mut fields);
        self.0.lock().unwrap().push(fields.0);
    }
}

#[tokio::test]
async fn inserts_claims_and_steps_open_spans() {
    let spans = Spans::default();
    let _guard = tracing::subscriber::set_default(
        tracing_subscriber::registry().with(
            spans
                .clone()
                .with_filter(tracing_subscriber::filter::LevelFilter::DEBUG),
        ),
    );
    let url = support::url();
    let schema = support::schema("spans");
    let engine = support::builder(&url, &schema)
        .queue("default", 1)
        .workflow_fn("Traced", |_, state, _| async {
            Ok(Transition::done(state))
        })
        .build()
        .await
        .unwrap();
    let id = engine
        .insert(NewInstance::new("Traced", json!({})))
        .await
        .unwrap();
    engine.drain("default").await.unwrap();
    let seen = spans.0.lock().unwrap().clone();
    assert!(
        seen.iter().any(|s| s == "gendurable.insert rows=1"),
        "{seen:?}"
    );
    let step =
        format!("gendurable.step id={id} workflow=Traced step=start queue=default attempt=1");
    assert!(seen.contains(&step), "{seen:?}");
}

/// Records the message of every warning logged.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> Layer<S> for Warnings {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    self.0 = format!("{v:?}");
                }
            }
        }
        if *event.metadata().level() == tracing::Level::WARN {
            let mut m = Message(String::new());
            event.record(&mut m);
            self.0.lock().unwrap().push(m.0);
        }
    }
}

/// A pool handed to the engine keeps its own settings (the engine's own
/// pools raise `synchronous_commit = off`): the engine warns that its
/// commits may be lost.
#[tokio::test]
async fn a_pool_handed_in_that_commits_asynchronously_is_warned_about() {
    let warnings = Warnings::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(warnings.clone()));
    let url = support::url();
    let pool = sqlx::PgPool::connect(&support::with_setting(&url, "synchronous_commit", "off"))
        .await
        .unwrap();
    let _engine = gendurable::Engine::builder()
        .pool(pool)
        .schema(support::schema("handed"))
        .build()
        .await
        .unwrap();
    // The check runs beside the build, on this test's thread.
    support::eventually("the warning", std::time::Duration::from_secs(30), || {
        let said = warnings.0.lock().unwrap().clone();
        async move { said.iter().any(|w| w.contains("synchronous_commit = off")) }
    })
    .await;
}
