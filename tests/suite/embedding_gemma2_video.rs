//! EmbeddingGemma 2's video side against transformers 5.24 (generator:
//! tests/fixtures/make_embedding_gemma2.py, which writes the H.264 MP4s of
//! tests/fixtures/video/ with PyAV's libx264 and loads them back with transformers'
//! `load_video`, PyAV backend, and the video processor's own frame sampling):
//! - `EmbeddingGemma2Model`'s embeddings of each video alone (`<bos>` then per sampled frame
//!   `<|image> <|video|>×n <image|>`), both in one request, and with text and an image in one
//!   input, over HTTP as vLLM clients send video (`video_url` content parts);
//! - the timestamped prompt (`add_timestamps`) tokenized as the processor tokenizes it;
//! - hostile and unsupported video, and models that take no video.
//!
//! The frame decoding itself (every sampled frame's RGB equal to PyAV's) is the unit test
//! `input::video::tests::fixture_videos_match_pyav_and_the_processor`.

use crate::common::families::router_for;
use crate::common::*;
use base64::Engine;
use poolserve::input::video::{self, VideoLimits};
use serde_json::{json, Value};

fn video_bytes(file: &str) -> Vec<u8> {
    std::fs::read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/video").join(file)).unwrap()
}

fn video_part(bytes: &[u8]) -> Value {
    json!({"type": "video_url", "video_url": {"url": format!("data:video/mp4;base64,{}", base64::engine::general_purpose::STANDARD.encode(bytes))}})
}

fn message(content: Vec<Value>) -> Value {
    json!({"role": "user", "content": content})
}

/// The fixture's video processor (the folder's `processor_config.json`).
fn video_config() -> video::VideoConfig {
    let folder = fixture_model("embeddinggemma2-omni");
    let processor: Value = serde_json::from_str(&std::fs::read_to_string(folder.join("processor_config.json")).unwrap()).unwrap();
    video::VideoConfig::from_json(&processor["video_processor"], (4, 2)).unwrap()
}

