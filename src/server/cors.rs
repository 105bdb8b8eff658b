//! The CORS layer around every route, from `--allowed-origins` and the rest ([`CorsOptions`]),
//! answering as vLLM's Starlette middleware does: `*` lists answer `*`, or, with
//! `--allow-credentials` (where browsers refuse `*`), the request's own origin, method and
//! headers; preflights are answered before the API key is asked for (browsers send none), and
//! are cached for 600 s (Starlette's `max_age`).

use crate::config::{CorsList, CorsOptions};
use axum::http::{HeaderName, HeaderValue, Method};
use tower_http::cors::{AllowHeaders, AllowMethods, AllowOrigin, CorsLayer};

/// The layer; the values were checked when the flags were read, so none is dropped here in
/// practice (one that still fails to parse is left out rather than stopping the server).
pub fn layer(options: &CorsOptions) -> CorsLayer {
    let origins = match (&options.origins, options.credentials) {
        (CorsList::Any, false) => AllowOrigin::any(),
        (CorsList::Any, true) => AllowOrigin::mirror_request(),
        (CorsList::Only(list), _) => AllowOrigin::list(list.iter().filter_map(|o| HeaderValue::from_str(o).ok())),
    };
    let methods = match (&options.methods, options.credentials) {
        (CorsList::Any, false) => AllowMethods::any(),
        (CorsList::Any, true) => AllowMethods::mirror_request(),
        (CorsList::Only(list), _) => AllowMethods::list(list.iter().filter_map(|m| Method::from_bytes(m.as_bytes()).ok())),
    };
    let headers = match (&options.headers, options.credentials) {
        (CorsList::Any, false) => AllowHeaders::any(),
        (CorsList::Any, true) => AllowHeaders::mirror_request(),
        (CorsList::Only(list), _) => AllowHeaders::list(list.iter().filter_map(|h| HeaderName::from_bytes(h.as_bytes()).ok())),
    };
    CorsLayer::new()
        .allow_origin(origins)
        .allow_methods(methods)
        .allow_headers(headers)
        .allow_credentials(options.credentials)
        .max_age(std::time::Duration::from_secs(600))
}
