//! EmbeddingGemma 2's image side against transformers 5.24 (generator:
//! tests/fixtures/make_embedding_gemma2.py): `Gemma4ImageProcessor`'s patches (the torchvision
//! backend, which `AutoProcessor` loads from the folder when torchvision is installed), and the
//! embeddings of `EmbeddingGemma2Model` for an image alone (`<bos> <|image> soft tokens
//! <image|>`, the soft tokens from Gemma 4's vision tower and `embed_vision`), each image alone
//! and all in one batch.
//! The model layer directly (the tower's soft tokens against `get_image_features`), then
//! through the real router as clients send images.

use crate::common::families::router_for;
use crate::common::*;
use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use poolserve::input::image::patches::{preprocess_patches, Alpha, Backend, PatchConfig, Sizing};
use poolserve::input::image::ImageLimits;
use poolserve::models::batch::{Batch, SoftTokens, TokenizedInput};
use poolserve::models::gemma4_vision::{Gemma4Vision, ImagePatches};
use poolserve::models::Architecture;
use serde_json::Value;

const CONFIG: PatchConfig = PatchConfig {
    patch_size: 4,
    pooling_kernel_size: 2,
    max_soft_tokens: 70,
    backend: Backend::Torchvision,
    sizing: Sizing::SoftTokenBudget,
    normalize: None,
    alpha: Alpha::OverWhite,
};

fn image_bytes(file: &str) -> Vec<u8> {
    std::fs::read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/images").join(file)).unwrap()
}

#[test]
fn patches_match_the_processor() {
    let expected = expected("embeddinggemma2-omni");
    for case in expected["images"].as_array().unwrap() {
        let file = case["file"].as_str().unwrap();
        let patches = preprocess_patches(&image_bytes(file), &CONFIG, &ImageLimits::default()).unwrap();
        let positions: Vec<(u32, u32)> =
            case["positions"].as_array().unwrap().iter().map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_u64().unwrap() as u32)).collect();
        assert_eq!(patches.positions, positions, "{file}: patch grid");
        let diff = max_abs_diff(&patches.rescaled(), &floats(&case["pixel_values"]));
        // PNGs decode exactly; torchvision's uint8 bicubic resize is reproduced to the level.
        assert!(diff <= 1e-6, "{file}: pixel values differ by {diff}");
    }
}

fn embeddings(images: &[&Value]) -> Vec<Vec<f32>> {
    let folder = fixture_model("embeddinggemma2-omni");
    let config: Value = serde_json::from_str(&std::fs::read_to_string(folder.join("config.json")).unwrap()).unwrap();
    // SAFETY: the fixture is not modified while the test maps it.
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[folder.join("model.safetensors")], DType::F32, &Device::Cpu).unwrap() };
    let architecture = &poolserve::models::embedding_gemma2::EMBEDDING_GEMMA2;
    let backbone = architecture.backbone(&config, vb.clone()).unwrap();
    let text_hidden = config["text_config"]["hidden_size"].as_u64().unwrap() as usize;
    let vision = Gemma4Vision::load(&config["vision_config"], vb.pp("vision_tower"), vb.pp("embed_vision"), text_hidden).unwrap();
    let image_token = config["image_token_id"].as_u64().unwrap() as u32;
    let patches: Vec<ImagePatches> = images
        .iter()
        .map(|case| {
            let p = preprocess_patches(&image_bytes(case["file"].as_str().unwrap()), &CONFIG, &ImageLimits::default()).unwrap();
            ImagePatches { pixels: p.rescaled(), positions: p.positions }
        })
        .collect();
    let soft = vision.forward(&patches.iter().collect::<Vec<_>>()).unwrap();
    // The tower's soft tokens themselves, against `get_image_features`.
    let rows = soft.to_vec2::<f32>().unwrap();
    let mut offset = 0;
    for case in images {
        let want = floats(&case["soft_tokens"]);
        let got: Vec<f32> = rows[offset..offset + want.len() / text_hidden].concat();
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let diff = max_abs_diff(&got, &want);
        assert!(diff <= 1e-4 * scale.max(1.0), "{}: soft tokens differ by {diff} (largest {scale})", case["file"]);
        offset += want.len() / text_hidden;
    }
    let inputs: Vec<TokenizedInput> = images
        .iter()
        .map(|case| {
            let ids: Vec<u32> = case["input_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
            TokenizedInput { type_ids: vec![0; ids.len()], ids }
        })
        .collect();
    let mut batch = Batch::from_inputs(&inputs);
    let positions: Vec<usize> = batch.input_ids.iter().enumerate().filter(|(_, &id)| id == image_token).map(|(i, _)| i).collect();
    assert_eq!(positions.len(), soft.dim(0).unwrap(), "one soft token per placeholder");
    batch.soft_tokens = Some(SoftTokens::new(positions, soft).unwrap());
    let hidden = backbone.forward(&batch).unwrap();
    batch
        .spans()
        .map(|(start, len)| {
            let mean = hidden.narrow(0, start, len).unwrap().mean(0).unwrap();
            let norm = mean.sqr().unwrap().sum_all().unwrap().sqrt().unwrap();
            mean.broadcast_div(&norm).unwrap().to_vec1::<f32>().unwrap()
        })
        .collect()
}

