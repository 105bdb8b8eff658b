//! The load-time self-check of the CUDA kernels: each runs on small random inputs against the
//! ops' composite paths (candle's ops) on the same device. It depends on the ops; the kernels
//! (`mod.rs`) do not.

use super::{attention, bias_activation, bias_residual, gated, layer_norm, rms_norm};
use crate::models::ops::{Activation, Attention, AttentionMask, PositionBias};
use candle_core::{DType, Device, Result, Tensor};

/// Runs every kernel on small random inputs in `dtype` against candle's composite ops on the
/// same device; on a mismatch, disables the kernels for this process and says which one.
pub fn self_check(device: &Device, dtype: DType) -> std::result::Result<(), String> {
    let result =
        check_kernels(device, dtype).map_err(|e| e.to_string().lines().next().unwrap_or_default().to_string()).and_then(
            |worst| match worst {
                Some(problem) => Err(problem),
                None => Ok(()),
            },
        );
    if result.is_err() {
        super::disable();
    }
    result
}

/// The first kernel whose output is off by more than the dtype's tolerance, if any.
fn check_kernels(device: &Device, dtype: DType) -> Result<Option<String>> {
    let tolerance = match dtype {
        DType::F32 => 1e-4,
        DType::F16 => 2e-2,
        _ => 1e-1,
    };
    let random = |shape: (usize, usize), seed: u64| -> Result<Tensor> {
        let mut state = seed;
        let values: Vec<f32> = (0..shape.0 * shape.1)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect();
        Tensor::from_vec(values, shape, device)?.to_dtype(dtype)
    };
    // On the host: a device max would drop NaN (fmaxf), and a NaN must fail the check.
    let diff = |a: &Tensor, b: &Tensor| -> Result<f32> {
        let host = |t: &Tensor| t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>();
        let (a, b) = (host(a)?, host(b)?);
        if a.len() != b.len() {
            return Ok(f32::INFINITY);
        }
        Ok(a.iter().zip(&b).map(|(x, y)| if x.is_finite() && y.is_finite() { (x - y).abs() } else { f32::INFINITY }).fold(0.0, f32::max))
    };
    let mut problems = Vec::new();
    let mut compare = |name: &str, fast: Tensor, reference: Tensor| -> Result<()> {
        let d = diff(&fast, &reference)?;
        if d.is_nan() || d > tolerance {
            problems.push(format!("{name} differs from candle's ops by {d}"));
        }
        Ok(())
    };
    let (rows, cols) = (37, 96);
    let x = random((rows, cols), 1)?;
    let residual = random((rows, cols), 2)?;
    let bias = random((1, cols), 3)?.flatten_all()?;
    for act in [Activation::Gelu, Activation::GeluTanh, Activation::Relu, Activation::Silu] {
        let reference = Activation::composite(&x.broadcast_add(&bias)?, act)?;
        compare(&format!("bias_activation {act:?}"), bias_activation(&x, Some(&bias), act.kernel())?, reference)?;
    }
    compare(
        "activation without bias",
        bias_activation(&x, None, Activation::Gelu.kernel())?,
        Activation::composite(&x, Activation::Gelu)?,
    )?;
    compare("bias_residual", bias_residual(&x, Some(&bias), Some(&residual))?, x.broadcast_add(&bias)?.add(&residual)?)?;
    compare("bias alone", bias_residual(&x, Some(&bias), None)?, x.broadcast_add(&bias)?)?;
    compare("residual alone", bias_residual(&x, None, Some(&residual))?, x.add(&residual)?)?;
    let gate = random((rows, 2 * cols), 4)?;
    let (first, second) = (gate.narrow(1, 0, cols)?.contiguous()?, gate.narrow(1, cols, cols)?.contiguous()?);
    compare(
        "gated, act on second",
        gated(&gate, Activation::Silu.kernel(), false)?,
        (Activation::composite(&second, Activation::Silu)? * &first)?,
    )?;
    compare(
        "gated, act on first",
        gated(&gate, Activation::Gelu.kernel(), true)?,
        (Activation::composite(&first, Activation::Gelu)? * &second)?,
    )?;
    let (gamma, beta) = (random((1, cols), 5)?.flatten_all()?, random((1, cols), 6)?.flatten_all()?);
    let summed = x.broadcast_add(&bias)?.add(&residual)?.to_dtype(DType::F32)?;
    let mean = summed.mean_keepdim(1)?;
    let centered = summed.broadcast_sub(&mean)?;
    let normed = centered.broadcast_div(&(centered.sqr()?.mean_keepdim(1)? + 1e-5)?.sqrt()?)?;
    let reference = normed.broadcast_mul(&gamma.to_dtype(DType::F32)?)?.broadcast_add(&beta.to_dtype(DType::F32)?)?;
    compare("layer_norm", layer_norm(&x, Some(&bias), Some(&residual), &gamma, &beta, 1e-5)?, reference)?;
    let plain = x.to_dtype(DType::F32)?;
    let centered = plain.broadcast_sub(&plain.mean_keepdim(1)?)?;
    let normed = centered.broadcast_div(&(centered.sqr()?.mean_keepdim(1)? + 1e-5)?.sqrt()?)?;
    let reference = normed.broadcast_mul(&gamma.to_dtype(DType::F32)?)?.broadcast_add(&beta.to_dtype(DType::F32)?)?;
    compare("layer_norm without bias and residual", layer_norm(&x, None, None, &gamma, &beta, 1e-5)?, reference)?;
    let reference = candle_nn::ops::rms_norm(&x.to_dtype(DType::F32)?, &gamma.to_dtype(DType::F32)?, 1e-6)?;
    compare("rms_norm", rms_norm(&x, &gamma, 1e-6)?, reference)?;

    // Attention: sequences of 5, 1, 39 and 107 tokens (several key tiles, and windows whose
    // tiles see no key of some queries), grouped-query heads of 64 dims, each mask; then head
    // sizes of 128 (Qwen3), 32 (MiniLM) and 24 (not a multiple of the warp), and a relative
    // position bias.
    let cu = [0usize, 5, 6, 45, 152];
    let tokens = 152;
    for (heads, kv_heads, head_dim) in [(4, 2, 64), (2, 1, 128), (3, 3, 32), (2, 2, 24)] {
        let width = (heads + 2 * kv_heads) * head_dim;
        let qkv = (random((tokens, width), 7 + head_dim as u64)? * 2.0)?;
        let qkv_bias = random((1, width), 8)?.flatten_all()?;
        for mask in [
            AttentionMask::Bidirectional,
            AttentionMask::Causal,
            AttentionMask::Window(3),
            AttentionMask::Window(40),
            AttentionMask::CausalWindow(4),
        ] {
            let att = Attention {
                num_heads: heads,
                num_kv_heads: kv_heads,
                head_dim,
                cu_seqlens: &cu,
                mask,
                position_bias: None,
                disentangled: None,
                softcap: None,
            };
            let reference = att.forward_generic(&qkv.broadcast_add(&qkv_bias)?)?;
            compare(
                &format!("attention {heads}/{kv_heads} heads of {head_dim}, {mask:?}"),
                attention(&att.kernel(), &qkv, Some(&qkv_bias))?,
                reference,
            )?;
        }
    }
    let (heads, kv_heads, head_dim) = (4, 2, 64);
    let max_len = 110;
    let values: Vec<f32> = random((heads, 2 * max_len - 1), 9)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
    let position_bias = PositionBias { values, max_len };
    let qkv = random((tokens, 3 * heads * head_dim), 10)?;
    let att = Attention {
        num_heads: heads,
        num_kv_heads: heads,
        head_dim,
        cu_seqlens: &cu,
        mask: AttentionMask::Bidirectional,
        position_bias: Some(&position_bias),
        disentangled: None,
        softcap: None,
    };
    compare("attention with position bias", attention(&att.kernel(), &qkv, None)?, att.forward_generic(&qkv)?)?;

    // RoPE with and without the per-head norm, against the host implementation.
    let rotary = crate::models::ops::Rotary::new(head_dim, 10_000.0);
    let positions: Vec<u32> = cu.windows(2).flat_map(|w| 0..(w[1] - w[0]) as u32).collect();
    let table = rotary.table(&positions);
    let qkv = random((tokens, (heads + 2 * kv_heads) * head_dim), 11)?;
    let norm_weights = random((2, head_dim), 12)?.to_dtype(DType::F32)?.to_vec2::<f32>()?;
    let qk_norm = crate::models::ops::QkNorm { q: norm_weights[0].clone(), k: norm_weights[1].clone(), eps: 1e-6 };
    for norm in [None, Some(&qk_norm)] {
        let reference = table.apply_on_host(&qkv, heads, kv_heads, norm)?;
        compare(
            if norm.is_some() { "rotary with q/k norm" } else { "rotary" },
            table.apply(&qkv.copy()?, heads, kv_heads, norm)?,
            reference,
        )?;
    }
    Ok(problems.into_iter().next())
}