/// Videos over HTTP as vLLM clients send them, against `EmbeddingGemma2Model` on
/// transformers' own loading and processing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn video_embeds_over_http_as_transformers_embeds_it() {
    let expected = expected("embeddinggemma2-omni");
    let router = router_for(&fixture_model("embeddinggemma2-omni"));
    let cases = expected["video"].as_array().unwrap();
    let max_len = 256; // the fixture's max_position_embeddings
                       // Each video alone through /v1/embeddings; the 40-second one samples 32 frames, 2,113
                       // tokens, past the fixture's 256 positions: refused as an over-long input is.
    let mut fitting = Vec::new();
    for case in cases {
        let file = case["file"].as_str().unwrap();
        let reply = post(&router, "/v1/embeddings", json!({"messages": [message(vec![video_part(&video_bytes(file))])]})).await;
        if case["input_ids"].as_array().unwrap().len() > max_len {
            assert_eq!(reply.status, 400, "{file}: {}", reply.body);
            assert!(reply.body.to_string().contains("maximum context length is 256"), "{}", reply.body);
            continue;
        }
        assert_eq!(reply.status, 200, "{file}: {}", reply.body);
        let c = cosine(&floats(&reply.body["data"][0]["embedding"]), &floats(&case["embedding"]));
        eprintln!("{file}: cosine {c:.7} to transformers");
        assert!(c >= 0.9999, "{file}: cosine {c}");
        fitting.push(case);
    }
    assert_eq!(fitting.len(), 2);
    // Both in one request, one batch: each as alone.
    let messages: Vec<Value> = fitting.iter().map(|c| message(vec![video_part(&video_bytes(c["file"].as_str().unwrap()))])).collect();
    let reply = post(&router, "/v1/embeddings", json!({"messages": messages})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    for (i, case) in fitting.iter().enumerate() {
        let c = cosine(&floats(&reply.body["data"][i]["embedding"]), &floats(&case["embedding"]));
        assert!(c >= 0.9999, "batched {i}: cosine {c}");
    }
    // Text, video and an image in one input: the parts joined with a newline.
    for (i, case) in expected["video_interleaved"].as_array().unwrap().iter().enumerate() {
        let content: Vec<Value> = case["parts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| match (p.get("video"), p.get("image")) {
                (Some(file), _) => video_part(&video_bytes(file.as_str().unwrap())),
                (_, Some(file)) => {
                    let png = std::fs::read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/images").join(file.as_str().unwrap())).unwrap();
                    json!({"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(png))}})
                }
                _ => json!({"type": "text", "text": p["text"]}),
            })
            .collect();
        let reply = post(&router, "/v1/embeddings", json!({"messages": [message(content)]})).await;
        assert_eq!(reply.status, 200, "interleaved {i}: {}", reply.body);
        let c = cosine(&floats(&reply.body["data"][0]["embedding"]), &floats(&case["embedding"]));
        eprintln!("interleaved {i}: cosine {c:.7}");
        assert!(c >= 0.9999, "interleaved {i}: cosine {c}");
    }
    // /score: a text against video documents is the cosine of their embeddings.
    let text = &expected["texts"][0];
    let content: Vec<Value> = fitting.iter().map(|c| video_part(&video_bytes(c["file"].as_str().unwrap()))).collect();
    let reply = post(&router, "/score", json!({"text_1": text["text"], "text_2": one_part_documents(&content)})).await;
    assert_eq!(reply.status, 200, "/score: {}", reply.body);
    for (i, case) in fitting.iter().enumerate() {
        let want = cosine(&floats(&text["embedding"]), &floats(&case["embedding"])) as f32;
        let got = reply.body["data"][i]["score"].as_f64().unwrap() as f32;
        assert!((got - want).abs() <= 1e-4, "/score video {i}: {got} vs {want}");
    }
    // Cohere's /v2/embed `inputs` (superset): a video part in an input's content.
    let inputs: Vec<Value> = fitting.iter().map(|c| json!({"content": [video_part(&video_bytes(c["file"].as_str().unwrap()))]})).collect();
    let reply = post(&router, "/v2/embed", json!({"inputs": inputs, "embedding_types": ["float"]})).await;
    assert_eq!(reply.status, 200, "/v2/embed inputs with video: {}", reply.body);
    for (i, case) in fitting.iter().enumerate() {
        let c = cosine(&floats(&reply.body["embeddings"]["float"][i]), &floats(&case["embedding"]));
        assert!(c >= 0.9999, "cohere video {i}: cosine {c}");
    }
    // The video placeholder typed as text cannot stand for frames.
    let forged = vec![json!({"type": "text", "text": "<|video|>"}), video_part(&video_bytes(fitting[1]["file"].as_str().unwrap()))];
    let reply = post(&router, "/v1/embeddings", json!({"messages": [message(forged)]})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert!(reply.body.to_string().contains("video placeholder"), "{}", reply.body);
}

/// With `add_timestamps`, each frame is preceded by its `mm:ss` and the frames are joined by
/// spaces: our text, tokenized by the fixture's tokenizer, is the processor's token ids.
#[test]
fn timestamped_prompts_tokenize_as_the_processor_does() {
    let expected = expected("embeddinggemma2-omni");
    let tokenizer = tokenizers::Tokenizer::from_file(fixture_model("embeddinggemma2-omni").join("tokenizer.json")).unwrap();
    let config = video::VideoConfig { add_timestamps: true, ..video_config() };
    for case in expected["video"].as_array().unwrap() {
        let file = case["file"].as_str().unwrap();
        let frames = video::preprocess(&video_bytes(file), &config, &VideoLimits::default()).unwrap();
        let text = video::video_text(&frames, &config, ["<|image>", "<|video|>", "<image|>"]);
        let ids = tokenizer.encode(text, true).unwrap().get_ids().to_vec();
        let want: Vec<u32> = case["input_ids_with_timestamps"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        assert_eq!(ids, want, "{file}");
        // And without: the frames back to back.
        let plain = video::video_text(&frames, &video_config(), ["<|image>", "<|video|>", "<image|>"]);
        let want: Vec<u32> = case["input_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        assert_eq!(tokenizer.encode(plain, true).unwrap().get_ids(), want.as_slice(), "{file}");
    }
}

/// Hostile, broken and unsupported video: each a 400 that says why, before decoding where
/// the header tells, and the server serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_video_is_refused_with_its_reason() {
    let router = router_for(&fixture_model("embeddinggemma2-omni"));
    let good = video_bytes("pattern_100x60_5fps_high_bframes.mp4");
    // A sample table declaring four billion frames of a fixed size (a 20-byte `stsz`): refused
    // from the table, before re_mp4 would build it.
    let mut bomb = video_bytes("pattern_32x32_2fps_40s_main.mp4");
    let stsz = bomb.windows(4).position(|w| w == b"stsz").unwrap();
    bomb[stsz + 8..stsz + 12].copy_from_slice(&64u32.to_be_bytes()); // every sample 64 bytes
    bomb[stsz + 12..stsz + 16].copy_from_slice(&u32::MAX.to_be_bytes());
    let truncated = good[..good.len() / 2].to_vec();
    let mut cut_frame = good.clone();
    let mdat = cut_frame.windows(4).position(|w| w == b"mdat").unwrap();
    for b in &mut cut_frame[mdat + 4..mdat + 400] {
        *b = 0xff; // the first frames' NAL length prefixes and data
    }
    for (bytes, words) in [
        (b"definitely not a video".to_vec(), "not an MP4 file"),
        (bomb, "--max-video-frames"),
        (truncated, "video"),
        (cut_frame, "video"),
        (video_bytes("pattern_32x32_mpeg4.mp4"), "no H.264 (AVC) video track"),
        (video_bytes("pattern_32x32_h264_444.mp4"), "4:4:4 chroma"),
    ] {
        let reply = post(&router, "/v1/embeddings", json!({"messages": [message(vec![video_part(&bytes)])]})).await;
        assert_eq!(reply.status, 400, "{words}: {}", reply.body);
        assert!(reply.body.to_string().contains(words), "expected `{words}` in {}", reply.body);
    }
    // A data URL that is not video, and a host not allowed.
    let not_video = json!({"type": "video_url", "video_url": {"url": "data:image/png;base64,AAAA"}});
    let reply = post(&router, "/v1/embeddings", json!({"messages": [message(vec![not_video])]})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert!(reply.body.to_string().contains("is not video"), "{}", reply.body);
    let remote = json!({"type": "video_url", "video_url": {"url": "https://example.com/a.mp4"}});
    let reply = post(&router, "/v1/embeddings", json!({"messages": [message(vec![remote])]})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert!(reply.body.to_string().contains("video URL's host"), "{}", reply.body);
    // Video can only be embedded.
    let reply = post(&router, "/pooling", json!({"messages": [message(vec![video_part(&good)])], "task": "token_embed"})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    // The frame budget counts what the file holds: 12 frames against a budget of 10.
    let limits = VideoLimits { max_frames: 10, ..Default::default() };
    let err = video::check_header(&good, &limits).unwrap_err();
    assert!(err.to_string().contains("holds 12 frames"), "{err}");
    assert!(video::check_header(&good, &VideoLimits::default()).is_ok());
    // And the server serves on.
    let reply = post(&router, "/v1/embeddings", json!({"messages": [message(vec![video_part(&good)])]})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
}

/// Models that read no video say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_without_video_refuse_it() {
    let part = video_part(&video_bytes("pattern_100x60_5fps_high_bframes.mp4"));
    let router = router_for(&fixture_model("embeddinggemma2-text"));
    let reply = post(&router, "/v1/embeddings", json!({"messages": [message(vec![part.clone()])]})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert!(reply.body.to_string().contains("reads video frames"), "{}", reply.body);
    let router = router_for(&fixture_model("siglip-tiny"));
    let reply = post(&router, "/v1/embeddings", json!({"messages": [message(vec![part])]})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert!(reply.body.to_string().contains("video"), "{}", reply.body);
}
