//! `--dtype auto` on a CPU that multiplies bf16 natively (AMX tiles, AVX-512 BF16): whether a
//! float32 checkpoint runs in bfloat16 there, as OpenVINO computes by default on such CPUs and as
//! vLLM's `auto` halves float32 checkpoints. Decided at load by a probe, not assumed: the same
//! texts go through the float32 backbone and a bf16 copy of it, and the copy is kept only when
//! every token's final hidden state and every sequence's mean stay within cosine [`MIN_COSINE`]
//! of float32 (the bound the parity tests hold `--dtype bfloat16` to). The copy runs as
//! `--dtype bfloat16` does: bf16 linears and, on AMX, attention's products on tiles
//! ([`crate::models::Bf16Backbone`]), so the probe measures what will serve. Otherwise the model
//! stays float32 and the log and `/info` say why.
//!
//! Models whose outputs are scores stay float32 without a probe: classifiers, cross-encoders and
//! token classifiers (scores are held to 1e-4 and bf16 moves classifier probabilities by up to
//! 2.5e-3 on our fixtures, docs/models.md "Precision"), SPLADE's and BGE-M3's sparse weights,
//! generative scores. So do models with image or audio towers, LoRA adapters or int8 weights,
//! whose other parts the probe does not cover.

use super::LoadError;
use crate::input::tokenizer::{EncodeOptions, TextTokenizer, TruncationSide};
use crate::kernels::WeightFormat;
use crate::models::batch::Batch;
use crate::models::Backbone;
use candle_core::Tensor;

/// The cosine to float32 below which a probe keeps float32.
pub const MIN_COSINE: f64 = 0.9999;

/// Texts of several lengths and kinds (prose, a question, code, numbers, a long paragraph), so
/// that the probe sees short and long attention spans; cut to the model's length.
const PROBE_TEXTS: [&str; 5] = [
    "hello world",
    "What is the capital of France, and how many people live there?",
    "fn main() { let total: u64 = (1..=100).map(|n| n * n).sum(); println!(\"{total}\"); }",
    "Invoice 2024-117: 3 items at 19.99 EUR, 2 at 5.50 EUR; VAT 20%; due 2025-01-31.",
    "Retrieval-augmented generation splits documents into passages, embeds each passage once, \
     and at query time embeds the question and ranks the passages by the cosine similarity of \
     their vectors. The quality of the answer depends on whether the right passages are found, \
     so the embedding model must place a question near the passages that answer it even when \
     they share few words, and far from passages that share words but answer something else. \
     Long documents are cut into overlapping windows; tables, code and lists are kept whole \
     where they fit, since splitting them scatters the facts a reader needs across passages.",
];

/// What the probe found.
pub struct Outcome {
    /// The bf16 copy, when it stayed within [`MIN_COSINE`].
    pub backbone: Option<Box<dyn Backbone>>,
    /// Why the model runs in the dtype it does, for the log and `/info`.
    pub reason: String,
}

/// Runs the probe: `bf16` builds the bf16 copy of `f32` (the same architecture over the same
/// weights, packed as [`WeightFormat::Bf16`]); `kernel` names the native bf16 kernel.
pub fn probe(
    f32: &dyn Backbone,
    bf16: impl FnOnce() -> Result<Box<dyn Backbone>, LoadError>,
    tokenizer: &TextTokenizer,
    max_len: usize,
    kernel: &str,
) -> Result<Outcome, LoadError> {
    let started = std::time::Instant::now();
    let options = EncodeOptions {
        add_special_tokens: true,
        truncate_to: Some(max_len.min(256)),
        side: TruncationSide::Right,
        pair_limits: Default::default(),
    };
    let inputs = PROBE_TEXTS.iter().map(|text| tokenizer.encode(text, options)).collect::<Result<Vec<_>, _>>()?;
    let batch = Batch::from_inputs(&inputs);
    let reference = f32.forward(&batch)?;
    let candidate = crate::kernels::with_cpu_weight_format(WeightFormat::Bf16, bf16)?;
    let (tokens, means) = worst_cosines(&reference, &candidate.forward(&batch)?, &batch.cu_seqlens)?;
    let measured = format!(
        "the load-time probe's worst cosine to float32 is {tokens:.6} per token and {means:.6} per sequence mean ({} texts, {} tokens, {:.2?})",
        inputs.len(),
        batch.input_ids.len(),
        started.elapsed()
    );
    Ok(match tokens.min(means) >= MIN_COSINE {
        true => Outcome { backbone: Some(candidate), reason: format!("bfloat16 on {kernel}: {measured}, ≥ {MIN_COSINE}") },
        false => Outcome { backbone: None, reason: format!("float32: in bfloat16 {measured}, below {MIN_COSINE}") },
    })
}

