//! `GET /openapi.json`: the OpenAPI 3.1 description of the HTTP API, generated from the request
//! and response types and the handlers' annotations (utoipa), so it cannot drift from the code.
//! Aliases (`/embeddings`, `/v1/score`, `/v1/rerank`, `/v2/rerank`) share their primary
//! route's operation and are named in its description.

use axum::Json;
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(title = "poolserve", description = "Pooling models over the OpenAI, vLLM, Cohere/Jina and TEI APIs (contract: api.md)."),
    paths(
        super::embeddings::create,
        super::classify::create,
        super::pooling::create,
        super::score::create,
        super::rerank::create,
        super::sparse::create,
        super::tokenize::tokenize,
        super::tokenize::detokenize,
        super::meta::health,
        super::meta::models,
        super::meta::version,
    )
)]
pub struct ApiDoc;

pub async fn openapi_json() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
