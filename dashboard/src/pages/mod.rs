//! One module per page: each renders its HTML and serves the same data as
//! JSON under `/api`.

pub mod instance;
pub mod instances;
pub mod keys;
pub mod overview;

use crate::App;
use axum::extract::State;
use std::sync::Arc;

pub(crate) type AppState = State<Arc<App>>;

/// A JSON response from a serializable result.
pub(crate) fn json<T: serde::Serialize>(r: gendurable::Result<T>) -> axum::response::Response {
    use axum::response::IntoResponse;
    match r {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => {
            let status = crate::failure(&e).status();
            (
                status,
                axum::Json(serde_json::json!({ "error": e.to_string() })),
            )
                .into_response()
        }
    }
}
