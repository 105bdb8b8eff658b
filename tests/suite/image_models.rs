//! CLIP and SigLIP against transformers: pixel values from our processor, image and
//! text embeddings from our towers (alone, batched, and through the engine), and every
//! request form and refusal through the real router.

use crate::common::*;
use base64::Engine as _;
use poolserve::api::{self, ApiOptions, AppState};
use poolserve::engine::params::PoolingParams;
use poolserve::engine::Engine;
use poolserve::input::image::{preprocess, ImageLimits};
use poolserve::input::media::MediaOptions;
use poolserve::input::Prompt;
use poolserve::loader::options::ModelOptions;
use poolserve::pooling::PoolingOutput;
use poolserve::pooling::Task;
use serde_json::{json, Value};
use std::path::PathBuf;

// Each family in two shapes (tests/fixtures/make_image_models.py: CLIP_SHAPES, SIGLIP_SHAPES).
const MODELS: [&str; 4] = ["clip-tiny", "siglip-tiny", "clip-second-tiny", "siglip-second-tiny"];

fn image_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/images").join(name)
}

fn image_bytes(name: &str) -> Vec<u8> {
    std::fs::read(image_path(name)).expect("fixture image")
}

fn data_url(name: &str) -> String {
    let kind = match name.rsplit('.').next() {
        Some("jpg") => "jpeg",
        Some(other) => other,
        None => "png",
    };
    format!("data:image/{kind};base64,{}", base64::engine::general_purpose::STANDARD.encode(image_bytes(name)))
}

fn image_files(expected: &Value) -> Vec<String> {
    expected["images"].as_array().unwrap().iter().map(|i| i["file"].as_str().unwrap().to_string()).collect()
}

/// The image-embedding tolerance, cosine ≥ 0.999: images pass through a JPEG decoder and a
/// resize that may differ by a step from Pillow's, so the f32 text bar (0.9999) cannot hold.
fn assert_image_close(ours: &[f32], reference: &[f32], what: &str) {
    let cos = cosine(ours, reference);
    eprintln!("{what}: cosine {cos:.7}");
    assert!(cos >= 0.999, "{what}: cosine {cos}");
}

async fn embed(engine: &Engine, prompts: Vec<Prompt>) -> Vec<Vec<f32>> {
    let params = PoolingParams::default().verify(Task::Embed, engine.spec()).unwrap();
    let (outputs, _) = engine.encode(prompts, &params).await.expect("embeds");
    outputs
        .into_iter()
        .map(|o| match o {
            PoolingOutput::Vector(v) => v,
            other => panic!("not a vector: {other:?}"),
        })
        .collect()
}

#[test]
fn processor_matches_transformers_pixel_values() {
    for model in MODELS {
        let expected = expected(model);
        let loaded = poolserve::loader::load(&ModelOptions::for_model(fixture_model(model).to_str().unwrap())).expect("loads");
        let Some(poolserve::loader::VisionInput::Pooled { processor, .. }) = loaded.vision else {
            panic!("{model}: no pooled vision side")
        };
        for image in expected["images"].as_array().unwrap() {
            let file = image["file"].as_str().unwrap();
            let ours = preprocess(&image_bytes(file), &processor, &ImageLimits { max_pixels: 1 << 30 }).expect("preprocesses");
            let reference = floats(&image["pixel_values"]);
            let diff = max_abs_diff(&ours.normalized(), &reference);
            eprintln!("{model} {file}: pixel values max abs diff {diff}");
            // PNG: Pillow-exact. WebP: Pillow 13 runs some shrink-both-sides resizes vertical
            // pass first (a rule we could not recover; ±1–2 levels on some pixels). JPEG: that,
            // plus zune-jpeg's chroma upsampling rounding, which differs from libjpeg-turbo's by
            // up to 4 levels (2e-2 is not reached there; see input/image/mod.rs).
            let tolerance = match file.rsplit('.').next() {
                Some("png") => 1e-6,
                Some("webp") => 2e-2,
                _ => 5e-2,
            };
            assert!(diff <= tolerance, "{model} {file}: pixel values differ by {diff} (tolerance {tolerance})");
        }
    }
}

