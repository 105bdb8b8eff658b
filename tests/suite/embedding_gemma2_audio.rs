//! EmbeddingGemma 2's audio side against transformers 5.24 (generator:
//! tests/fixtures/make_embedding_gemma2.py, which writes the audio files of
//! tests/fixtures/audio/ with libsndfile and loads them back with transformers' `load_audio`:
//! soundfile, then soxr's resampler):
//! - decoding and `Gemma4AudioFeatureExtractor`'s log-mel features;
//! - the Gemma 4 audio tower's soft tokens (`embed_audio(audio_tower(features))`) on the
//!   extractor's own features;
//! - `EmbeddingGemma2Model`'s embeddings of each audio alone (`<bos> <|audio> soft tokens
//!   <audio|>`), all of them in one request, and text with audio in one input, over HTTP as
//!   vLLM and OpenAI clients send audio;
//! - hostile and broken audio.

use crate::common::families::router_for;
use crate::common::*;
use base64::Engine;
use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use poolserve::input::audio::{decode::decode_mono, AudioLimits, LogMelConfig};
use poolserve::models::gemma4_audio::Gemma4Audio;
use serde_json::{json, Value};

fn audio_bytes(file: &str) -> Vec<u8> {
    std::fs::read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/audio").join(file)).unwrap()
}

fn features_config() -> LogMelConfig {
    let folder = fixture_model("embeddinggemma2-omni");
    let processor: Value = serde_json::from_str(&std::fs::read_to_string(folder.join("processor_config.json")).unwrap()).unwrap();
    LogMelConfig::from_json(&processor["feature_extractor"]).unwrap()
}

/// Whether libsndfile and symphonia decode the file to the same samples (PCM and FLAC, at the
/// model's rate or resampled by the same libsoxr recipe), so that the features can be held to
/// the extractor's own precision. MP3 and Vorbis decoders differ in their last bits.
fn exact(file: &str) -> bool {
    file.ends_with(".wav") || file.ends_with(".flac")
}

#[test]
fn decoded_audio_and_features_match_the_extractor() {
    let expected = expected("embeddinggemma2-omni");
    let config = features_config();
    for case in expected["audio"].as_array().unwrap() {
        let file = case["file"].as_str().unwrap();
        let wave = decode_mono(&audio_bytes(file), 16000, config.max_samples, &AudioLimits::default()).unwrap();
        assert_eq!(wave.len(), case["samples"].as_u64().unwrap() as usize, "{file}: samples");
        let head = floats(&case["waveform_head"]);
        let head_diff = max_abs_diff(&wave[..head.len()], &head);
        let mel = config.log_mel(&wave);
        assert_eq!(mel.frames, case["frames"].as_u64().unwrap() as usize, "{file}: frames");
        let diff = max_abs_diff(&mel.values, &floats(&case["features"]));
        eprintln!("{file}: waveform head differs by {head_diff:.2e}, log-mel features by {diff:.2e}");
        if exact(file) {
            assert!(head_diff <= 1e-6, "{file}: samples differ by {head_diff}");
            // The extractor's FFT is numpy's float32 one; ours is realfft's.
            assert!(diff <= 1e-4, "{file}: features differ by {diff}");
        }
    }
}

fn tower() -> (Gemma4Audio, Value) {
    tower_of("embeddinggemma2-omni")
}

fn tower_of(model: &str) -> (Gemma4Audio, Value) {
    let folder = fixture_model(model);
    let config: Value = serde_json::from_str(&std::fs::read_to_string(folder.join("config.json")).unwrap()).unwrap();
    // SAFETY: the fixture is not modified while the test maps it.
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[folder.join("model.safetensors")], DType::F32, &Device::Cpu).unwrap() };
    let text_hidden = config["text_config"]["hidden_size"].as_u64().unwrap() as usize;
    (Gemma4Audio::load(&config["audio_config"], vb.pp("audio_tower"), vb.pp("embed_audio"), text_hidden).unwrap(), config)
}

