//! Offline embedding with the library API: load all-MiniLM-L6-v2 in-process, embed a few
//! sentences, print their cosine similarities. No server, same engine and numbers.
//!
//!     cargo run --release --example offline_embed [-- MODEL_DIR]    # default models/all-MiniLM-L6-v2

use poolserve::library::PoolingParams;
use poolserve::library::{LocalModel, LocalModelOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let model = std::env::args().nth(1).unwrap_or_else(|| "models/all-MiniLM-L6-v2".into());
    let model = LocalModel::load(LocalModelOptions::for_model(model))?;
    let sentences = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby."];
    // Embeddings come back L2-normalized, so a dot product is the cosine.
    let vectors = model.embed(&sentences, &PoolingParams::default())?;
    for (i, sentence) in sentences.iter().enumerate().skip(1) {
        let cosine: f32 = vectors[0].iter().zip(&vectors[i]).map(|(a, b)| a * b).sum();
        println!("{cosine:+.3}  {:?} ~ {sentence:?}", sentences[0]);
    }
    let paraphrase: f32 = vectors[0].iter().zip(&vectors[1]).map(|(a, b)| a * b).sum();
    let unrelated: f32 = vectors[0].iter().zip(&vectors[2]).map(|(a, b)| a * b).sum();
    if paraphrase <= unrelated {
        return Err("the paraphrase should score above the unrelated sentence".into());
    }
    Ok(())
}
