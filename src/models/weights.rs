//! Reading layers out of a checkpoint: dense layers (with or without a bias), LayerNorms under
//! either of their names, and Q/K/V projections fused into one layer. Every architecture file
//! builds its layers with these, under its own checkpoint's names.

use crate::kernels::{LayerNorm, Linear};
use candle_core::{Result, Tensor};
use candle_nn::VarBuilder;

/// A `[out, inp]` dense layer and its bias, named after its checkpoint module (LoRA adapters
/// find it by that name).
pub(super) fn linear(vb: &VarBuilder, out: usize, inp: usize) -> Result<Linear> {
    linear_with_bias(vb, out, inp, true)
}

/// A `[out, inp]` dense layer, with its bias where `bias` says the checkpoint has one
/// (NomicBERT's and ModernBERT's configs switch them off).
pub(super) fn linear_with_bias(vb: &VarBuilder, out: usize, inp: usize, bias: bool) -> Result<Linear> {
    let weight = vb.get((out, inp), "weight")?;
    let bias = if bias { Some(vb.get(out, "bias")?) } else { None };
    Ok(Linear::new(weight, bias)?.named(&vb.prefix()))
}

/// A LayerNorm's (weight, bias), also under the `gamma` / `beta` names of older checkpoints
/// (transformers renames them on load).
pub(super) fn norm_params(vb: &VarBuilder, size: usize) -> Result<(Tensor, Tensor)> {
    if !vb.contains_tensor("weight") && vb.contains_tensor("gamma") {
        return Ok((vb.get(size, "gamma")?, vb.get(size, "beta")?));
    }
    Ok((vb.get(size, "weight")?, vb.get(size, "bias")?))
}

pub(super) fn layer_norm(vb: &VarBuilder, size: usize, eps: f64) -> Result<LayerNorm> {
    let (weight, bias) = norm_params(vb, size)?;
    LayerNorm::new(weight, bias, eps)
}

/// Dense layers that take the same input, stacked into one `[Σ out, inp]` layer so that one
/// product computes them all (with their biases where `bias` says they have them); each part
/// keeps its module name for LoRA.
pub(super) fn stacked_linear(parts: &[(VarBuilder, usize)], inp: usize, bias: bool) -> Result<Linear> {
    let weights = parts.iter().map(|(vb, out)| vb.get((*out, inp), "weight")).collect::<Result<Vec<_>>>()?;
    let bias = match bias {
        true => Some(Tensor::cat(&parts.iter().map(|(vb, out)| vb.get(*out, "bias")).collect::<Result<Vec<_>>>()?, 0)?),
        false => None,
    };
    let names: Vec<(String, usize)> = parts.iter().map(|(vb, out)| (vb.prefix(), *out)).collect();
    Ok(Linear::new(Tensor::cat(&weights, 0)?, bias)?.named_parts(&names))
}

/// Q, K and V projections fused into one `[3h, h]` layer, so that attention reads them from
/// one matrix.
pub(super) fn fused_qkv(q: VarBuilder, k: VarBuilder, v: VarBuilder, h: usize) -> Result<Linear> {
    stacked_linear(&[(q, h), (k, h), (v, h)], h, true)
}