#[test]
fn image_embeddings_match_transformers_alone_and_batched() {
    let expected = expected("embeddinggemma2-omni");
    let cases: Vec<&Value> = expected["images"].as_array().unwrap().iter().collect();
    let batched = embeddings(&cases);
    for (i, case) in cases.iter().enumerate() {
        let reference = floats(&case["embedding"]);
        let alone = embeddings(&[case]);
        for (how, got) in [("alone", &alone[0]), ("batched", &batched[i])] {
            let c = cosine(got, &reference);
            eprintln!("{} {how}: cosine {c:.7}", case["file"]);
            assert!(c >= 0.9999, "{} {how}: cosine {c}", case["file"]);
        }
    }
    // The soft tokens are exact enough that a wrong one shows: the first image's embedding is
    // far from the second's.
    assert!(cosine(&batched[0], &batched[1]) < 0.99);
}

fn image_message(file: &str) -> Value {
    use base64::Engine;
    let url = format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(image_bytes(file)));
    serde_json::json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]})
}

/// Images over HTTP, as vLLM (`messages`) and Cohere (`/v2/embed` `images`) clients send them,
/// against `EmbeddingGemma2Model` on the processor's inputs; texts beside them keep theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_embed_over_http_as_transformers_embeds_them() {
    use serde_json::json;
    let expected = expected("embeddinggemma2-omni");
    let router = router_for(&fixture_model("embeddinggemma2-omni"));
    let images = expected["images"].as_array().unwrap();
    let files: Vec<&str> = images.iter().map(|i| i["file"].as_str().unwrap()).collect();
    let check = |got: &Value, want: &Value, what: &str| {
        let c = cosine(&floats(got), &floats(want));
        assert!(c >= 0.9999, "{what}: cosine {c}");
    };
    let messages: Vec<Value> = files.iter().map(|f| image_message(f)).collect();
    for route in ["/v1/embeddings", "/pooling"] {
        let reply = post(&router, route, json!({"messages": messages})).await;
        assert_eq!(reply.status, 200, "{route}: {}", reply.body);
        let field = if route == "/pooling" { "data" } else { "embedding" };
        for (i, image) in images.iter().enumerate() {
            check(&reply.body["data"][i][field], &image["embedding"], &format!("{route} image {i}"));
        }
        // Usage counts each image's text sequence and its patches.
        let sequence_tokens: usize = images.iter().map(|i| i["input_ids"].as_array().unwrap().len()).sum();
        assert!(reply.body["usage"]["prompt_tokens"].as_u64().unwrap() as usize > sequence_tokens);
    }
    let urls: Vec<Value> = messages.iter().map(|m| m["content"][0]["image_url"]["url"].clone()).collect();
    let reply = post(&router, "/v2/embed", json!({"images": urls, "input_type": "image", "embedding_types": ["float"]})).await;
    assert_eq!(reply.status, 200, "/v2/embed: {}", reply.body);
    for (i, image) in images.iter().enumerate() {
        check(&reply.body["embeddings"]["float"][i], &image["embedding"], &format!("cohere image {i}"));
    }
    // Billed: images only, each its text sequence and its patches.
    let billed = &reply.body["meta"]["billed_units"];
    let sequences: u64 = images.iter().map(|i| i["input_ids"].as_array().unwrap().len() as u64).sum();
    assert_eq!(billed["input_tokens"], 0, "{billed}");
    assert!(billed["image_tokens"].as_u64().unwrap() > sequences, "{billed}");
    // Infinity's /embeddings_image.
    let reply = post(&router, "/embeddings_image", json!({"input": urls})).await;
    assert_eq!(reply.status, 200, "/embeddings_image: {}", reply.body);
    for (i, image) in images.iter().enumerate() {
        check(&reply.body["data"][i]["embedding"], &image["embedding"], &format!("/embeddings_image {i}"));
    }
    // A text and an image in one request: each as transformers embeds it alone.
    let text = &expected["texts"][0];
    let inputs =
        json!([{"content": [{"type": "text", "text": text["text"]}]}, {"content": [{"type": "image_url", "image_url": {"url": urls[1]}}]}]);
    let reply = post(&router, "/v2/embed", json!({"inputs": inputs, "input_type": "search_document", "embedding_types": ["float"]})).await;
    assert_eq!(reply.status, 200, "/v2/embed inputs: {}", reply.body);
    check(&reply.body["embeddings"]["float"][1], &images[1]["embedding"], "cohere inputs image");
    // /score: a text against images is the cosine of their embeddings.
    let content: Vec<Value> = urls.iter().map(|u| json!({"type": "image_url", "image_url": {"url": u}})).collect();
    let reply = post(&router, "/score", json!({"text_1": text["text"], "text_2": one_part_documents(&content)})).await;
    assert_eq!(reply.status, 200, "/score: {}", reply.body);
    for (i, image) in images.iter().enumerate() {
        let want = cosine(&floats(&text["embedding"]), &floats(&image["embedding"])) as f32;
        let got = reply.body["data"][i]["score"].as_f64().unwrap() as f32;
        assert!((got - want).abs() <= 1e-4, "/score image {i}: {got} vs {want}");
    }
    // Texts and images in one input (one message's content parts, in order), as the processor
    // reads the parts joined with a newline, each image as its image token.
    for (i, case) in expected["interleaved"].as_array().unwrap().iter().enumerate() {
        let content: Vec<Value> = case["parts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|part| match part.get("image") {
                Some(file) => image_message(file.as_str().unwrap())["content"][0].clone(),
                None => json!({"type": "text", "text": part["text"]}),
            })
            .collect();
        let reply = post(&router, "/v1/embeddings", json!({"messages": [{"role": "user", "content": content}]})).await;
        assert_eq!(reply.status, 200, "interleaved {i}: {}", reply.body);
        check(&reply.body["data"][0]["embedding"], &case["embedding"], &format!("interleaved input {i}"));
    }
    // The placeholder token typed as text cannot stand for an image.
    let forged = json!([{"type": "text", "text": "<|image|>"}, messages[0]["content"][0].clone()]);
    let reply = post(&router, "/v1/embeddings", json!({"messages": [{"role": "user", "content": forged}]})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert!(reply.body.to_string().contains("placeholder"), "{}", reply.body);
    // A broken image is the client's error, and the server serves on.
    let broken =
        json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,bm90IGFuIGltYWdl"}}]});
    let reply = post(&router, "/v1/embeddings", json!({"messages": [broken]})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    let reply = post(&router, "/v1/embeddings", json!({"messages": [messages[0].clone()]})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    // A broken audio part (a bare `RIFF`) is the client's error too.
    let audio = json!({"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}]});
    let reply = post(&router, "/v1/embeddings", json!({"messages": [audio]})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert!(reply.body.to_string().contains("audio"), "{}", reply.body);
}

/// CLIP and SigLIP embed one text or one image per input: an input holding both is refused,
/// with a message that says to send them apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn towers_that_embed_images_alone_refuse_interleaved_inputs() {
    use serde_json::json;
    let router = router_for(&fixture_model("clip-tiny"));
    let content = json!([{"type": "text", "text": "a"}, image_message("gray_19x25.png")["content"][0].clone()]);
    let reply = post(&router, "/v1/embeddings", json!({"messages": [{"role": "user", "content": content}]})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert!(reply.body.to_string().contains("send them as separate inputs"), "{}", reply.body);
}
