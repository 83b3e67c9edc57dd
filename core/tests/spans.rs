//! The core's tracing spans: one per insert call, claim call and step run,
//! with the fields a tracing subscriber (OpenTelemetry, say) records.

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
