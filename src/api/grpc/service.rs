//! The five tei.v1 services, each call read into the body of TEI's HTTP route for it and
//! answered by that route's code ([`crate::api::tei`]); what differs is TEI's gRPC reading of
//! its fields: proto3 defaults (`truncate`, `add_special_tokens` and `skip_special_tokens` are
//! false unless sent; `normalize` is true unless sent), one input per message, and the
//! `Metadata` of every answer (characters, tokens, nanoseconds).

use super::pb;
use super::stream::{in_order, Answers};
use crate::api::tei::embeddings::{embed_all_inner, embed_inner, embed_sparse_inner, EmbedRequest};
use crate::api::tei::error::TeiError;
use crate::api::tei::inputs::{Input, InputFields, InputType, TruncationDirection};
use crate::api::tei::scores::{predict_inner, rerank_inner, PredictRequest, PredictResponse, RerankRequest};
use crate::api::tei::tokens::{decode_inner, tokenize_inner, DecodeIds, DecodeRequest, TokenizeInput, TokenizeRequest};
use crate::api::tei::{self, Kind};
use crate::api::AppState;
use crate::metrics::{RequestTimings, TimingSnapshot, TIMINGS};
use serde_json::Value;
use std::future::Future;
use std::time::{Duration, Instant};
use tonic::{Request, Response, Status, Streaming};

#[derive(Clone)]
pub struct TeiService {
    state: AppState,
}

impl TeiService {
    pub fn new(state: AppState) -> Self {
        Self { state }
    }
}

