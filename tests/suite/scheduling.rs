//! vLLM's `priority` and `--scheduling-policy` through the real router: every pooling route
//! takes the field; under `fcfs` (the default) anything but 0 is refused with vLLM's message,
//! under `priority` it is served.

use crate::common::*;
use axum::http::StatusCode;
use poolserve::engine::SchedulingPolicy;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_needs_the_priority_policy_on_every_route() {
    let bodies = |priority: i64| {
        [
            ("/v1/embeddings", json!({"input": "a", "priority": priority})),
            ("/pooling", json!({"input": "a", "priority": priority})),
            ("/classify", json!({"input": "a", "priority": priority})),
            ("/score", json!({"text_1": "a", "text_2": "b", "priority": priority})),
            ("/rerank", json!({"query": "a", "documents": ["b", "c"], "priority": priority})),
        ]
    };
    for policy in [SchedulingPolicy::Fcfs, SchedulingPolicy::Priority] {
        let embedder = router(engine(&fixture_model("bert-embed-mean"), |c| c.engine.scheduling_policy = policy), 2_000_000);
        let reranker = router(engine(&fixture_model("bert-reranker"), |c| c.engine.scheduling_policy = policy), 2_000_000);
        for priority in [0, 1, -3] {
            for (route, body) in bodies(priority) {
                let on = if route == "/v1/embeddings" || route == "/pooling" { &embedder } else { &reranker };
                let reply = post(on, route, body).await;
                if priority == 0 || policy == SchedulingPolicy::Priority {
                    assert_eq!(reply.status, StatusCode::OK, "{route} priority {priority} under {policy:?}: {}", reply.body);
                } else {
                    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{route}: {}", reply.body);
                    let message = format!("Got priority {priority} but Priority scheduling is not enabled.");
                    assert_eq!(reply.body["error"]["message"], message.as_str(), "{route}");
                    assert_eq!(reply.body["error"]["param"], "priority", "{route}");
                }
            }
        }
    }
}
