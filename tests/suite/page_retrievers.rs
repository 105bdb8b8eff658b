//! ColPali and ColQwen2 against transformers 5.24 (generator:
//! tests/fixtures/make_page_retrievers.py), ColModernVBert against transformers 5.24 with
//! torchvision 0.29 (generator: tests/fixtures/make_colmodernvbert.py), and ColQwen3 against its published forward on
//! transformers 5.24's Qwen3-VL (generator: tests/fixtures/make_qwen3_vl.py): the processors' pixel values and input ids, the
//! models' vectors (one per token, padding rows dropped) for text queries and page images,
//! alone and batched, and the processors' `score_retrieval` MaxSim scores, through the model
//! layer and through the real router as vLLM (`/pooling` token_embed, `/score`, `/rerank` with
//! `{"content": [...]}`) clients send them. ColQwen2's reference is `ColQwen2ForRetrieval` as
//! called (every token placed by its index); its M-RoPE placement (colpali-engine's, our
//! `"mrope_positions": true`) has references of its own (see `models/colqwen2.rs`).

use crate::common::*;
use base64::Engine as _;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use poolserve::input::image::{preprocess, ImageLimits};
use poolserve::loader::options::ModelOptions;
use poolserve::models::batch::{Batch, ImageGrid, SoftTokens, TokenizedInput};
use poolserve::models::gemma4_vision::ImagePatches;
use poolserve::models::{Architecture, Backbone};
use serde_json::{json, Value};

const MODELS: [&str; 14] = [
    "colpali-tiny",
    // A second shape: 2 vision heads of 24, 36 image tokens, 3 Gemma layers of 2 heads of 24, untied.
    "colpali-second-tiny",
    "colqwen2-tiny",
    // Its tokenizer.json appends `<|endoftext|>`, which the processor's tokenizer call keeps.
    "colqwen2-eos-tiny",
    // A second shape: depth 1, 2 vision heads of 16, 1 KV head, tied embeddings, noise pages.
    "colqwen2-second-tiny",
    "colqwen3-tiny",
    "colqwen3-engine-tiny",
    "ops-colqwen3-tiny",
    "nemotron-colembed-tiny",
    "colqwen3_5-tiny",
    "colmodernvbert-tiny",
    // A second shape: 36 patches a 48-pixel frame, pixel shuffle ×3, 3 heads of 8 and of 16.
    "colmodernvbert-second-tiny",
    "colmodernvbert-engine-tiny",
    "colmodernvbert-merged-tiny",
];
/// Rows per vector.
const DIM: usize = 16;

/// A fixture image: `pages/…` from tests/fixtures/, a bare name from tests/fixtures/images/.
fn image_bytes(file: &str) -> Vec<u8> {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let path = if file.contains('/') { fixtures.join(file) } else { fixtures.join("images").join(file) };
    std::fs::read(path).unwrap()
}

fn image_part(file: &str) -> Value {
    part_of(&image_bytes(file))
}

fn part_of(bytes: &[u8]) -> Value {
    let url = format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(bytes));
    json!({"type": "image_url", "image_url": {"url": url}})
}

/// A JPEG page as Pillow decodes it, saved losslessly (`make_page_retrievers.py`).
fn pillow_decoded(file: &str) -> Vec<u8> {
    let name = file.replace(".jpg", ".pillow.png");
    std::fs::read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/decoded").join(name)).unwrap()
}

/// The bar for a page image's vectors: PNGs decode as Pillow decodes them, so the f32 bar
/// holds; the JPEG goes through zune-jpeg, whose chroma upsampling rounds differently from
/// libjpeg-turbo's by a few levels (as for CLIP and SigLIP, `image_models.rs`), which this tiny
/// random model (weights of σ 0.2) amplifies. The tower on transformers' own pixel values is
/// held to the f32 bar for every image, JPEG included ([`model_matches_transformers_on_its_pixel_values`]),
/// and every model is on the JPEG's pixels as Pillow decodes them (`decoded/stripes_50x130.pillow.png`).
/// ColQwen3.5's tiny hybrid decoder amplifies the decoder's few levels (0.986), ColPali's second
/// shape (4-pixel patches: 36 tokens for the 50×130 page's few levels) the most (0.947).
fn image_bar(file: &str) -> f64 {
    jpeg_bar("", file)
}