/// The worst cosine between matching rows of `a` and `b` (`[tokens, hidden]`), and between
/// matching sequences' means (`cu_seqlens` bounds the sequences).
fn worst_cosines(a: &Tensor, b: &Tensor, cu_seqlens: &[usize]) -> candle_core::Result<(f64, f64)> {
    let (a, b) = (a.to_vec2::<f32>()?, b.to_vec2::<f32>()?);
    let worst_token = a.iter().zip(&b).map(|(x, y)| cosine(x, y)).fold(1.0, f64::min);
    let mean = |rows: &[Vec<f32>]| {
        let mut sum = vec![0f64; rows.first().map_or(0, Vec::len)];
        for row in rows {
            sum.iter_mut().zip(row).for_each(|(s, v)| *s += f64::from(*v));
        }
        sum
    };
    let worst_mean = cu_seqlens.windows(2).map(|w| cosine_f64(&mean(&a[w[0]..w[1]]), &mean(&b[w[0]..w[1]]))).fold(1.0, f64::min);
    Ok((worst_token, worst_mean))
}

fn cosine(x: &[f32], y: &[f32]) -> f64 {
    let widen = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
    cosine_f64(&widen(x), &widen(y))
}

/// NaN (a row that is zero or not finite) counts as the worst, 0.
fn cosine_f64(x: &[f64], y: &[f64]) -> f64 {
    let dot: f64 = x.iter().zip(y).map(|(a, b)| a * b).sum();
    let norms = x.iter().map(|a| a * a).sum::<f64>().sqrt() * y.iter().map(|b| b * b).sum::<f64>().sqrt();
    let cosine = dot / norms;
    if cosine.is_finite() {
        cosine
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn the_worst_token_and_the_worst_mean_are_found() {
        let a = Tensor::new(&[[1f32, 0.0], [0.0, 1.0], [1.0, 1.0]], &Device::Cpu).unwrap();
        let b = Tensor::new(&[[1f32, 0.0], [0.1, 1.0], [1.0, 1.0]], &Device::Cpu).unwrap();
        let (token, mean) = worst_cosines(&a, &b, &[0, 2, 3]).unwrap();
        assert!((token - 1.0 / 1.01f64.sqrt()).abs() < 1e-9, "{token}");
        let expected = cosine_f64(&[1.0, 1.0], &[1.1, 1.0]);
        assert!((mean - expected).abs() < 1e-9 && mean < 1.0, "{mean}");
    }

    /// Gives each token the row `[1, 1 + error]`.
    struct Fake {
        error: f32,
    }

    impl Backbone for Fake {
        fn forward(&self, batch: &Batch) -> candle_core::Result<Tensor> {
            let rows: Vec<f32> = batch.input_ids.iter().flat_map(|_| [1.0, 1.0 + self.error]).collect();
            Tensor::from_vec(rows, (batch.input_ids.len(), 2), &Device::Cpu)
        }
        fn sizes(&self) -> crate::models::BackboneSizes {
            crate::models::BackboneSizes { hidden: 2, vocab: 1 << 20, max_positions: 512 }
        }
        fn int8_linears(&mut self) -> Vec<&mut crate::kernels::Linear> {
            Vec::new()
        }
        fn attention_input_linears(&mut self) -> Vec<&mut crate::kernels::Linear> {
            Vec::new()
        }
    }

    fn tokenizer() -> TextTokenizer {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/models/bert-embed-mean/tokenizer.json");
        TextTokenizer::from_file(std::path::Path::new(path), true, true).unwrap()
    }

    #[test]
    fn the_copy_is_kept_within_the_bound_and_dropped_past_it() {
        let kept = probe(&Fake { error: 0.0 }, || Ok(Box::new(Fake { error: 1e-6 })), &tokenizer(), 512, "AMX tiles").unwrap();
        assert!(kept.backbone.is_some(), "{}", kept.reason);
        assert!(kept.reason.starts_with("bfloat16 on AMX tiles: the load-time probe's worst cosine"), "{}", kept.reason);
        // cos([1, 1], [1, 1.05]) = 0.99970.
        let dropped = probe(&Fake { error: 0.0 }, || Ok(Box::new(Fake { error: 0.05 })), &tokenizer(), 512, "AMX tiles").unwrap();
        assert!(dropped.backbone.is_none(), "{}", dropped.reason);
        assert!(
            dropped.reason.starts_with("float32: in bfloat16 the load-time probe's worst cosine")
                && dropped.reason.ends_with("below 0.9999")
        );
    }

    #[test]
    fn a_zero_or_broken_row_counts_as_the_worst() {
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
        assert_eq!(cosine(&[f32::NAN, 1.0], &[1.0, 0.0]), 0.0);
    }
}
