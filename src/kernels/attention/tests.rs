//! The CPU kernel against the composite path: head sizes, grouped queries, masks, biases,
//! long sequences, and its working memory.

use super::kernel::{MAX_SCRATCH_FLOATS, QUERY_BLOCK, TILE_K};
use super::*;
use crate::kernels::test_util::{max_diff, random};
use candle_core::DType;

#[test]
fn attention_kernel_matches_composite_per_sequence() {
    let cu = [0usize, 5, 6, 17];
    // head_dim 4 exercises the remainder path, 32 the register tiles; with and without bias.
    for (hidden, heads) in [(8, 2), (64, 2)] {
        let qkv = (random((17, 3 * hidden), 9) * 3.0).unwrap();
        let bias = Bias::new((random((1, 3 * hidden), 10).flatten_all().unwrap() * 2.0).unwrap()).unwrap();
        let att = Attention {
            num_heads: heads,
            num_kv_heads: heads,
            head_dim: hidden / heads,
            cu_seqlens: &cu,
            mask: AttentionMask::Bidirectional,
            position_bias: None,
            disentangled: None,
            softcap: None,
        };
        let fast = att.forward(&qkv, None).unwrap();
        assert_eq!(fast.dims(), &[17, hidden]);
        assert_eq!(fast.dtype(), DType::F32);
        assert!(max_diff(&fast, &att.forward_generic(&qkv).unwrap()) < 1e-5);
        let biased = att.forward(&qkv, Some(&bias)).unwrap();
        let reference = att.forward_generic(&qkv.broadcast_add(&bias.tensor).unwrap()).unwrap();
        assert!(max_diff(&biased, &reference) < 1e-5, "hidden {hidden}");
    }
}

#[test]
fn grouped_query_and_masked_attention_match_composite() {
    let cu = [0usize, 5, 6, 25];
    // 4 query heads over 2 key/value heads of 16 dims: q 64 + k 32 + v 32 columns.
    let qkv = (random((25, 128), 12) * 3.0).unwrap();
    let bias = Bias::new(random((1, 128), 13).flatten_all().unwrap()).unwrap();
    for mask in [AttentionMask::Bidirectional, AttentionMask::Causal, AttentionMask::Window(2), AttentionMask::CausalWindow(3)] {
        let att = Attention {
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 16,
            cu_seqlens: &cu,
            mask,
            position_bias: None,
            disentangled: None,
            softcap: None,
        };
        let fast = att.forward(&qkv, Some(&bias)).unwrap();
        assert_eq!(fast.dims(), &[25, 64]);
        let reference = att.forward_generic(&qkv.broadcast_add(&bias.tensor).unwrap()).unwrap();
        assert!(max_diff(&fast, &reference) < 1e-5, "{mask:?}");
        // Gemma 2's soft cap (small, so that it bends the scores).
        let capped = Attention { softcap: Some(0.5), ..att };
        let fast = capped.forward(&qkv, Some(&bias)).unwrap();
        let reference = capped.forward_generic(&qkv.broadcast_add(&bias.tensor).unwrap()).unwrap();
        assert!(max_diff(&fast, &reference) < 1e-5, "{mask:?} capped");
        assert!(max_diff(&fast, &att.forward(&qkv, Some(&bias)).unwrap()) > 1e-3, "the cap changes the scores");
    }
    // A relative position bias (MPNet), longer than the longest sequence.
    let max_len = 20;
    let values = random((2, 2 * max_len - 1), 14).flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let position_bias = PositionBias { values, max_len };
    let qkv = random((25, 96), 15);
    let att = Attention {
        num_heads: 2,
        num_kv_heads: 2,
        head_dim: 16,
        cu_seqlens: &cu,
        mask: AttentionMask::Bidirectional,
        position_bias: Some(&position_bias),
        disentangled: None,
        softcap: None,
    };
    assert!(max_diff(&att.forward(&qkv, None).unwrap(), &att.forward_generic(&qkv).unwrap()) < 1e-5, "position bias");
}

#[test]
fn sequences_longer_than_a_query_block_match_composite() {
    // 300 tokens: three query blocks (the last partial), next to a short sequence. The causal and
    // windowed masks make each block's span of keys start and end at other tiles (the kernel
    // skips the keys no query of a block sees); 24 dims also run the remainder loop over a span.
    let cu = [0usize, 300, 307];
    let max_len = 300;
    let masks = [
        AttentionMask::Bidirectional,
        AttentionMask::Causal,
        AttentionMask::Window(150),
        AttentionMask::Window(20),
        AttentionMask::CausalWindow(40),
    ];
    // 4 query heads over 2 key/value heads of 16 dims; 2 heads of 24.
    for (heads, kv_heads, head_dim) in [(4usize, 2usize, 16usize), (2, 2, 24)] {
        let width = (heads + 2 * kv_heads) * head_dim;
        let qkv = (random((307, width), 16) * 2.0).unwrap();
        let bias = Bias::new(random((1, width), 17).flatten_all().unwrap()).unwrap();
        let values = random((heads, 2 * max_len - 1), 18).flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let position_bias = PositionBias { values, max_len };
        for mask in masks {
            for relative in [None, Some(&position_bias)] {
                let att = Attention {
                    num_heads: heads,
                    num_kv_heads: kv_heads,
                    head_dim,
                    cu_seqlens: &cu,
                    mask,
                    position_bias: relative,
                    disentangled: None,
                    softcap: None,
                };
                let fast = att.forward(&qkv, Some(&bias)).unwrap();
                let reference = att.forward_generic(&qkv.broadcast_add(&bias.tensor).unwrap()).unwrap();
                let diff = max_diff(&fast, &reference);
                assert!(diff < 1e-5, "{mask:?}, head_dim {head_dim}, relative bias {}: {diff}", relative.is_some());
            }
        }
    }
}

