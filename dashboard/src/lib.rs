//! The gendurable web dashboard: `gendurable dashboard` serves it.
//!
//! Pages (server-rendered HTML, refreshed live by a few lines of inline
//! script; nothing fetched at run time): the overview (backlog per queue,
//! the last hour's steps, live nodes), instances (filtered, paginated by
//! id), one instance (its state, errors, and why it waits), keys and gates.
//! `GET /metrics` serves the Prometheus text; `/api/...` the same data as
//! JSON. Read-only unless started with actions allowed: then cancel, retry,
//! delete, signal, bulk forms of each over a filter (confirmed with their
//! count), and pausing a queue. Every read goes through the engine's
//! inspection calls ([`gendurable::inspect`]), which read indexes only.

mod actions;
mod html;
mod pages;

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use gendurable::Engine;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// How the dashboard runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where it listens.
    pub listen: SocketAddr,
    /// Whether the action buttons and endpoints are on.
    pub allow_actions: bool,
    /// How often pages reload their content (zero: never).
    pub refresh: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            allow_actions: false,
            refresh: Duration::from_secs(2),
        }
    }
}

/// What every handler shares.
pub(crate) struct App {
    engine: Engine,
    allow_actions: bool,
    refresh_ms: u64,
    /// Carried by every action form and checked on every action: a page from
    /// another site cannot post one (it cannot read this value).
    token: String,
}

/// The dashboard's routes over `engine` (a client engine: it need not run
/// a node).
pub fn router(engine: Engine, options: &Options) -> Router {
    let app = Arc::new(App {
        engine,
        allow_actions: options.allow_actions,
        refresh_ms: options.refresh.as_millis().min(u64::MAX as u128) as u64,
        token: format!("{:032x}", rand::random::<u128>()),
    });
    Router::new()
        .route("/", get(pages::overview::page))
        .route("/instances", get(pages::instances::page))
        .route("/instances/{id}", get(pages::instance::page))
        .route("/keys", get(pages::keys::page))
        .route("/metrics", get(metrics))
        .route("/api/overview", get(pages::overview::json))
        .route("/api/instances", get(pages::instances::json))
        .route("/api/instances/{id}", get(pages::instance::json))
        .route("/api/keys", get(pages::keys::json))
        .route("/actions/instance", post(actions::instance))
        .route("/actions/bulk", post(actions::bulk))
        .route("/actions/queue", post(actions::queue))
        .with_state(app)
}

/// Serve the dashboard on `options.listen` until `shutdown` completes.
/// Returns the address it listens on once bound (port 0 picks one) through
/// `bound`.
pub async fn serve(
    engine: Engine,
    options: Options,
    bound: impl FnOnce(SocketAddr),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(options.listen).await?;
    bound(listener.local_addr()?);
    axum::serve(listener, router(engine, &options))
        .with_graceful_shutdown(shutdown)
        .await
}

async fn metrics(axum::extract::State(app): axum::extract::State<Arc<App>>) -> Response {
    match app.engine.metrics().await {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => failure(&e),
    }
}

/// A page, or only its `main` when the page's script asks (`X-Fragment`).
pub(crate) fn respond(
    app: &App,
    headers: &HeaderMap,
    title: &str,
    nav: html::Nav,
    banner: Option<&str>,
    top: &str,
    main: String,
) -> Response {
    if headers.contains_key("x-fragment") {
        return Html(main).into_response();
    }
    Html(html::page(title, nav, banner, top, &main, app.refresh_ms)).into_response()
}

/// An error as a response: bad input is the caller's (400), a missing
/// instance 404, anything else the server's (500), with the message.
pub(crate) fn failure(e: &gendurable::Error) -> Response {
    let status = match e {
        gendurable::Error::InvalidInput { .. } => StatusCode::BAD_REQUEST,
        gendurable::Error::NotFound(_) => StatusCode::NOT_FOUND,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    if status == StatusCode::INTERNAL_SERVER_ERROR {
        tracing::warn!(error = %e, "dashboard request failed");
    }
    (
        status,
        Html(html::page(
            "Error",
            html::Nav::Overview,
            None,
            "",
            &format!(
                "<h1>Error</h1><p class=\"err\">{}</p>",
                html::esc(&e.to_string())
            ),
            0,
        )),
    )
        .into_response()
}