/// [`image_bar`] for `model`.
fn jpeg_bar(model: &str, file: &str) -> f64 {
    if file.ends_with(".jpg") && model == "colpali-second-tiny" {
        0.94
    } else if file.ends_with(".jpg") {
        0.98
    } else {
        0.9999
    }
}

/// Every row of `ours` (a `[rows][DIM]` matrix, or flat) against the reference's rows: the
/// same count, each at cosine ≥ `bar`.
fn assert_rows(ours: &[f32], reference: &[f32], bar: f64, what: &str) {
    assert_eq!(ours.len(), reference.len(), "{what}: {} values, reference {}", ours.len(), reference.len());
    let worst = ours.chunks(DIM).zip(reference.chunks(DIM)).map(|(a, b)| cosine(a, b)).fold(1.0f64, f64::min);
    eprintln!("{what}: worst row cosine {worst:.9}");
    assert!(worst >= bar, "{what}: a row at cosine {worst} (bar {bar})");
}

fn matrix(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().flat_map(floats).collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// Idefics3's frames as ColModernVBert's processor cuts them (torchvision's Lanczos resizes,
/// the tiles, the whole page last), with splitting and without.
#[test]
fn colmodernvbert_frames_match_the_processor() {
    colmodernvbert_frames("colmodernvbert-tiny", true);
    colmodernvbert_frames("colmodernvbert-second-tiny", false);
}

/// [`colmodernvbert_frames_match_the_processor`] for one fixture; `refusal`: also the page
/// whose frames pass its length.
fn colmodernvbert_frames(model: &str, refusal: bool) {
    let expected = expected(model);
    assert_eq!(expected["image_processor"], "Idefics3ImageProcessor");
    let loaded = poolserve::loader::load(&ModelOptions::for_model(fixture_model(model).to_str().unwrap())).expect("loads");
    let Some(poolserve::loader::VisionInput::Page { processor, .. }) = loaded.vision else { panic!("no page side") };
    let tables = std::sync::Arc::new(poolserve::input::image::ChannelTables::new(&processor));
    let mut unsplit = processor.clone();
    unsplit.splitting = processor.splitting.map(|s| poolserve::input::image::Splitting { enabled: false, ..s });
    for (image, off) in expected["images"].as_array().unwrap().iter().zip(expected["split_off"].as_array().unwrap()) {
        let file = image["file"].as_str().unwrap();
        let limits = ImageLimits::default();
        let page =
            poolserve::input::image::frames::preprocess_frames(&image_bytes(file), &processor, &limits, &tables, 64).expect("frames");
        assert_eq!(
            [page.rows as u64, page.cols as u64],
            [image["grid"][0].as_u64().unwrap(), image["grid"][1].as_u64().unwrap()],
            "{file}"
        );
        assert_eq!(page.frames.len() as u64, image["frames"].as_u64().unwrap(), "{file}");
        let ours: Vec<f32> = page.frames.iter().flat_map(|f| f.normalized()).collect();
        let diff = max_abs_diff(&ours, &floats(&image["pixel_values"]));
        let single = poolserve::input::image::frames::preprocess_frames(&image_bytes(file), &unsplit, &limits, &tables, 64).expect("frame");
        let diff_off = max_abs_diff(&single.frames[0].normalized(), &floats(&off["pixel_values"]));
        eprintln!("{file}: frames max abs diff {diff}, unsplit {diff_off}");
        // PNG and WebP: exact; JPEG: the decoder's few levels.
        let tolerance = if file.ends_with(".jpg") { 5e-2 } else { 1e-6 };
        assert!(diff <= tolerance && diff_off <= tolerance, "{file}: pixel values differ by {diff} / {diff_off}");
    }
    if !refusal {
        return;
    }
    // A page whose frames would pass the model's length is refused before it is resampled.
    let refused = poolserve::input::image::frames::preprocess_frames(
        &image_bytes("gradient_97x61.png"),
        &processor,
        &ImageLimits::default(),
        &tables,
        4,
    );
    assert!(refused.unwrap_err().to_string().contains("5 frames"));
}

/// ColModernVBert's processor without image splitting (`do_image_splitting: false`, each page
/// one square frame, as vLLM runs it): the vectors of transformers' processor in that mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn colmodernvbert_pages_without_splitting() {
    const MODEL: &str = "colmodernvbert-tiny";
    let expected = expected(MODEL);
    let dir = std::env::temp_dir().join(format!("poolserve-colmodernvbert-unsplit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(fixture_model(MODEL)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    let path = dir.join("processor_config.json");
    let mut processor: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    processor["image_processor"]["do_image_splitting"] = json!(false);
    std::fs::write(&path, processor.to_string()).unwrap();
    let unsplit = router(engine(&dir, |_| {}), 16 << 20);
    for page in expected["split_off"].as_array().unwrap() {
        let file = page["file"].as_str().unwrap();
        let message = json!({"role": "user", "content": [image_part(file)]});
        let ours = pooled(&unsplit, json!({"messages": [message], "task": "token_embed"})).await;
        assert_rows(&ours[0], &floats(&page["vectors"]), image_bar(file), &format!("unsplit page {file}"));
    }
    std::fs::remove_dir_all(&dir).ok();
    // With splitting, a page whose frames cannot fit the model's length is a 400 that says so.
    let short = router(engine(&fixture_model(MODEL), |c| c.models[0].max_model_len = Some(16)), 16 << 20);
    let message = json!({"role": "user", "content": [image_part("gradient_97x61.png")]});
    let reply = post(&short, "/pooling", json!({"messages": [message], "task": "token_embed"})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    let text = reply.body["error"]["message"].as_str().unwrap();
    assert!(text.contains("makes 5 frames (2 × 2 tiles and the whole image), more than the 4"), "{text}");
}

#[test]
fn colpali_crops_match_the_processor() {
    for model in ["colpali-tiny", "colpali-second-tiny"] {
        let expected = expected(model);
        // What a user's transformers loads from the folder: the torchvision class.
        assert_eq!(expected["image_processor"], "SiglipImageProcessor");
        let loaded = poolserve::loader::load(&ModelOptions::for_model(fixture_model(model).to_str().unwrap())).expect("loads");
        let Some(poolserve::loader::VisionInput::Page { processor, .. }) = loaded.vision else { panic!("no page side") };
        for image in expected["images"].as_array().unwrap() {
            let file = image["file"].as_str().unwrap();
            let ours = preprocess(&image_bytes(file), &processor, &ImageLimits::default()).expect("preprocesses");
            let diff = max_abs_diff(&ours.normalized(), &floats(&image["pixel_values"]));
            eprintln!("{model} {file}: pixel values max abs diff {diff}");
            // PNG: exact (torchvision's resize and fused rescale); JPEG: the decoder's few levels.
            let tolerance = if file.ends_with(".png") { 1e-6 } else { 5e-2 };
            assert!(diff <= tolerance, "{model} {file}: pixel values differ by {diff} (tolerance {tolerance})");
        }
    }
}

/// ColQwen2's patches against `Qwen2VLImageProcessor`'s `pixel_values`: its rows are the
/// patches in 2×2-block order, each `(channel, frame, y, x)` with the picture repeated over two
/// frames; ours are row-major, each `(y, x, channel)`.
#[test]
fn colqwen2_patches_match_the_processor() {
    for model in ["colqwen2-tiny", "colqwen2-second-tiny"] {
        let expected = expected(model);
        assert_eq!(expected["image_processor"], "Qwen2VLImageProcessor");
        let loaded = poolserve::loader::load(&ModelOptions::for_model(fixture_model(model).to_str().unwrap())).expect("loads");
        let Some(poolserve::loader::VisionInput::SoftTokens { patches: config, .. }) = loaded.vision else { panic!("no patch side") };
        for image in expected["images"].as_array().unwrap() {
            let file = image["file"].as_str().unwrap();
            let ours = poolserve::input::image::patches::preprocess_patches(&image_bytes(file), &config, &ImageLimits::default()).unwrap();
            let grid = ids(&image["grid_thw"]);
            let (rows, cols) = (grid[1] as usize, grid[2] as usize);
            assert_eq!(ours.positions.len(), rows * cols, "{model} {file}: patch count");
            let reference = hf_patches_row_major(&floats(&image["pixel_values"]), rows, cols);
            let diff = max_abs_diff(&ours.rescaled(), &reference);
            eprintln!("{model} {file}: pixel values max abs diff {diff}");
            let tolerance = if file.ends_with(".png") { 1e-6 } else { 0.1 };
            assert!(diff <= tolerance, "{model} {file}: pixel values differ by {diff} (tolerance {tolerance})");
        }
    }
}

/// Qwen2-VL's `pixel_values` rows (2×2-block order, `(c, t, y, x)`, 14-pixel patches) as our
/// row-major `(y, x, c)` patches (the first frame; both are the same picture).
fn hf_patches_row_major(rows_in: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let (p, m) = (14, 2);
    let patch_len = 3 * 2 * p * p;
    let mut out = vec![0f32; rows * cols * p * p * 3];
    let mut k = 0;
    for by in 0..rows / m {
        for bx in 0..cols / m {
            for dy in 0..m {
                for dx in 0..m {
                    let (gy, gx) = (by * m + dy, bx * m + dx);
                    let src = &rows_in[k * patch_len..(k + 1) * patch_len];
                    let dst = (gy * cols + gx) * p * p * 3;
                    for c in 0..3 {
                        for y in 0..p {
                            for x in 0..p {
                                out[dst + (y * p + x) * 3 + c] = src[(c * 2) * p * p + y * p + x];
                            }
                        }
                    }
                    k += 1;
                }
            }
        }
    }
    out
}

/// A fixture's config and its mapped weights.
fn weights(model: &str) -> (Value, VarBuilder<'static>) {
    let folder = fixture_model(model);
    let config: Value = serde_json::from_str(&std::fs::read_to_string(folder.join("config.json")).unwrap()).unwrap();
    // SAFETY: the fixture is not modified while the test maps it.
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[folder.join("model.safetensors")], DType::F32, &Device::Cpu).unwrap() };
    (config, vb)
}

/// The language model on the processor's ids of every image in one padding-free batch, the
/// tower's `soft` rows in place of `placeholder` (and each image's token grid, for a model
/// that places them): every row of every image at cosine ≥ 0.9999 to transformers'.
fn assert_pages(
    backbone: &dyn Backbone,
    (images, reference): (&[Value], &str),
    placeholder: u32,
    soft: Tensor,
    grid: impl Fn(&Value) -> Option<(usize, usize)>,
) {
    let inputs: Vec<TokenizedInput> = images
        .iter()
        .map(|i| {
            let ids = ids(&i["input_ids"]);
            TokenizedInput { type_ids: vec![0; ids.len()], ids }
        })
        .collect();
    let mut batch = Batch::from_inputs(&inputs);
    let positions: Vec<usize> = batch.input_ids.iter().enumerate().filter(|(_, &id)| id == placeholder).map(|(i, _)| i).collect();
    assert_eq!(positions.len(), soft.dim(0).unwrap(), "one soft token per placeholder");
    let (mut grids, mut offset) = (Vec::new(), 0);
    for (rows, cols) in images.iter().filter_map(grid) {
        grids.push(ImageGrid { first: positions[offset], rows, cols });
        offset += rows * cols;
    }
    let mut soft = SoftTokens::new(positions, soft).unwrap();
    soft.grids = grids;
    batch.soft_tokens = Some(soft);
    let hidden = backbone.forward(&batch).unwrap();
    for ((start, len), image) in batch.spans().zip(images) {
        let rows = hidden.narrow(0, start, len).unwrap();
        let norms = rows.sqr().unwrap().sum_keepdim(1).unwrap().sqrt().unwrap();
        let ours = rows.broadcast_div(&norms).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_rows(&ours, &floats(&image[reference]), 0.9999, &format!("model on transformers' pixels {} ({reference})", image["file"]));
    }
}

/// ColPali's tower on transformers' pixel values and its language model on the processor's ids.
#[test]
fn colpali_matches_transformers_on_its_pixel_values() {
    for model in ["colpali-tiny", "colpali-second-tiny"] {
        let expected = expected(model);
        let (config, vb) = weights(model);
        let architecture = &poolserve::models::colpali::COLPALI;
        let backbone = architecture.backbone(&config, vb.clone()).unwrap();
        let tower = architecture.crop_token_tower(&config, vb).unwrap().expect("a page tower");
        let images = expected["images"].as_array().unwrap();
        let pixels: Vec<f32> = images.iter().flat_map(|i| floats(&i["pixel_values"])).collect();
        let soft = tower.forward(&pixels, images.len()).unwrap();
        assert_pages(backbone.as_ref(), (images, "vectors"), tower.placeholder(), soft, |_| None);
    }
}

/// ColQwen2's tower on transformers' pixel values and Qwen2-VL's language model on the
/// processor's ids, for both shapes: every token placed by its index (the class as called),
/// and with `"mrope_positions": true` colpali-engine's M-RoPE.
#[test]
fn colqwen2_matches_transformers_on_its_pixel_values() {
    for model in ["colqwen2-tiny", "colqwen2-second-tiny"] {
        let expected = expected(model);
        let (mut config, vb) = weights(model);
        let architecture = &poolserve::models::colqwen2::COLQWEN2;
        let tower = architecture.soft_token_tower(&config, vb.clone()).unwrap().expect("a patch tower");
        let images = expected["images"].as_array().unwrap();
        let grid = |i: &Value| {
            let grid = ids(&i["grid_thw"]);
            (grid[1] as usize, grid[2] as usize)
        };
        let patches: Vec<ImagePatches> = images
            .iter()
            .map(|i| {
                let (rows, cols) = grid(i);
                let positions = (0..rows * cols).map(|k| ((k % cols) as u32, (k / cols) as u32)).collect();
                ImagePatches { pixels: hf_patches_row_major(&floats(&i["pixel_values"]), rows, cols), positions }
            })
            .collect();
        let soft = tower.forward(&patches.iter().collect::<Vec<_>>()).unwrap();
        // One soft token per 2×2 block of patches.
        let blocks = |i: &Value| Some((grid(i).0 / 2, grid(i).1 / 2));
        let backbone = architecture.backbone(&config, vb.clone()).unwrap();
        assert_pages(backbone.as_ref(), (images, "vectors"), tower.image_tokens().placeholder, soft.clone(), blocks);
        config["mrope_positions"] = json!(true);
        let backbone = architecture.backbone(&config, vb).unwrap();
        assert_pages(backbone.as_ref(), (images, "vectors_mrope"), tower.image_tokens().placeholder, soft, blocks);
    }
}

/// `"mrope_positions": true` through `--hf-overrides` over HTTP: colpali-engine's pages and
/// their MaxSim scores; queries as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn colqwen2_pages_with_mrope_positions_on_request() {
    const MODEL: &str = "colqwen2-second-tiny";
    let expected = expected(MODEL);
    let engine = engine(&fixture_model(MODEL), |o| {
        o.models[0].hf_overrides.insert("mrope_positions".into(), json!(true));
    });
    let router = router(engine, 16 << 20);
    let images = expected["images"].as_array().unwrap();
    for image in images {
        let file = image["file"].as_str().unwrap();
        let message = json!({"role": "user", "content": [image_part(file)]});
        let ours = pooled(&router, json!({"messages": [message], "task": "token_embed"})).await;
        assert_rows(&ours[0], &floats(&image["vectors_mrope"]), image_bar(file), &format!("M-RoPE page {file}"));
        let plain = floats(&image["vectors"]);
        assert!(cosine(&ours[0], &plain) < 0.999, "{file}: the placements differ on a page");
    }
    let parts: Vec<Value> = images.iter().map(|i| image_part(i["file"].as_str().unwrap())).collect();
    let query = &expected["queries"][0];
    let reply = post(&router, "/score", json!({"data_1": query["text"], "data_2": one_part_documents(&parts)})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    for (j, image) in images.iter().enumerate() {
        let (ours, want) = (reply.body["data"][j]["score"].as_f64().unwrap(), expected["scores_mrope"][0][j].as_f64().unwrap());
        assert!((ours - want).abs() <= 1e-4 * want.abs().max(1.0), "query 0 × {}: score {ours}, colpali-engine's {want}", image["file"]);
    }
}

/// `/pooling` token_embed for a list of texts or of image messages: each input's rows.
async fn pooled(router: &axum::Router, body: Value) -> Vec<Vec<f32>> {
    let reply = post(router, "/pooling", body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply.body["data"].as_array().unwrap().iter().map(|d| matrix(&d["data"])).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_and_pages_embed_and_score_over_http_as_transformers_does() {
    for model in MODELS {
        queries_and_pages_over_http(model).await;
    }
}

async fn queries_and_pages_over_http(model: &str) {
    eprintln!("{model}:");
    let expected = expected(model);
    let engine = engine(&fixture_model(model), |_| {});
    assert_eq!(engine.spec().tasks, vec![poolserve::pooling::Task::TokenEmbed, poolserve::pooling::Task::Score]);
    let router = router(engine, 16 << 20);
    let queries = expected["queries"].as_array().unwrap();
    let images = expected["images"].as_array().unwrap();

    // Queries: the processor's frame ("<bos>Question: ", ten pads and "\n"), token for token.
    for q in queries {
        let reply = post(&router, "/tokenize", json!({"prompt": q["text"]})).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(ids(&reply.body["tokens"]), ids(&q["input_ids"]), "query {} tokens", q["text"]);
        let ours = pooled(&router, json!({"input": q["text"], "task": "token_embed"})).await;
        assert_rows(&ours[0], &floats(&q["vectors"]), 0.9999, &format!("query {} alone", q["text"]));
    }
    let texts: Vec<&Value> = queries.iter().map(|q| &q["text"]).collect();
    let batched = pooled(&router, json!({"input": texts, "task": "token_embed"})).await;
    for (ours, q) in batched.iter().zip(queries) {
        assert_rows(ours, &floats(&q["batched"]), 0.9999, &format!("query {} batched", q["text"]));
    }

    // Pages, alone and all in one request.
    let message = |file: &str| json!({"role": "user", "content": [image_part(file)]});
    for image in images {
        let file = image["file"].as_str().unwrap();
        let ours = pooled(&router, json!({"messages": [message(file)], "task": "token_embed"})).await;
        assert_rows(&ours[0], &floats(&image["vectors"]), jpeg_bar(model, file), &format!("page {file} alone"));
        if file.ends_with(".jpg") {
            // The JPEG's pixels as Pillow decodes them: the model meets the f32 bar, so what
            // the JPEG itself misses is the decoder's.
            let decoded = json!({"role": "user", "content": [part_of(&pillow_decoded(file))]});
            let ours = pooled(&router, json!({"messages": [decoded], "task": "token_embed"})).await;
            assert_rows(&ours[0], &floats(&image["vectors"]), 0.9999, &format!("page {file} as Pillow decodes it"));
        }
    }
    let messages: Vec<Value> = images.iter().map(|i| message(i["file"].as_str().unwrap())).collect();
    let batched = pooled(&router, json!({"messages": messages, "task": "token_embed"})).await;
    for (ours, image) in batched.iter().zip(images) {
        let file = image["file"].as_str().unwrap();
        assert_rows(ours, &floats(&image["batched"]), jpeg_bar(model, file), &format!("page {file} batched"));
    }

    // Infinity's form: `/embeddings` with `modality: "image"`, a matrix per page.
    let urls: Vec<Value> = images.iter().map(|i| image_part(i["file"].as_str().unwrap())["image_url"]["url"].clone()).collect();
    let reply = post(&router, "/embeddings", json!({"input": urls, "modality": "image"})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    for (item, image) in reply.body["data"].as_array().unwrap().iter().zip(images) {
        let file = image["file"].as_str().unwrap();
        assert_rows(&matrix(&item["embedding"]), &floats(&image["vectors"]), jpeg_bar(model, file), &format!("Infinity page {file}"));
    }
    let reply = post(&router, "/embeddings", json!({"input": urls, "modality": "video"})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);

    // MaxSim of each query against every page, as `score_retrieval`; the JPEG page's score
    // carries its decoder difference, so the bar is on the PNG pages.
    let parts: Vec<Value> = images.iter().map(|i| image_part(i["file"].as_str().unwrap())).collect();
    for (qi, q) in queries.iter().enumerate() {
        let reply = post(&router, "/score", json!({"data_1": q["text"], "data_2": one_part_documents(&parts)})).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        for (j, image) in images.iter().enumerate() {
            let (ours, want) = (reply.body["data"][j]["score"].as_f64().unwrap(), expected["scores"][qi][j].as_f64().unwrap());
            let file = image["file"].as_str().unwrap();
            // A MaxSim score sums one cosine per query vector (about 10 here): 1e-4 of it,
            // 1e-4 for a score up to 1. The JPEG's decoder difference (see `image_bar`).
            let jpeg = if model == "colpali-second-tiny" { 0.4 } else { 0.2 };
            let tolerance = if file.ends_with(".png") { 1e-4 * want.abs().max(1.0) } else { jpeg };
            assert!((ours - want).abs() <= tolerance, "query {qi} × {file}: score {ours}, transformers {want}");
        }
        // Usage: each page's sequence and its tower's patches, and the query's sequence.
        // ColPali's crop and ColModernVBert's frame: the tower's patches over its square (16 in
        // the first shapes).
        let vision = &expected["shape"]["vision"];
        let square = match (vision["image_size"].as_u64(), vision["patch_size"].as_u64()) {
            (Some(side), Some(patch)) => (side / patch).pow(2) as usize,
            _ => 16,
        };
        let patches = |i: &Value| match (i.get("grid_thw"), i.get("frames")) {
            (Some(grid), _) => ids(grid).iter().product::<u32>() as usize,
            (None, Some(frames)) => square * frames.as_u64().unwrap() as usize,
            (None, None) => square,
        };
        let pages: usize = images.iter().map(|i| i["input_ids"].as_array().unwrap().len() + patches(i)).sum();
        assert_eq!(reply.body["usage"]["prompt_tokens"], json!(pages + q["input_ids"].as_array().unwrap().len()));
    }
    // /rerank: the same scores, ranked.
    let reply = post(&router, "/rerank", json!({"query": queries[0]["text"], "documents": one_part_documents(&parts)})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    for result in reply.body["results"].as_array().unwrap() {
        let j = result["index"].as_u64().unwrap() as usize;
        // vLLM's RerankDocument: a content document comes back as its parts.
        assert_eq!(result["document"], json!({"multi_modal": [parts[j]]}));
        if images[j]["file"].as_str().unwrap().ends_with(".png") {
            let want = expected["scores"][0][j].as_f64().unwrap();
            assert!((result["relevance_score"].as_f64().unwrap() - want).abs() <= 1e-4 * want.abs().max(1.0), "rerank {j}");
        }
    }
    // Text documents score as queries do (the processor reads every text as one).
    let reply = post(&router, "/score", json!({"text_1": queries[0]["text"], "text_2": [queries[1]["text"]]})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn page_vectors_come_as_base64_half_floats() {
    const MODEL: &str = "colqwen2-tiny";
    let expected = expected(MODEL);
    let router = router(engine(&fixture_model(MODEL), |_| {}), 16 << 20);
    let image = &expected["images"][0];
    let message = json!({"role": "user", "content": [image_part(image["file"].as_str().unwrap())]});
    let reply = post(
        &router,
        "/pooling",
        json!({"messages": [message], "task": "token_embed", "encoding_format": "base64", "embed_dtype": "float16"}),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let bytes = base64::engine::general_purpose::STANDARD.decode(reply.body["data"][0]["data"].as_str().unwrap()).unwrap();
    let halves: Vec<f32> = bytes.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect();
    // Half the bytes of float32, rows one after another.
    assert_eq!(halves.len(), image["rows"].as_u64().unwrap() as usize * DIM);
    assert_rows(&halves, &floats(&image["vectors"]), 0.999, "float16 page");
    // float8: a byte a value.
    let reply = post(
        &router,
        "/pooling",
        json!({"messages": [message], "task": "token_embed", "encoding_format": "base64", "embed_dtype": "fp8_e4m3"}),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let bytes = base64::engine::general_purpose::STANDARD.decode(reply.body["data"][0]["data"].as_str().unwrap()).unwrap();
    assert_eq!(bytes.len(), image["rows"].as_u64().unwrap() as usize * DIM);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_and_misplaced_inputs_are_refused() {
    for model in MODELS {
        refusals(model).await;
    }
}

async fn refusals(model: &str) {
    let router = router(engine(&fixture_model(model), |_| {}), 16 << 20);
    // A text and an image in one input: the processor takes one or the other.
    let mixed = json!({"role": "user", "content": [{"type": "text", "text": "a page"}, image_part("gradient_97x61.png")]});
    let reply = post(&router, "/pooling", json!({"messages": [mixed], "task": "token_embed"})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert!(
        reply.body["error"]["message"].as_str().unwrap().contains("one text (a query) or one image (a page) per input"),
        "{}",
        reply.body
    );
    // The image placeholder typed in a query would stand for an image that is not there.
    let placeholder = if model.starts_with("colpali") || model.starts_with("colmodernvbert") { "<image>" } else { "<|image_pad|>" };
    let reply = post(&router, "/pooling", json!({"input": format!("{placeholder} what"), "task": "token_embed"})).await;
    assert_eq!(reply.status, 400, "{model}: {}", reply.body);
    // An undecodable page.
    let broken = json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]});
    let reply = post(&router, "/pooling", json!({"messages": [broken], "task": "token_embed"})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
}