#[test]
fn a_blocks_span_of_keys_holds_every_key_its_queries_see() {
    use super::kernel::block_keys;
    let len = 1000;
    for mask in [AttentionMask::Bidirectional, AttentionMask::Causal, AttentionMask::Window(70), AttentionMask::CausalWindow(33)] {
        for first in (0..len).step_by(QUERY_BLOCK) {
            let n = QUERY_BLOCK.min(len - first);
            let span = block_keys(mask, first, n, len);
            assert!(span.start.is_multiple_of(TILE_K) && span.start < span.end && span.end <= len, "{mask:?} {first}: {span:?}");
            for i in first..first + n {
                let (lo, hi) = mask.keys(i, len);
                assert!(span.start <= lo && hi <= span.end, "{mask:?} query {i}: {lo}..{hi} outside {span:?}");
            }
        }
    }
    // A causal block ends at its last query: the last block of 1000 tokens spans them all, the
    // first only its own 128.
    assert_eq!(block_keys(AttentionMask::Causal, 0, QUERY_BLOCK, len), 0..QUERY_BLOCK);
    assert_eq!(block_keys(AttentionMask::CausalWindow(33), 512, QUERY_BLOCK, len), 480..640);
}

#[test]
fn wide_heads_over_long_sequences_match_composite() {
    // EmbeddingGemma 2's shapes: 4 query heads over 2 key/value heads of 256, and over 1 of 512,
    // 150 tokens, with scores as sharp as its unscaled q/k-normed products (std ~ sqrt(head_dim)).
    let cu = [0usize, 150, 157];
    for (kv_heads, head_dim) in [(2, 256), (1, 512)] {
        let width = (4 + 2 * kv_heads) * head_dim;
        let qkv = (random((157, width), 19) * 2.0).unwrap();
        for mask in [AttentionMask::Bidirectional, AttentionMask::Window(40)] {
            let att = Attention {
                num_heads: 4,
                num_kv_heads: kv_heads,
                head_dim,
                cu_seqlens: &cu,
                mask,
                position_bias: None,
                disentangled: None,
                softcap: None,
            };
            let fast = att.forward(&qkv, None).unwrap();
            let reference = att.forward_generic(&qkv).unwrap();
            let diff = max_diff(&fast, &reference);
            assert!(diff < 1e-5, "{kv_heads} kv heads of {head_dim}, {mask:?}: {diff}");
        }
    }
}

#[test]
fn disentangled_bias_matches_composite() {
    // A 300-token sequence (three query blocks) beside a 7-token one; 4 heads of 16 dims,
    // 9 bucket columns reached through an uneven distance → column map.
    let cu = [0usize, 300, 307];
    let (heads, tokens, columns, max_len) = (4, 307, 9, 300);
    let qkv = random((tokens, 3 * heads * 16), 20);
    let table = |seed| random((heads * tokens, columns), seed).flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let column_of = (0..2 * max_len - 1).map(|x| ((x * columns) / (2 * max_len - 1)) as u32).collect();
    let terms = DisentangledBias { c2p: table(21), p2c: table(22), tokens, columns, column_of, max_len };
    let att = Attention {
        num_heads: heads,
        num_kv_heads: heads,
        head_dim: 16,
        cu_seqlens: &cu,
        mask: AttentionMask::Bidirectional,
        position_bias: None,
        disentangled: Some(&terms),
        softcap: None,
    };
    let plain = Attention { disentangled: None, ..att };
    let fast = att.forward(&qkv, None).unwrap();
    assert!(max_diff(&fast, &att.forward_generic(&qkv).unwrap()) < 1e-5);
    assert!(max_diff(&fast, &plain.forward(&qkv, None).unwrap()) > 1e-3, "the terms change the result");
    // A table that does not cover the batch is an error, not a read out of bounds.
    let short = DisentangledBias { tokens: 300, ..terms.clone() };
    assert!(Attention { disentangled: Some(&short), ..plain }.forward(&qkv, None).is_err());
}

/// The working memory of one attention job: QUERY_BLOCK × len scores plus Kᵀ, V and a Q block,
/// not len × len (a 32k-token sequence would need 4 GiB per thread).
#[test]
fn working_memory_is_linear_in_the_sequence_length() {
    let len = 4096;
    let cu = [0usize, len];
    let qkv = random((len, 3 * 64), 19);
    let att = Attention {
        num_heads: 1,
        num_kv_heads: 1,
        head_dim: 64,
        cu_seqlens: &cu,
        mask: AttentionMask::Causal,
        position_bias: None,
        disentangled: None,
        softcap: None,
    };
    att.forward(&qkv, None).unwrap();
    let floats = MAX_SCRATCH_FLOATS.load(std::sync::atomic::Ordering::Relaxed);
    // Kᵀ and the scores round the length up to a key tile; V is packed as it is.
    let linear = QUERY_BLOCK * 64 + (64 + QUERY_BLOCK) * len.div_ceil(TILE_K) * TILE_K + len * 64;
    assert!(floats <= linear, "scratch of {floats} floats for {len} tokens; linear bound {linear}");
    assert!(floats < len * len / 8, "scratch of {floats} floats is quadratic");
}
