//! `--url-prefix`: every route served under a path, for ingresses that route by path
//! (Infinity's flag). Outside the prefix a request gets the API's 404, except gRPC calls, whose
//! paths the protocol fixes (`/tei.v1.Embed/Embed`): they reach the services at the root, so
//! that gRPC clients need no change.

use crate::api::error::ApiError;
use axum::extract::Request;
use axum::response::IntoResponse;
use axum::Router;
use tower::ServiceExt;

/// `app` under `prefix` ("" leaves it as it is).
pub fn under(app: Router, prefix: &str) -> Router {
    if prefix.is_empty() {
        return app;
    }
    let grpc = app.clone();
    Router::new().nest(prefix, app).fallback(move |request: Request| {
        let grpc = grpc.clone();
        async move {
            if is_grpc(&request) {
                // A Router's error type is Infallible.
                match grpc.oneshot(request).await {
                    Ok(response) => response.into_response(),
                    Err(never) => match never {},
                }
            } else {
                ApiError::NotFound("Not Found".into()).into_response()
            }
        }
    })
}

fn is_grpc(request: &Request) -> bool {
    request.headers().get(axum::http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("application/grpc"))
}