/// The tower on the extractor's own features (the decoder left out), alone and batched.
#[test]
fn soft_tokens_match_the_audio_tower() {
    let expected = expected("embeddinggemma2-omni");
    let (tower, _) = tower();
    let cases = expected["audio"].as_array().unwrap();
    let features: Vec<Vec<f32>> = cases.iter().map(|c| floats(&c["features"])).collect();
    let frames: Vec<usize> = cases.iter().map(|c| c["frames"].as_u64().unwrap() as usize).collect();
    let all: Vec<(&[f32], usize)> = features.iter().map(Vec::as_slice).zip(frames.iter().copied()).collect();
    let batched = tower.forward(&all).unwrap().to_vec2::<f32>().unwrap();
    let mut row = 0;
    for (i, case) in cases.iter().enumerate() {
        let want = floats(&case["soft_tokens"]);
        let alone: Vec<f32> = tower.forward(&all[i..i + 1]).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let diff = max_abs_diff(&alone, &want);
        assert!(diff <= 1e-4 * scale.max(1.0), "{}: soft tokens differ by {diff} (largest {scale})", case["file"]);
        let width = batched[0].len();
        let rows: Vec<f32> = batched[row..row + want.len() / width].concat();
        row += want.len() / width;
        assert!(max_abs_diff(&rows, &alone) <= 1e-5, "{}: batched differs from alone", case["file"]);
    }
    assert_eq!(row, batched.len());
}

/// A folder whose feature extractor makes 16 mel bins and whose tower's sub-sampling is
/// [16, 8] wide: the bins come from `processor_config.json`, as transformers' feature extractor
/// reads them, and the tower takes them (features, soft tokens and embeddings against
/// transformers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sixteen_bin_tower_embeds_as_transformers_does() {
    const MODEL: &str = "embeddinggemma2-audio16";
    let expected = expected(MODEL);
    let processor: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture_model(MODEL).join("processor_config.json")).unwrap()).unwrap();
    let config = LogMelConfig::from_json(&processor["feature_extractor"]).unwrap();
    assert_eq!(config.mel_bins, 16);
    let (tower, _) = tower_of(MODEL);
    assert!(tower.takes_mel_bins(16) && !tower.takes_mel_bins(128));
    let router = router_for(&fixture_model(MODEL));
    for case in expected["audio"].as_array().unwrap() {
        let file = case["file"].as_str().unwrap();
        assert_eq!(case["mel_bins"], 16);
        let wave = decode_mono(&audio_bytes(file), 16000, config.max_samples, &AudioLimits::default()).unwrap();
        let mel = config.log_mel(&wave);
        assert_eq!((mel.frames, mel.bins), (case["frames"].as_u64().unwrap() as usize, 16), "{file}");
        let diff = max_abs_diff(&mel.values, &floats(&case["features"]));
        assert!(diff <= 1e-4, "{file}: features differ by {diff}");
        let want = floats(&case["soft_tokens"]);
        let soft: Vec<f32> = tower.forward(&[(&floats(&case["features"]), mel.frames)]).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(max_abs_diff(&soft, &want) <= 1e-4 * scale.max(1.0), "{file}: soft tokens");
        let reply = post(&router, "/v1/embeddings", json!({"messages": [message(vec![audio_part(file)])]})).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        let c = cosine(&floats(&reply.body["data"][0]["embedding"]), &floats(&case["embedding"]));
        assert!(c >= 0.9999, "{file}: cosine {c}");
    }
}

fn audio_part(file: &str) -> Value {
    let format = file.rsplit('.').next().unwrap();
    json!({"type": "input_audio", "input_audio": {"data": base64::engine::general_purpose::STANDARD.encode(audio_bytes(file)), "format": format}})
}

/// A reference's interleaved parts (`{"text"}` or `{"audio": file}`) as content parts.
fn parts_content(parts: &Value) -> Vec<Value> {
    parts
        .as_array()
        .unwrap()
        .iter()
        .map(|p| match p.get("audio") {
            Some(file) => audio_part(file.as_str().unwrap()),
            None => json!({"type": "text", "text": p["text"]}),
        })
        .collect()
}

