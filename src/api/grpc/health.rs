//! `grpc.health.v1.Health`, read from the server's state when asked (nothing to keep in step):
//! the whole server (`""`) serves when `/health` would answer 200; as in TEI, `tei.v1.Info` and
//! `tei.v1.Tokenize` serve whenever the server does, and `tei.v1.Embed`, `tei.v1.Predict` and
//! `tei.v1.Rerank` only when a served model is of a kind they answer (TEI marks the others
//! NOT_SERVING so that a client learns the call will always fail). Other names: NOT_FOUND.

use super::pb;
use crate::api::tei::Kind;
use crate::api::AppState;
use tokio_stream::wrappers::ReceiverStream;
use tonic::server::NamedService;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

/// How often a `Watch` looks at the state again.
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

pub fn server(state: AppState) -> HealthServer<StateHealth> {
    HealthServer::new(StateHealth { state })
}

pub struct StateHealth {
    state: AppState,
}

/// The services the status covers, as clients name them.
const SERVICES: [&str; 6] = [
    "",
    <pb::info_server::InfoServer<super::service::TeiService> as NamedService>::NAME,
    <pb::tokenize_server::TokenizeServer<super::service::TeiService> as NamedService>::NAME,
    <pb::embed_server::EmbedServer<super::service::TeiService> as NamedService>::NAME,
    <pb::predict_server::PredictServer<super::service::TeiService> as NamedService>::NAME,
    <pb::rerank_server::RerankServer<super::service::TeiService> as NamedService>::NAME,
];

impl StateHealth {
    /// The status of `service`, or `None` for a name we do not serve.
    fn status(&self, service: &str) -> Option<ServingStatus> {
        let position = SERVICES.iter().position(|s| *s == service)?;
        let Ok(engines) = self.state.engines() else { return Some(ServingStatus::NotServing) };
        if engines.iter().any(|e| e.check_alive().is_err()) {
            return Some(ServingStatus::NotServing);
        }
        let kinds: Vec<Option<Kind>> = engines.iter().map(|e| Kind::of(e.spec())).collect();
        let any = |wanted: &[Kind]| kinds.iter().any(|k| k.is_some_and(|k| wanted.contains(&k)));
        let serving = match position {
            0..=2 => true,
            3 => any(&[Kind::Embedding, Kind::Splade]),
            4 => any(&[Kind::Classifier, Kind::Reranker]),
            _ => any(&[Kind::Reranker]),
        };
        Some(if serving { ServingStatus::Serving } else { ServingStatus::NotServing })
    }
}

fn answer(status: ServingStatus) -> HealthCheckResponse {
    HealthCheckResponse { status: status.into() }
}

#[tonic::async_trait]
impl Health for StateHealth {
    async fn check(&self, request: Request<HealthCheckRequest>) -> Result<Response<HealthCheckResponse>, Status> {
        let service = request.into_inner().service;
        let status = self.status(&service).ok_or_else(|| Status::not_found("service not registered"))?;
        Ok(Response::new(answer(status)))
    }

    type WatchStream = ReceiverStream<Result<HealthCheckResponse, Status>>;

    /// The status now, then each change (looked at every [`WATCH_EVERY`]) until the client
    /// leaves; an unknown name is SERVICE_UNKNOWN, as the protocol asks.
    async fn watch(&self, request: Request<HealthCheckRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let service = request.into_inner().service;
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let health = StateHealth { state: self.state.clone() };
        tokio::spawn(async move {
            let mut last = None;
            loop {
                let now = health.status(&service).unwrap_or(ServingStatus::ServiceUnknown);
                if last != Some(now) {
                    if tx.send(Ok(answer(now))).await.is_err() {
                        break;
                    }
                    last = Some(now);
                }
                tokio::select! {
                    _ = tokio::time::sleep(WATCH_EVERY) => {}
                    _ = tx.closed() => break,
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