/// The served model a call names in its `model` metadata.
fn model_of<T>(request: &Request<T>) -> Option<String> {
    request.metadata().get("model").and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// TEI's `TruncationDirection` (TEI panics on a value the enum lacks; here it is refused).
fn direction(value: i32) -> Result<TruncationDirection, Status> {
    match pb::TruncationDirection::try_from(value) {
        Ok(pb::TruncationDirection::Right) => Ok(TruncationDirection::Right),
        Ok(pb::TruncationDirection::Left) => Ok(TruncationDirection::Left),
        Err(_) => Err(Status::invalid_argument(format!("`truncation_direction` must be RIGHT (0) or LEFT (1). Given: {value}"))),
    }
}

/// The fields of a one-text embedding call.
fn fields(
    inputs: String,
    truncate: bool,
    truncation_direction: i32,
    prompt_name: Option<String>,
    model: Option<String>,
) -> Result<InputFields, Status> {
    Ok(InputFields {
        inputs: Input::Single(InputType::Text(inputs)),
        truncate: Some(truncate),
        truncation_direction: direction(truncation_direction)?,
        prompt_name,
        model,
    })
}

/// Runs one call's `work` with its timings collected (the HTTP layer's for a unary call; a
/// scope of its own for a stream's message, which runs in a task of its own), returning TEI's
/// `Metadata` of it.
async fn measured<T>(work: impl Future<Output = Result<T, TeiError>>) -> Result<(T, pb::Metadata), Status> {
    let started = Instant::now();
    let (result, done) = if TIMINGS.try_with(|_| ()).is_ok() {
        let result = work.await;
        (result, TIMINGS.with(RequestTimings::snapshot))
    } else {
        TIMINGS
            .scope(RequestTimings::default(), async {
                let result = work.await;
                (result, TIMINGS.with(RequestTimings::snapshot))
            })
            .await
    };
    Ok((result?, metadata(&done, started.elapsed())))
}

fn metadata(done: &TimingSnapshot, total: Duration) -> pb::Metadata {
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    pb::Metadata {
        compute_chars: u32::try_from(done.characters).unwrap_or(u32::MAX),
        compute_tokens: u32::try_from(done.tokens).unwrap_or(u32::MAX),
        total_time_ns: nanos(total),
        tokenization_time_ns: nanos(done.tokenization),
        queue_time_ns: nanos(done.queue),
        inference_time_ns: nanos(done.inference),
    }
}

/// Answers a stream's messages with `work`, each carrying the stream's `model`.
fn each<Req, Res, Fut>(
    service: &TeiService,
    request: Request<Streaming<Req>>,
    work: impl Fn(TeiService, Req, Option<String>) -> Fut + Send + 'static,
) -> Response<Answers<Res>>
where
    Req: Send + 'static,
    Res: Send + 'static,
    Fut: Future<Output = Result<Res, Status>> + Send + 'static,
{
    let (model, service) = (model_of(&request), service.clone());
    Response::new(in_order(request.into_inner(), move |message| work(service.clone(), message, model.clone())))
}

impl TeiService {
    async fn embed_one(self, r: pb::EmbedRequest, model: Option<String>) -> Result<pb::EmbedResponse, Status> {
        let fields = fields(r.inputs, r.truncate, r.truncation_direction, r.prompt_name, model)?;
        let request = EmbedRequest { fields, normalize: r.normalize.unwrap_or(true), dimensions: r.dimensions.map(|d| d as usize) };
        let (mut vectors, metadata) = measured(embed_inner(&self.state, request)).await?;
        Ok(pb::EmbedResponse { embeddings: vectors.pop().unwrap_or_default(), metadata: Some(metadata) })
    }

    async fn embed_sparse_one(self, r: pb::EmbedSparseRequest, model: Option<String>) -> Result<pb::EmbedSparseResponse, Status> {
        let fields = fields(r.inputs, r.truncate, r.truncation_direction, r.prompt_name, model)?;
        let (mut vectors, metadata) = measured(embed_sparse_inner(&self.state, fields)).await?;
        let sparse_embeddings =
            vectors.pop().unwrap_or_default().into_iter().map(|v| pb::SparseValue { index: v.index, value: v.value }).collect();
        Ok(pb::EmbedSparseResponse { sparse_embeddings, metadata: Some(metadata) })
    }

    async fn embed_all_one(self, r: pb::EmbedAllRequest, model: Option<String>) -> Result<pb::EmbedAllResponse, Status> {
        let fields = fields(r.inputs, r.truncate, r.truncation_direction, r.prompt_name, model)?;
        let (mut vectors, metadata) = measured(embed_all_inner(&self.state, fields)).await?;
        let token_embeddings = vectors.pop().unwrap_or_default().into_iter().map(|embeddings| pb::TokenEmbedding { embeddings }).collect();
        Ok(pb::EmbedAllResponse { token_embeddings, metadata: Some(metadata) })
    }

    /// `inputs` as `/predict` reads it: a text, or a pair as a list of two.
    async fn predict_one(
        self,
        inputs: Value,
        truncate: bool,
        truncation_direction: i32,
        raw_scores: bool,
        model: Option<String>,
    ) -> Result<pb::PredictResponse, Status> {
        let request =
            PredictRequest { inputs, truncate: Some(truncate), truncation_direction: direction(truncation_direction)?, raw_scores, model };
        let (answer, metadata) = measured(predict_inner(&self.state, request)).await?;
        let predictions = match answer {
            PredictResponse::Single(list) => list,
            PredictResponse::Batch(mut lists) => lists.pop().unwrap_or_default(),
        };
        let predictions = predictions.into_iter().map(|p| pb::Prediction { score: p.score, label: p.label }).collect();
        Ok(pb::PredictResponse { predictions, metadata: Some(metadata) })
    }

    async fn predict_pair_one(self, r: pb::PredictPairRequest, model: Option<String>) -> Result<pb::PredictResponse, Status> {
        if !(1..=2).contains(&r.inputs.len()) {
            return Err(Status::invalid_argument(format!("`inputs` must have a single or two elements. Given: {}", r.inputs.len())));
        }
        let inputs = Value::Array(r.inputs.into_iter().map(Value::String).collect());
        self.predict_one(inputs, r.truncate, r.truncation_direction, r.raw_scores, model).await
    }

    /// TEI's gRPC check before a rerank: FAILED_PRECONDITION with TEI's words for the model
    /// kinds that cannot rerank.
    fn check_reranker(&self, model: Option<&str>) -> Result<(), Status> {
        let engine = tei::model(&self.state, model, |s| Kind::of(s) == Some(Kind::Reranker))?;
        match Kind::of(engine.spec()) {
            Some(Kind::Reranker) => Ok(()),
            Some(Kind::Classifier) => Err(Status::failed_precondition("model is not a re-ranker model")),
            _ => Err(Status::failed_precondition("model is not a classifier model")),
        }
    }

    async fn tokenize_one(self, r: pb::EncodeRequest, model: Option<String>) -> Result<pb::EncodeResponse, Status> {
        let request = TokenizeRequest {
            inputs: TokenizeInput::Single(r.inputs),
            add_special_tokens: r.add_special_tokens,
            prompt_name: r.prompt_name,
            model,
        };
        let mut lists = tokenize_inner(&self.state, request).await?;
        let tokens = lists
            .pop()
            .unwrap_or_default()
            .into_iter()
            .map(|t| pb::SimpleToken {
                id: t.id,
                text: t.text,
                special: t.special,
                start: t.start.map(|s| u32::try_from(s).unwrap_or(u32::MAX)),
                stop: t.stop.map(|s| u32::try_from(s).unwrap_or(u32::MAX)),
            })
            .collect();
        Ok(pb::EncodeResponse { tokens })
    }

    async fn decode_one(self, r: pb::DecodeRequest, model: Option<String>) -> Result<pb::DecodeResponse, Status> {
        let request = DecodeRequest { ids: DecodeIds::Single(r.ids), skip_special_tokens: r.skip_special_tokens, model };
        let mut texts = decode_inner(&self.state, request).await?;
        Ok(pb::DecodeResponse { text: texts.pop().unwrap_or_default() })
    }
}

#[tonic::async_trait]
impl pb::info_server::Info for TeiService {
    async fn info(&self, request: Request<pb::InfoRequest>) -> Result<Response<pb::InfoResponse>, Status> {
        let engine = self.state.model(model_of(&request).as_deref()).map_err(TeiError::from)?;
        let spec = engine.spec();
        let model_type = match Kind::of(spec) {
            Some(Kind::Classifier) => pb::ModelType::Classifier,
            Some(Kind::Reranker) => pb::ModelType::Reranker,
            _ => pb::ModelType::Embedding,
        };
        let limits = engine.limits();
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        Ok(Response::new(pb::InfoResponse {
            version: env!("CARGO_PKG_VERSION").into(),
            sha: None,
            docker_label: None,
            model_id: spec.root.clone(),
            model_sha: None,
            model_dtype: spec.dtype.to_string(),
            model_type: model_type.into(),
            max_concurrent_requests: count(limits.max_concurrent_requests),
            max_input_length: count(spec.max_model_len),
            max_batch_tokens: count(limits.max_batch_tokens),
            max_batch_requests: None,
            max_client_batch_size: count(self.state.options().max_client_batch_size),
            tokenization_workers: count(limits.tokenizer_workers),
        }))
    }
}

#[tonic::async_trait]
impl pb::embed_server::Embed for TeiService {
    async fn embed(&self, request: Request<pb::EmbedRequest>) -> Result<Response<pb::EmbedResponse>, Status> {
        let model = model_of(&request);
        Ok(Response::new(self.clone().embed_one(request.into_inner(), model).await?))
    }

    type EmbedStreamStream = Answers<pb::EmbedResponse>;

    async fn embed_stream(&self, request: Request<Streaming<pb::EmbedRequest>>) -> Result<Response<Self::EmbedStreamStream>, Status> {
        Ok(each(self, request, TeiService::embed_one))
    }

    async fn embed_sparse(&self, request: Request<pb::EmbedSparseRequest>) -> Result<Response<pb::EmbedSparseResponse>, Status> {
        let model = model_of(&request);
        Ok(Response::new(self.clone().embed_sparse_one(request.into_inner(), model).await?))
    }

    type EmbedSparseStreamStream = Answers<pb::EmbedSparseResponse>;

    async fn embed_sparse_stream(
        &self,
        request: Request<Streaming<pb::EmbedSparseRequest>>,
    ) -> Result<Response<Self::EmbedSparseStreamStream>, Status> {
        Ok(each(self, request, TeiService::embed_sparse_one))
    }

    async fn embed_all(&self, request: Request<pb::EmbedAllRequest>) -> Result<Response<pb::EmbedAllResponse>, Status> {
        let model = model_of(&request);
        Ok(Response::new(self.clone().embed_all_one(request.into_inner(), model).await?))
    }

    type EmbedAllStreamStream = Answers<pb::EmbedAllResponse>;

    async fn embed_all_stream(
        &self,
        request: Request<Streaming<pb::EmbedAllRequest>>,
    ) -> Result<Response<Self::EmbedAllStreamStream>, Status> {
        Ok(each(self, request, TeiService::embed_all_one))
    }
}

#[tonic::async_trait]
impl pb::predict_server::Predict for TeiService {
    async fn predict(&self, request: Request<pb::PredictRequest>) -> Result<Response<pb::PredictResponse>, Status> {
        let model = model_of(&request);
        let r = request.into_inner();
        Ok(Response::new(self.clone().predict_one(Value::String(r.inputs), r.truncate, r.truncation_direction, r.raw_scores, model).await?))
    }

    async fn predict_pair(&self, request: Request<pb::PredictPairRequest>) -> Result<Response<pb::PredictResponse>, Status> {
        let model = model_of(&request);
        Ok(Response::new(self.clone().predict_pair_one(request.into_inner(), model).await?))
    }

    type PredictStreamStream = Answers<pb::PredictResponse>;

    async fn predict_stream(&self, request: Request<Streaming<pb::PredictRequest>>) -> Result<Response<Self::PredictStreamStream>, Status> {
        Ok(each(self, request, |service, r: pb::PredictRequest, model| {
            service.predict_one(Value::String(r.inputs), r.truncate, r.truncation_direction, r.raw_scores, model)
        }))
    }

    type PredictPairStreamStream = Answers<pb::PredictResponse>;

    async fn predict_pair_stream(
        &self,
        request: Request<Streaming<pb::PredictPairRequest>>,
    ) -> Result<Response<Self::PredictPairStreamStream>, Status> {
        Ok(each(self, request, TeiService::predict_pair_one))
    }
}

#[tonic::async_trait]
impl pb::rerank_server::Rerank for TeiService {
    async fn rerank(&self, request: Request<pb::RerankRequest>) -> Result<Response<pb::RerankResponse>, Status> {
        let model = model_of(&request);
        let r = request.into_inner();
        if r.texts.is_empty() {
            return Err(Status::invalid_argument("`texts` cannot be empty"));
        }
        self.check_reranker(model.as_deref())?;
        let request = RerankRequest {
            query: r.query,
            texts: r.texts,
            truncate: Some(r.truncate),
            truncation_direction: direction(r.truncation_direction)?,
            raw_scores: r.raw_scores,
            return_text: r.return_text,
            model,
        };
        let (ranks, metadata) = measured(rerank_inner(&self.state, request)).await?;
        let ranks = ranks
            .into_iter()
            .map(|r| pb::Rank { index: u32::try_from(r.index).unwrap_or(u32::MAX), text: r.text, score: r.score })
            .collect();
        Ok(Response::new(pb::RerankResponse { ranks, metadata: Some(metadata) }))
    }

    /// TEI's client stream of (query, text) pairs, one ranking at the end: each pair is scored
    /// as it arrives, a window at once ([`super::stream::WINDOW`]); `raw_scores` and
    /// `return_text` are the first message's, as in TEI. Only the scores (and texts, when
    /// returned) are kept, so a long stream holds one number per pair.
    async fn rerank_stream(&self, request: Request<Streaming<pb::RerankStreamRequest>>) -> Result<Response<pb::RerankResponse>, Status> {
        let started = Instant::now();
        let model = model_of(&request);
        self.check_reranker(model.as_deref())?;
        let mut messages = request.into_inner();
        let mut running = tokio::task::JoinSet::new();
        let mut ranks = Vec::new();
        let mut done = TimingSnapshot::default();
        let mut first: Option<(bool, bool)> = None;
        let mut index = 0u32;
        let mut add = |answer: Result<Result<(pb::Rank, TimingSnapshot), Status>, tokio::task::JoinError>| -> Result<(), Status> {
            let (rank, work) = answer.map_err(|e| Status::internal(format!("the request's task failed: {e}")))??;
            ranks.push(rank);
            done.merge(&work);
            Ok(())
        };
        while let Some(message) = messages.message().await? {
            let (raw_scores, return_text) = *first.get_or_insert((message.raw_scores, message.return_text));
            let request = RerankRequest {
                query: message.query,
                texts: vec![message.text],
                truncate: Some(message.truncate),
                truncation_direction: direction(message.truncation_direction)?,
                raw_scores,
                return_text,
                model: model.clone(),
            };
            let state = self.state.clone();
            let at = index;
            running.spawn(TIMINGS.scope(RequestTimings::default(), async move {
                let mut ranks = rerank_inner(&state, request).await.map_err(Status::from)?;
                let rank = ranks.pop().ok_or_else(|| Status::internal("rerank results is missing values"))?;
                let rank = pb::Rank { index: at, text: rank.text, score: rank.score };
                Ok((rank, TIMINGS.with(RequestTimings::snapshot)))
            }));
            index += 1;
            if running.len() >= super::stream::WINDOW {
                if let Some(answer) = running.join_next().await {
                    add(answer)?;
                }
            }
        }
        while let Some(answer) = running.join_next().await {
            add(answer)?;
        }
        if ranks.is_empty() {
            return Err(Status::invalid_argument("`texts` cannot be empty"));
        }
        // TEI's order: by score, highest first, ties in reverse input order.
        ranks.sort_by(|a, b| a.score.total_cmp(&b.score).then(a.index.cmp(&b.index)));
        ranks.reverse();
        Ok(Response::new(pb::RerankResponse { ranks, metadata: Some(metadata(&done, started.elapsed())) }))
    }
}

#[tonic::async_trait]
impl pb::tokenize_server::Tokenize for TeiService {
    async fn tokenize(&self, request: Request<pb::EncodeRequest>) -> Result<Response<pb::EncodeResponse>, Status> {
        let model = model_of(&request);
        Ok(Response::new(self.clone().tokenize_one(request.into_inner(), model).await?))
    }

    type TokenizeStreamStream = Answers<pb::EncodeResponse>;

    async fn tokenize_stream(
        &self,
        request: Request<Streaming<pb::EncodeRequest>>,
    ) -> Result<Response<Self::TokenizeStreamStream>, Status> {
        Ok(each(self, request, TeiService::tokenize_one))
    }

    async fn decode(&self, request: Request<pb::DecodeRequest>) -> Result<Response<pb::DecodeResponse>, Status> {
        let model = model_of(&request);
        Ok(Response::new(self.clone().decode_one(request.into_inner(), model).await?))
    }

    type DecodeStreamStream = Answers<pb::DecodeResponse>;

    async fn decode_stream(&self, request: Request<Streaming<pb::DecodeRequest>>) -> Result<Response<Self::DecodeStreamStream>, Status> {
        Ok(each(self, request, TeiService::decode_one))
    }
}