fn message(content: Vec<Value>) -> Value {
    json!({"role": "user", "content": content})
}

/// Audio over HTTP as vLLM (`audio_url`, `input_audio` in `messages`) and OpenAI clients send
/// it, against `EmbeddingGemma2Model` on transformers' own loading and features.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audio_embeds_over_http_as_transformers_embeds_it() {
    let expected = expected("embeddinggemma2-omni");
    let router = router_for(&fixture_model("embeddinggemma2-omni"));
    let cases = expected["audio"].as_array().unwrap();
    let files: Vec<&str> = cases.iter().map(|c| c["file"].as_str().unwrap()).collect();
    // Every file in one request, as `input_audio` parts.
    let messages: Vec<Value> = files.iter().map(|f| message(vec![audio_part(f)])).collect();
    let reply = post(&router, "/v1/embeddings", json!({"messages": messages})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    for (i, case) in cases.iter().enumerate() {
        let c = cosine(&floats(&reply.body["data"][i]["embedding"]), &floats(&case["embedding"]));
        eprintln!("{}: cosine {c:.7}", files[i]);
        // Every file, lossy and resampled ones included, to the f32 bar.
        assert!(c >= 0.9999, "{}: cosine {c}", files[i]);
    }
    // An `audio_url` data URL, alone, through /pooling.
    let url = format!("data:audio/wav;base64,{}", base64::engine::general_purpose::STANDARD.encode(audio_bytes(files[0])));
    let part = json!({"type": "audio_url", "audio_url": {"url": url}});
    let reply = post(&router, "/pooling", json!({"messages": [message(vec![part.clone()])]})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let c = cosine(&floats(&reply.body["data"][0]["data"]), &floats(&cases[0]["embedding"]));
    assert!(c >= 0.9999, "audio_url: cosine {c}");
    // Infinity's /embeddings_audio: data URIs, one or a list.
    let uris: Vec<String> = files[..2]
        .iter()
        .map(|f| {
            format!(
                "data:audio/{};base64,{}",
                f.rsplit('.').next().unwrap(),
                base64::engine::general_purpose::STANDARD.encode(audio_bytes(f))
            )
        })
        .collect();
    let reply = post(&router, "/embeddings_audio", json!({"input": uris, "model": "default/not-specified"})).await;
    assert_eq!(reply.status, 200, "/embeddings_audio: {}", reply.body);
    for (i, case) in cases.iter().enumerate().take(2) {
        let c = cosine(&floats(&reply.body["data"][i]["embedding"]), &floats(&case["embedding"]));
        assert!(c >= 0.9999, "/embeddings_audio {i}: cosine {c}");
    }
    let reply = post(&router, "/embeddings_audio", json!({"input": uris[0]})).await;
    assert_eq!(reply.status, 200, "/embeddings_audio one: {}", reply.body);
    assert_eq!(reply.body["data"].as_array().unwrap().len(), 1);
    let reply = post(&router, "/embeddings_audio", json!({"input": []})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    // /score: a text against audio documents is the cosine of their embeddings.
    let text = &expected["texts"][0];
    let content: Vec<Value> = files[..2].iter().map(|f| audio_part(f)).collect();
    let reply = post(&router, "/score", json!({"text_1": text["text"], "text_2": one_part_documents(&content)})).await;
    assert_eq!(reply.status, 200, "/score: {}", reply.body);
    for (i, case) in cases.iter().enumerate().take(2) {
        let want = cosine(&floats(&text["embedding"]), &floats(&case["embedding"])) as f32;
        let got = reply.body["data"][i]["score"].as_f64().unwrap() as f32;
        assert!((got - want).abs() <= 1e-4, "/score audio {i}: {got} vs {want}");
    }
    // /rerank with vLLM's multimodal documents: the audio ranked by the same cosines.
    let reply = post(&router, "/rerank", json!({"query": text["text"], "documents": one_part_documents(&content)})).await;
    assert_eq!(reply.status, 200, "/rerank: {}", reply.body);
    for result in reply.body["results"].as_array().unwrap() {
        let i = result["index"].as_u64().unwrap() as usize;
        let want = cosine(&floats(&text["embedding"]), &floats(&cases[i]["embedding"])) as f32;
        let got = result["relevance_score"].as_f64().unwrap() as f32;
        assert!((got - want).abs() <= 1e-4, "/rerank audio {i}: {got} vs {want}");
    }
    // Text and audio in one input: the parts joined with a newline, each audio as its token.
    for (i, case) in expected["audio_interleaved"].as_array().unwrap().iter().enumerate() {
        let reply = post(&router, "/v1/embeddings", json!({"messages": [message(parts_content(&case["parts"]))]})).await;
        assert_eq!(reply.status, 200, "interleaved {i}: {}", reply.body);
        let c = cosine(&floats(&reply.body["data"][0]["embedding"]), &floats(&case["embedding"]));
        assert!(c >= 0.9999, "text with audio {i}: cosine {c}");
    }
    // Cohere's /v2/embed `inputs` (superset: Cohere's content takes text and images): a
    // text with an audio part is the processor's sequence of both, as in `messages`.
    let first = &expected["audio_interleaved"][0];
    let inputs = json!([{"content": parts_content(&first["parts"])}, {"content": [audio_part(files[0])]}]);
    let reply = post(&router, "/v2/embed", json!({"inputs": inputs, "embedding_types": ["float"]})).await;
    assert_eq!(reply.status, 200, "/v2/embed inputs with audio: {}", reply.body);
    let c = cosine(&floats(&reply.body["embeddings"]["float"][0]), &floats(&first["embedding"]));
    assert!(c >= 0.9999, "cohere text with audio: cosine {c}");
    let c = cosine(&floats(&reply.body["embeddings"]["float"][1]), &floats(&cases[0]["embedding"]));
    assert!(c >= 0.9999, "cohere audio: cosine {c}");
    // An image and an audio in one input run both towers in one batch.
    let png = std::fs::read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/images/gray_19x25.png")).unwrap();
    let image = json!({"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(png))}});
    let reply = post(&router, "/v1/embeddings", json!({"messages": [message(vec![image, audio_part(files[1])])]})).await;
    assert_eq!(reply.status, 200, "image and audio: {}", reply.body);
    // The audio placeholder typed as text cannot stand for audio.
    let forged = vec![json!({"type": "text", "text": "<|audio|>"}), audio_part(files[1])];
    let reply = post(&router, "/v1/embeddings", json!({"messages": [message(forged)]})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert!(reply.body.to_string().contains("audio placeholder"), "{}", reply.body);
}

/// A 16-bit mono PCM WAV of `samples` at `rate`, with its header's data size `declared` bytes.
fn wav(samples: usize, rate: u32, declared: Option<u32>) -> Vec<u8> {
    let data = declared.unwrap_or(samples as u32 * 2);
    let mut out = Vec::new();
    out.extend(b"RIFF");
    out.extend((36 + data).to_le_bytes());
    out.extend(b"WAVEfmt ");
    out.extend(16u32.to_le_bytes());
    out.extend(1u16.to_le_bytes());
    out.extend(1u16.to_le_bytes());
    out.extend(rate.to_le_bytes());
    out.extend((rate * 2).to_le_bytes());
    out.extend(2u16.to_le_bytes());
    out.extend(16u16.to_le_bytes());
    out.extend(b"data");
    out.extend(data.to_le_bytes());
    out.extend((0..samples).flat_map(|i| (((i * 37) % 2000) as i16 - 1000).to_le_bytes()));
    out
}

fn wav_part(bytes: &[u8]) -> Value {
    json!({"type": "input_audio", "input_audio": {"data": base64::engine::general_purpose::STANDARD.encode(bytes), "format": "wav"}})
}

/// Hostile and broken audio: each a 400 that says why, and the server serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_audio_is_refused_with_its_reason() {
    let router = router_for(&fixture_model("embeddinggemma2-omni"));
    let refused = |body: &Value, words: &str| {
        let text = body.to_string();
        assert!(text.contains(words), "expected `{words}` in {text}");
    };
    // An hour declared in the header (over a few bytes): refused before decoding.
    let reply =
        post(&router, "/v1/embeddings", json!({"messages": [message(vec![wav_part(&wav(100, 16000, Some(16000 * 3600 * 2)))])]})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    refused(&reply.body, "--max-audio-seconds");
    // Shorter than one token.
    let reply = post(&router, "/v1/embeddings", json!({"messages": [message(vec![wav_part(&wav(100, 16000, None))])]})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    refused(&reply.body, "at least 161");
    // Not audio; a truncated header; an absurd sample rate.
    for (bytes, words) in [
        (b"definitely not audio".to_vec(), "could not be read"),
        (wav(1000, 16000, None)[..30].to_vec(), "audio"),
        (wav(1000, 900_000, None), "sample rate"),
        // The fuzzer's finds (fuzz/regressions/): a sample rate of 0 made symphonia divide by
        // zero (a 500); a FLAC comment made it allocate 3.2 GB.
        (std::fs::read("fuzz/regressions/wav_sample_rate_0_panics.wav").unwrap(), "sample rate (0)"),
        (std::fs::read("fuzz/regressions/flac_comment_claims_3_gb.flac").unwrap(), "FLAC metadata block claims"),
    ] {
        let reply = post(&router, "/v1/embeddings", json!({"messages": [message(vec![wav_part(&bytes)])]})).await;
        assert_eq!(reply.status, 400, "{words}: {}", reply.body);
        refused(&reply.body, words);
    }
    // A truncated data chunk is the audio it holds.
    let whole = wav(4000, 16000, None);
    let reply = post(&router, "/v1/embeddings", json!({"messages": [message(vec![wav_part(&whole[..44 + 3000])])]})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    // Base64 that does not decode, and a data URL that is not audio.
    let bad = json!({"type": "input_audio", "input_audio": {"data": "%%%", "format": "wav"}});
    let reply = post(&router, "/v1/embeddings", json!({"messages": [message(vec![bad])]})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    let not_audio = json!({"type": "audio_url", "audio_url": {"url": "data:image/png;base64,AAAA"}});
    let reply = post(&router, "/v1/embeddings", json!({"messages": [message(vec![not_audio])]})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    refused(&reply.body, "is not audio");
    // An http URL of a host not allowed.
    let remote = json!({"type": "audio_url", "audio_url": {"url": "https://example.com/a.wav"}});
    let reply = post(&router, "/v1/embeddings", json!({"messages": [message(vec![remote])]})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    refused(&reply.body, "audio URL's host");
    // Audio can only be embedded.
    let reply = post(&router, "/pooling", json!({"messages": [message(vec![wav_part(&whole)])], "task": "token_embed"})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    // Many audio inputs in one request run in waves (a few at a time, as images do), each
    // embedded as alone; a bad one late in the request fails it by its number, from its header.
    let many: Vec<Value> = (0..24).map(|_| message(vec![wav_part(&whole)])).collect();
    let reply = post(&router, "/v1/embeddings", json!({"messages": many})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let first = floats(&reply.body["data"][0]["embedding"]);
    for item in reply.body["data"].as_array().unwrap() {
        assert!(cosine(&floats(&item["embedding"]), &first) > 0.99999);
    }
    let mut bad = many.clone();
    bad.push(message(vec![wav_part(&wav(100, 16000, Some(16000 * 3600 * 2)))]));
    let reply = post(&router, "/v1/embeddings", json!({"messages": bad})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    refused(&reply.body, "audio 24");
    // And the server serves on.
    let reply = post(&router, "/v1/embeddings", json!({"messages": [message(vec![wav_part(&whole)])]})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
}

/// A model without an audio tower says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_without_an_audio_tower_refuse_audio() {
    let router = router_for(&fixture_model("embeddinggemma2-text"));
    let reply = post(&router, "/v1/embeddings", json!({"messages": [message(vec![wav_part(&wav(4000, 16000, None))])]})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert!(reply.body.to_string().contains("need a model with an audio tower"), "{}", reply.body);
}
