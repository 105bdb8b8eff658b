//! `GET /openapi.json`: the OpenAPI 3.1 description of the HTTP API, generated from the request
//! and response types and the handlers' annotations (utoipa), so it cannot drift from the code.
//! Aliases (`/embeddings`, `/v1/score`, `/v1/rerank`, `/v2/rerank`) share their primary
//! route's operation and are named in its description. `GET /docs` is Swagger UI over it, its
//! assets compiled into the binary (the crate's `vendored` feature): the page works offline.
//! Behind `--root-path` or `--url-prefix` the description names that path as its server (as
//! FastAPI does with `root_path`), and the page fetches the description through it.

use axum::extract::State;
use axum::Json;
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "poolserve",
        description = "Pooling models over the OpenAI, vLLM, Cohere/Jina and TEI APIs (contract: docs/http-api.md)."
    ),
    paths(
        super::embeddings::create,
        super::infinity::image,
        super::infinity::audio,
        super::classify::create,
        super::pooling::create,
        super::score::create,
        super::rerank::create,
        super::generative_scoring::create,
        super::cohere::create_v2,
        super::cohere::create_v1,
        super::invocations::invocations,
        super::tei::embeddings::embed,
        super::tei::embeddings::embed_all,
        super::tei::embeddings::embed_sparse,
        super::tei::scores::predict,
        super::tei::embeddings::similarity,
        super::tei::tokens::decode,
        super::tei::vertex,
        super::tei::info,
        super::tokenize::tokenize,
        super::tokenize::detokenize,
        super::meta::health,
        super::meta::models,
        super::meta::version,
    ),
    // The error bodies the responses name through `IntoResponses` (utoipa does not collect
    // those by itself: they were unresolvable references), and /predict's `inputs`.
    components(schemas(
        super::error::ErrorBody,
        super::error::TeiErrorBody,
        super::error::NotFoundBody,
        super::error::AnyErrorBody,
        super::tei::scores::PredictInputs
    ))
)]
pub struct ApiDoc;

pub async fn openapi_json(State(state): State<super::AppState>) -> Json<utoipa::openapi::OpenApi> {
    let mut api = ApiDoc::openapi();
    let prefix = &state.options().public_prefix;
    if !prefix.is_empty() {
        api.servers = Some(vec![utoipa::openapi::Server::new(prefix.clone())]);
    }
    Json(api)
}

/// `/docs`: the interactive API page, reading `/openapi.json` through `public_prefix`.
pub fn docs<S: Clone + Send + Sync + 'static>(public_prefix: &str) -> axum::Router<S> {
    let description = format!("{public_prefix}/openapi.json");
    utoipa_swagger_ui::SwaggerUi::new("/docs").config(utoipa_swagger_ui::Config::from(description)).into()
}
