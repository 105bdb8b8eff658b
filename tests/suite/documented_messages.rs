//! The error messages docs/api.md promises ("Messages to reproduce exactly"), each elicited
//! from the real router by a request of its own and held to the documented words (`{…}` stands
//! for any text). A promised message that no request here elicits fails, and so does a
//! request whose answer says something else: the page and the binary cannot drift apart.

use crate::common::*;
use axum::http::StatusCode;
use serde_json::{json, Value};

/// The list under "Messages to reproduce exactly": each line's message, from its first code
/// span (``…`` when the message holds a backtick).
fn documented() -> Vec<String> {
    let page = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/api.md")).unwrap();
    let list = page.split_once("Messages to reproduce exactly").expect("docs/api.md lists its messages").1;
    let lines = list.lines().skip_while(|l| !l.starts_with("- ")).take_while(|l| l.starts_with("- "));
    lines
        .map(|line| {
            let span = line.trim_start_matches("- ");
            let fence = if span.starts_with("``") { "``" } else { "`" };
            let rest = span.strip_prefix(fence).unwrap_or_else(|| panic!("no code span in {line:?}"));
            rest[..rest.find(fence).unwrap_or_else(|| panic!("unclosed code span in {line:?}"))].to_string()
        })
        .collect()
}

/// Whether `message` is `template` with each `{…}` standing for some text.
fn matches(template: &str, message: &str) -> bool {
    let mut pieces =
        template.split('{').enumerate().map(|(i, piece)| if i == 0 { piece } else { piece.split_once('}').map_or(piece, |p| p.1) });
    let first = pieces.next().unwrap_or_default();
    let Some(mut rest) = message.strip_prefix(first) else { return false };
    let pieces: Vec<&str> = pieces.collect();
    for (i, piece) in pieces.iter().enumerate() {
        let last = i + 1 == pieces.len();
        // Each stand-in takes at least one character, up to the next literal piece.
        let found = if last {
            rest.len().checked_sub(piece.len()).filter(|&at| at > 0 && rest.ends_with(piece))
        } else {
            rest.get(1..).and_then(|r| r.find(piece)).map(|at| at + 1)
        };
        match found {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    rest.is_empty()
}

/// A request that elicits one documented message: the fixture, how it is served, the route
/// and body, and the status.
struct Elicit {
    template: &'static str,
    model: &'static str,
    serve: fn(&mut poolserve::config::ServerConfig),
    route: &'static str,
    body: Value,
    status: StatusCode,
}

fn requests() -> Vec<Elicit> {
    let plain: fn(&mut poolserve::config::ServerConfig) = |_| {};
    let listed: fn(&mut poolserve::config::ServerConfig) = |c| {
        c.models[0].hf_overrides.insert("matryoshka_dimensions".into(), json!([8, 16]));
    };
    let bad = StatusCode::BAD_REQUEST;
    vec![
        Elicit {
            template: "This model's maximum context length is {L} tokens. However, your prompt contains {n} input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt.",
            model: "bert-embed-mean",
            serve: plain,
            route: "/v1/embeddings",
            body: json!({"input": "word ".repeat(200)}),
            status: bad,
        },
        Elicit {
            template: "This model's maximum context length is {L} tokens. However, your prompt contains {b} bytes (more than {limit} bytes, which is the upper bound for {L} input tokens). Please reduce the length of the input prompt.",
            model: "bert-embed-mean",
            serve: plain,
            route: "/v1/embeddings",
            body: json!({"input": "word ".repeat(2000)}),
            status: bad,
        },
        Elicit {
            template: "truncate_prompt_tokens value is greater than max_model_len. Please request a smaller truncation size.",
            model: "bert-embed-mean",
            serve: plain,
            route: "/v1/embeddings",
            body: json!({"input": "a", "truncate_prompt_tokens": 100000}),
            status: bad,
        },
        Elicit {
            template: "Model '{name}' does not support Matryoshka embeddings; dimensions must be unset (received dimensions={k}).",
            model: "bert-embed-mean",
            serve: plain,
            route: "/v1/embeddings",
            body: json!({"input": "a", "dimensions": 3}),
            status: bad,
        },
        Elicit {
            template: "Model '{name}' only supports dimensions in range [1, {size}], got {k}.",
            model: "bert-embed-mean",
            serve: listed,
            route: "/v1/embeddings",
            body: json!({"input": "a", "dimensions": 100000}),
            status: bad,
        },
        Elicit {
            template: "Model '{name}' only supports Matryoshka dimensions {list}, got {k}.",
            model: "bert-embed-mean",
            serve: listed,
            route: "/v1/embeddings",
            body: json!({"input": "a", "dimensions": 12}),
            status: bad,
        },
        Elicit {
            template: "Task '{task}' only supports {valid} parameters, does not support {invalid} parameters",
            model: "bert-seqcls",
            serve: plain,
            route: "/classify",
            body: json!({"input": "a", "dimensions": 8}),
            status: bad,
        },
        Elicit {
            template: "Input lengths must be either 1:1, 1:N or N:N",
            model: "bert-reranker",
            serve: plain,
            route: "/score",
            body: json!({"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}),
            status: bad,
        },
        Elicit {
            template: "The model does not support {api} API",
            model: "bert-seqcls",
            serve: |c| c.models[0].pooler.task = Some("token_classify".into()),
            route: "/classify",
            body: json!({"input": "a"}),
            status: StatusCode::NOT_IMPLEMENTED,
        },
        Elicit {
            template: "The model `{name}` does not exist.",
            model: "bert-embed-mean",
            serve: plain,
            route: "/v1/embeddings",
            body: json!({"input": "a", "model": "no-such-model"}),
            status: StatusCode::NOT_FOUND,
        },
    ]
}

#[test]
fn templates_match_what_they_stand_for() {
    assert!(matches("Task '{task}' only supports", "Task 'embed' only supports"));
    assert!(matches("got {k}.", "got 12."));
    assert!(!matches("got {k}.", "got ."), "a stand-in is some text");
    assert!(!matches("a {x} b", "a x c"));
    assert!(matches("exact", "exact") && !matches("exact", "exactly"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_message_is_one_the_server_sends() {
    let requests = requests();
    let promised = documented();
    assert!(promised.len() >= 10, "docs/api.md's list: {promised:?}");
    for template in &promised {
        let Some(case) = requests.iter().find(|r| r.template == template) else {
            panic!("docs/api.md promises {template:?}, which no request of this test elicits: add one, or mend the page");
        };
        let router = router(engine(&fixture_model(case.model), case.serve), 2_000_000);
        let reply = post(&router, case.route, case.body.clone()).await;
        assert_eq!(reply.status, case.status, "{template:?}: {}", reply.body);
        let message = reply.body["error"]["message"].as_str().or(reply.body["detail"].as_str()).unwrap_or_default();
        assert!(matches(template, message), "docs/api.md promises {template:?}; the server said {message:?}");
    }
    for case in &requests {
        assert!(promised.iter().any(|t| t == case.template), "{:?} is elicited here but no longer in docs/api.md", case.template);
    }
}