#[test]
fn vision_towers_match_transformers_on_its_pixel_values() {
    for model in MODELS {
        let expected = expected(model);
        let loaded = poolserve::loader::load(&ModelOptions::for_model(fixture_model(model).to_str().unwrap())).expect("loads");
        let Some(poolserve::loader::VisionInput::Pooled { tower, .. }) = loaded.vision else { panic!("{model}: no pooled vision side") };
        let images = expected["images"].as_array().unwrap();
        let mut all = Vec::new();
        for image in images {
            let pixels = floats(&image["pixel_values"]);
            let ours = tower.forward(&pixels, 1).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_close(&ours, &floats(&image["image_embeds"]), &format!("{model} {} image_embeds", image["file"]));
            all.extend(pixels);
        }
        // One dense batch of every image equals the single runs.
        let batched = tower.forward(&all, images.len()).unwrap().to_vec2::<f32>().unwrap();
        for (row, image) in batched.iter().zip(images) {
            assert_close(row, &floats(&image["image_embeds"]), &format!("{model} {} batched", image["file"]));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_embeds_texts_and_images_like_transformers() {
    for model in MODELS {
        let expected = expected(model);
        let engine = engine(&fixture_model(model), |_| {});
        assert_eq!(engine.spec().tasks, vec![Task::Embed], "{model}");
        let texts = expected["texts"].as_array().unwrap();
        let files = image_files(&expected);
        for text in texts {
            let t = text["text"].as_str().unwrap();
            let ours = &embed(&engine, vec![Prompt::Text(t.into())]).await[0];
            assert_close(ours, &floats(&text["text_embeds_normalized"]), &format!("{model} text {t:?}"));
        }
        for (file, image) in files.iter().zip(expected["images"].as_array().unwrap()) {
            let ours = &embed(&engine, vec![Prompt::Image(image_bytes(file))]).await[0];
            assert_image_close(ours, &floats(&image["image_embeds_normalized"]), &format!("{model} image {file}"));
        }
        // Texts and images mixed in one request, interleaved: the same vectors, in input order.
        let mut prompts = Vec::new();
        for (text, file) in texts.iter().zip(&files) {
            prompts.push(Prompt::Text(text["text"].as_str().unwrap().into()));
            prompts.push(Prompt::Image(image_bytes(file)));
        }
        let mixed = embed(&engine, prompts).await;
        for (i, (text, image)) in texts.iter().zip(expected["images"].as_array().unwrap()).enumerate() {
            assert_close(&mixed[2 * i], &floats(&text["text_embeds_normalized"]), &format!("{model} mixed text {i}"));
            assert_image_close(&mixed[2 * i + 1], &floats(&image["image_embeds_normalized"]), &format!("{model} mixed image {i}"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_tokens_match_the_reference_tokenizer() {
    for model in MODELS {
        let expected = expected(model);
        let engine = engine(&fixture_model(model), |_| {});
        for check in expected["tokenizer_checks"].as_array().unwrap() {
            let text = check["text"].as_str().unwrap();
            let options = poolserve::input::tokenizer::EncodeOptions {
                add_special_tokens: true,
                truncate_to: None,
                side: poolserve::input::tokenizer::TruncationSide::Right,
                pair_limits: Default::default(),
            };
            let options = poolserve::input::InputOptions { encode: options, prompt: None, pad_to_max_length: false, max_len: usize::MAX };
            let ours = engine.input().tokenize(text.to_string(), &options).await.unwrap();
            let reference: Vec<u32> = check["input_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
            assert_eq!(ours.ids, reference, "{model} {text:?}");
        }
    }
}

fn router_with(model: &str, media: MediaOptions, tweak: impl FnOnce(&mut poolserve::config::ServerConfig)) -> axum::Router {
    let state = AppState::ready_with(engine(&fixture_model(model), tweak), ApiOptions { media, ..Default::default() });
    api::router(state, 2_000_000)
}

fn image_message(url: &str) -> Value {
    json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_form_embeds_images() {
    for model in MODELS {
        let expected = expected(model);
        let router = router_with(model, MediaOptions::default(), |_| {});
        let files = image_files(&expected);
        let images = expected["images"].as_array().unwrap();
        let text = &expected["texts"][0];
        let reference_text = floats(&text["text_embeds_normalized"]);

        // vLLM: /v1/embeddings and /pooling with messages, one embedding per message.
        let messages =
            json!([image_message(&data_url(&files[0])), {"role": "user", "content": text["text"]}, image_message(&data_url(&files[1]))]);
        for route in ["/v1/embeddings", "/pooling"] {
            let reply = post(&router, route, json!({"messages": messages})).await;
            assert_eq!(reply.status, 200, "{model} {route}: {}", reply.body);
            let field = if route == "/pooling" { "data" } else { "embedding" };
            let data = reply.body["data"].as_array().unwrap();
            assert_eq!(data.len(), 3);
            assert_image_close(
                &floats(&data[0][field]),
                &floats(&images[0]["image_embeds_normalized"]),
                &format!("{model} {route} image 0"),
            );
            assert_close(&floats(&data[1][field]), &reference_text, &format!("{model} {route} text"));
            assert_image_close(
                &floats(&data[2][field]),
                &floats(&images[1]["image_embeds_normalized"]),
                &format!("{model} {route} image 1"),
            );
            assert!(reply.body["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
        }
        // Text input works as before.
        let reply = post(&router, "/v1/embeddings", json!({"input": [text["text"]]})).await;
        assert_eq!(reply.status, 200);
        assert_close(&floats(&reply.body["data"][0]["embedding"]), &reference_text, &format!("{model} input"));

        // Cohere: images (input_type image) and inputs with content parts.
        let urls: Vec<String> = files.iter().map(|f| data_url(f)).collect();
        let reply = post(&router, "/v2/embed", json!({"images": urls, "input_type": "image", "embedding_types": ["float"]})).await;
        assert_eq!(reply.status, 200, "{model} /v2/embed images: {}", reply.body);
        for (row, image) in reply.body["embeddings"]["float"].as_array().unwrap().iter().zip(images) {
            assert_image_close(&floats(row), &floats(&image["image_embeds_normalized"]), &format!("{model} cohere images"));
        }
        let inputs = json!([
            {"content": [{"type": "image_url", "image_url": {"url": urls[2]}}]},
            {"content": [{"type": "text", "text": text["text"]}]},
        ]);
        let reply = post(&router, "/v2/embed", json!({"inputs": inputs, "input_type": "search_document"})).await;
        assert_eq!(reply.status, 200, "{model} /v2/embed inputs: {}", reply.body);
        let rows = reply.body["embeddings"]["float"].as_array().unwrap();
        assert_image_close(&floats(&rows[0]), &floats(&images[2]["image_embeds_normalized"]), &format!("{model} cohere inputs image"));
        assert_close(&floats(&rows[1]), &reference_text, &format!("{model} cohere inputs text"));
        assert_eq!(reply.body["texts"], json!([text["text"]]));

        // /score: a text against images (cosine, as transformers' normalized features give).
        let content: Vec<Value> = urls.iter().map(|u| json!({"type": "image_url", "image_url": {"url": u}})).collect();
        let reply = post(&router, "/score", json!({"text_1": text["text"], "text_2": one_part_documents(&content)})).await;
        assert_eq!(reply.status, 200, "{model} /score: {}", reply.body);
        let scores: Vec<f32> = reply.body["data"].as_array().unwrap().iter().map(|d| d["score"].as_f64().unwrap() as f32).collect();
        let reference = floats(&expected["cosine_text_x_image"][0]);
        let diff = max_abs_diff(&scores, &reference);
        assert!(diff <= 2e-3, "{model} /score text x images: {scores:?} vs {reference:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_images_and_urls_are_refused_with_400() {
    let router = router_with("clip-tiny", MediaOptions::default(), |c| c.engine.max_image_pixels = 4000);
    let garbage = format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(b"not an image at all"));
    let truncated = {
        let bytes = image_bytes("gradient_97x61.png");
        format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(&bytes[..bytes.len() / 2]))
    };
    let image = json!({"type": "image_url", "image_url": {"url": data_url("gray_19x25.png")}});
    let cases = [
        ("garbage", json!({"messages": [image_message(&garbage)]})),
        ("truncated", json!({"messages": [image_message(&truncated)]})),
        // 97×61 = 5,917 pixels, over the limit of 4,000.
        ("too many pixels", json!({"messages": [image_message(&data_url("gradient_97x61.png"))]})),
        ("not base64", json!({"messages": [image_message("data:image/png,abc")]})),
        ("not an image type", json!({"messages": [image_message("data:text/plain;base64,aGVsbG8=")]})),
        ("host not allowed", json!({"messages": [image_message("https://example.com/cat.png")]})),
        ("file url", json!({"messages": [image_message("file:///etc/passwd")]})),
        ("text and image", json!({"messages": [{"role": "user", "content": [image, {"type": "text", "text": "a"}]}]})),
        ("two images", json!({"messages": [{"role": "user", "content": [image, image]}]})),
        ("input and messages", json!({"input": "a", "messages": [image_message(&data_url("gray_19x25.png"))]})),
        ("no content", json!({"messages": [{"role": "user"}]})),
        ("empty messages", json!({"messages": []})),
    ];
    for (what, body) in cases {
        let reply = post(&router, "/v1/embeddings", body).await;
        assert_eq!(reply.status, 400, "{what}: {}", reply.body);
        assert!(reply.body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}: {}", reply.body);
    }
    // A strip of 1001×1 pixels: over the 1000:1 aspect ratio.
    let strip = {
        let mut png = std::io::Cursor::new(Vec::new());
        image::RgbImage::new(1001, 1).write_to(&mut png, image::ImageFormat::Png).unwrap();
        format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(png.into_inner()))
    };
    let reply = post(&router, "/v1/embeddings", json!({"messages": [image_message(&strip)]})).await;
    assert_eq!(reply.status, 400, "strip: {}", reply.body);
    assert!(reply.body["error"]["message"].as_str().unwrap().contains("1000:1"), "{}", reply.body);
    // The small image within the limit still embeds, after all those refusals.
    let reply = post(&router, "/v1/embeddings", json!({"messages": [image_message(&data_url("gray_19x25.png"))]})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);

    // A text model refuses images on every route.
    let text_router = api::router(AppState::ready(engine(&fixture_model("bert-embed-mean"), |_| {})), 2_000_000);
    let url = data_url("gray_19x25.png");
    for (route, body) in [
        ("/v1/embeddings", json!({"messages": [image_message(&url)]})),
        ("/v2/embed", json!({"images": [url], "input_type": "image"})),
        ("/score", json!({"text_1": "a", "text_2": {"content": [{"type": "image_url", "image_url": {"url": url}}]}})),
    ] {
        let reply = post(&text_router, route, body).await;
        assert_eq!(reply.status, 400, "{route}: {}", reply.body);
        // /score in vLLM's words for a model without media.
        let said = reply.body["error"]["message"].as_str().unwrap();
        assert!(said.contains("image") || said == "MultiModalParam is not supported for BertModel", "{route}: {}", reply.body);
    }
}

/// A one-shot HTTP server on 127.0.0.1 answering every request with `status` and `body`
/// (and a Location header for redirects).
async fn serve_once(status: u16, body: Vec<u8>) -> u16 {
    serve_slowly(status, std::time::Duration::ZERO, body).await
}

/// [`serve_once`] answering `delay` after each request, each connection on its own task (so
/// concurrent fetches overlap).
async fn serve_slowly(status: u16, delay: std::time::Duration, body: Vec<u8>) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut buffer = [0u8; 4096];
                let _ = socket.read(&mut buffer).await;
                tokio::time::sleep(delay).await;
                let head = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: image/png\r\ncontent-length: {}\r\nlocation: http://127.0.0.2/elsewhere.png\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = socket.write_all(head.as_bytes()).await;
                let _ = socket.write_all(&body).await;
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urls_of_allowed_hosts_are_fetched_within_limits() {
    let expected = expected("clip-tiny");
    let image = image_bytes("gray_19x25.png");
    let ok = serve_once(200, image.clone()).await;
    let redirect = serve_once(302, Vec::new()).await;
    let missing = serve_once(404, Vec::new()).await;
    let large = serve_once(200, vec![0u8; 200_000]).await;
    // A bare host allows its default port only; these servers' ports are allowed one by one.
    let mut allowed: Vec<String> = [ok, redirect, missing, large].iter().map(|p| format!("127.0.0.1:{p}")).collect();
    allowed.push("localhost".into());
    let media = MediaOptions { allowed_domains: allowed, fetch_timeout: std::time::Duration::from_secs(5), max_bytes: 100_000 };
    let router = router_with("clip-tiny", media, |_| {});
    let reply = post(&router, "/v1/embeddings", json!({"messages": [image_message(&format!("http://127.0.0.1:{ok}/gray.png"))]})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let gray = expected["images"].as_array().unwrap().iter().find(|i| i["file"] == "gray_19x25.png").unwrap();
    assert_image_close(&floats(&reply.body["data"][0]["embedding"]), &floats(&gray["image_embeds_normalized"]), "fetched image");

    for (what, url) in [
        ("redirect", format!("http://127.0.0.1:{redirect}/a.png")),
        ("404", format!("http://127.0.0.1:{missing}/a.png")),
        ("over max_bytes", format!("http://127.0.0.1:{large}/a.png")),
        ("other host", format!("http://127.0.0.2:{ok}/a.png")),
        ("allowed host, port not allowed", format!("http://localhost:{ok}/a.png")),
    ] {
        let reply = post(&router, "/v1/embeddings", json!({"messages": [image_message(&url)]})).await;
        assert_eq!(reply.status, 400, "{what}: {}", reply.body);
    }
}

/// A request's image URLs are fetched together under one deadline: 16 images that each take
/// 0.6 s arrive within a 2 s `--media-fetch-timeout` (one after another they would take 9.6 s
/// and miss it); a host that answers later than the deadline fails the request with a 400
/// naming the deadline, in about that time rather than once per image.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requests_image_urls_are_fetched_together_under_one_deadline() {
    let image = image_bytes("gray_19x25.png");
    let slow = serve_slowly(200, std::time::Duration::from_millis(600), image.clone()).await;
    let stuck = serve_slowly(200, std::time::Duration::from_secs(30), image).await;
    let allowed = vec![format!("127.0.0.1:{slow}"), format!("127.0.0.1:{stuck}")];
    let media = MediaOptions { allowed_domains: allowed, fetch_timeout: std::time::Duration::from_secs(2), max_bytes: 100_000 };
    let router = router_with("clip-tiny", media, |_| {});
    let urls: Vec<String> = (0..16).map(|i| format!("http://127.0.0.1:{slow}/{i}.png")).collect();
    let reply = post(&router, "/v2/embed", json!({"images": urls, "input_type": "image", "embedding_types": ["float"]})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.body["embeddings"]["float"].as_array().unwrap().len(), 16);

    let messages: Vec<Value> = (0..3).map(|i| image_message(&format!("http://127.0.0.1:{stuck}/{i}.png"))).collect();
    let reply = post(&router, "/v1/embeddings", json!({"messages": messages})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    let message = reply.body["error"]["message"].as_str().unwrap();
    assert!(message.contains("took longer than") || message.contains("timed out") || message.contains("timeout"), "{message}");
}

/// The per-request pixel budget: with `--max-batch-tokens 150` a batch holds five clip-tiny
/// images (26 tokens each), so a request decodes them two at a time (half a batch). A request
/// of eleven images with texts between them is cut into six waves in order, and answers as
/// transformers does, in order, with the same usage as in one wave; an image that is refused
/// late in the request is found from the headers before any wave runs, and named by its place
/// in the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_decodes_its_images_a_wave_at_a_time() {
    let expected = expected("clip-tiny");
    let files = image_files(&expected);
    let references = expected["images"].as_array().unwrap();
    let text = &expected["texts"][0];
    let small = engine(&fixture_model("clip-tiny"), |c| c.engine.max_batch_tokens = Some(150));
    let mut prompts = Vec::new();
    let mut order = Vec::new();
    for i in 0..11 {
        prompts.push(Prompt::Image(image_bytes(&files[i % files.len()])));
        order.push(Some(i % files.len()));
        if i % 4 == 0 {
            prompts.push(Prompt::Text(text["text"].as_str().unwrap().into()));
            order.push(None);
        }
    }
    let waves = small.input().waves(prompts.clone()).await.expect("cuts into waves");
    let images_per_wave: Vec<usize> = waves.iter().map(|w| w.prompts().iter().filter(|p| matches!(p, Prompt::Image(_))).count()).collect();
    assert_eq!(images_per_wave, vec![2, 2, 2, 2, 2, 1]);
    assert_eq!(waves.iter().flat_map(|w| w.prompts().iter().cloned()).collect::<Vec<_>>(), prompts, "the request's order");

    let params = PoolingParams::default().verify(Task::Embed, small.spec()).unwrap();
    let (outputs, tokens) = small.encode(prompts.clone(), &params).await.expect("embeds");
    assert_eq!(outputs.len(), order.len());
    for (i, (output, source)) in outputs.iter().zip(&order).enumerate() {
        let PoolingOutput::Vector(ours) = output else { panic!("not a vector: {output:?}") };
        match source {
            Some(image) => assert_image_close(ours, &floats(&references[*image]["image_embeds_normalized"]), &format!("input {i}")),
            None => assert_close(ours, &floats(&text["text_embeds_normalized"]), &format!("input {i}")),
        }
    }
    let whole = engine(&fixture_model("clip-tiny"), |_| {});
    assert_eq!(whole.input().waves(prompts.clone()).await.unwrap().len(), 1, "the default budget takes eleven images at once");
    let (_, whole_tokens) = whole.encode(prompts.clone(), &params).await.expect("embeds");
    assert_eq!(tokens, whole_tokens, "usage");

    // Image 9 (of 11) is not an image: refused from the headers, by its place in the request.
    let mut bad = prompts.clone();
    let ninth = bad.iter().enumerate().filter(|(_, p)| matches!(p, Prompt::Image(_))).nth(9).unwrap().0;
    bad[ninth] = Prompt::Image(b"not an image at all".to_vec());
    let error = small.input().waves(bad.clone()).await.expect_err("refused before decoding").to_string();
    assert!(error.starts_with("image 9: "), "{error}");
    let router = api::router(AppState::ready(small), 2_000_000);
    let images: Vec<Value> = bad
        .iter()
        .filter_map(|p| match p {
            Prompt::Image(bytes) => {
                Some(json!(format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(bytes))))
            }
            _ => None,
        })
        .collect();
    let reply = post(&router, "/v2/embed", json!({"images": images, "input_type": "image", "embedding_types": ["float"]})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert!(reply.body.to_string().contains("image 9: "), "{}", reply.body);
}

#[test]
fn chunked_processing_is_refused_for_image_text_models() {
    let config = config_for(&fixture_model("clip-tiny"), |c| {
        c.models[0].pooler = serde_json::from_value(json!({"enable_chunked_processing": true, "max_embed_len": 1000})).unwrap();
    });
    let error = Engine::load(&config.models[0], &config.engine).err().expect("load fails").to_string();
    assert!(error.contains("chunked processing does not apply to image-text models"), "{error}");
}

/// A CLIP folder as transformers 5 saves it: the image processor nested in
/// `processor_config.json` (tests/fixtures/transformers5, written by
/// tests/fixtures/make_encoder_families.py) and no `preprocessor_config.json`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transformers5_processor_config_is_read() {
    let dir = std::env::temp_dir().join(format!("poolserve-t5-clip-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(fixture_model("clip-tiny")).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != "preprocessor_config.json" {
            std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
        }
    }
    let saved = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/transformers5/clip-tiny/processor_config.json");

    // Neither file: one message naming both.
    let config = config_for(&dir, |_| {});
    let error = Engine::load(&config.models[0], &config.engine).err().expect("load fails").to_string();
    assert!(error.contains("the model has no preprocessor_config.json or processor_config.json"), "{error}");

    std::fs::copy(saved, dir.join("processor_config.json")).unwrap();
    let expected = expected("clip-tiny");
    let router = api::router(AppState::ready_with(engine(&dir, |_| {}), ApiOptions::default()), 2_000_000);
    let files = image_files(&expected);
    let reply = post(&router, "/v1/embeddings", json!({"messages": [image_message(&data_url(&files[0]))]})).await;
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_image_close(
        &floats(&reply.body["data"][0]["embedding"]),
        &floats(&expected["images"][0]["image_embeds_normalized"]),
        "clip-tiny saved by transformers 5",
    );
}
