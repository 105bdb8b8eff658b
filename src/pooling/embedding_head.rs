//! The embedding head, built once at load time from the model's files. It follows sentence-transformers' module order: pooling → Dense layers →
//! Matryoshka slice → L2 normalization. The Dense layers run batched over all pooled rows of a
//! batch; slicing and normalizing depend on each request's parameters and run per output.

use crate::kernels::Linear;
use candle_core::{Device, Result, Tensor};

/// The activation of a sentence-transformers `Dense` module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenseActivation {
    Identity,
    Tanh,
    Relu,
    Sigmoid,
}

impl DenseActivation {
    /// Parses the `activation_function` of a Dense module's config.json.
    pub fn from_torch_name(name: &str) -> Option<Self> {
        match name.rsplit('.').next()? {
            "Identity" => Some(Self::Identity),
            "Tanh" => Some(Self::Tanh),
            "ReLU" => Some(Self::Relu),
            "Sigmoid" => Some(Self::Sigmoid),
            _ => None,
        }
    }

    fn apply(self, x: Tensor) -> Result<Tensor> {
        match self {
            Self::Identity => Ok(x),
            Self::Tanh => x.tanh(),
            Self::Relu => x.relu(),
            Self::Sigmoid => candle_nn::ops::sigmoid(&x),
        }
    }
}

/// One sentence-transformers `Dense` module.
#[derive(Debug, Clone)]
pub struct Dense {
    pub linear: Linear,
    pub activation: DenseActivation,
}

/// Pooled vectors → embeddings.
#[derive(Debug, Clone, Default)]
pub struct EmbeddingHead {
    pub dense: Vec<Dense>,
    /// `round(127 · tanh(x))` after the Dense layers: pplx-embed-v1's int8 output, as TEI
    /// computes it ([`crate::models::Architecture::pooled_int8`]). Normalization, when asked
    /// for, comes after and keeps the direction.
    pub int8: bool,
}

impl EmbeddingHead {
    /// Output size given the backbone's hidden size.
    pub fn output_size(&self, hidden_size: usize) -> usize {
        self.dense.last().map(|d| d.linear.out_features()).unwrap_or(hidden_size)
    }

    /// Applies the Dense layers to `rows` (row-major, `width` columns); returns the new
    /// rows and their width.
    pub fn project(&self, rows: Vec<f32>, width: usize) -> Result<(Vec<f32>, usize)> {
        if self.dense.is_empty() || rows.is_empty() {
            return Ok((self.to_int8(rows), self.output_size(width)));
        }
        let n = rows.len() / width;
        let mut x = Tensor::from_vec(rows, (n, width), &Device::Cpu)?;
        for layer in &self.dense {
            x = layer.activation.apply(layer.linear.forward(&x)?)?;
        }
        let out_width = x.dims()[1];
        Ok((self.to_int8(x.flatten_all()?.to_vec1()?), out_width))
    }

    fn to_int8(&self, mut rows: Vec<f32>) -> Vec<f32> {
        if self.int8 {
            rows.iter_mut().for_each(|x| *x = (127.0 * x.tanh()).round());
        }
        rows
    }
}

/// The per-request end of the embedding head: Matryoshka slice, then L2 normalization.
pub fn finish_embedding(mut v: Vec<f32>, dimensions: Option<usize>, normalize: bool) -> Vec<f32> {
    if let Some(k) = dimensions {
        v.truncate(k);
    }
    if normalize {
        l2_normalize(&mut v);
    }
    v
}

/// Scales `v` to unit length, as `torch.nn.functional.normalize` does (zero vectors stay zero).
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| (*x as f64) * (*x as f64)).sum::<f64>().sqrt();
    let scale = 1.0 / norm.max(1e-12);
    v.iter_mut().for_each(|x| *x = (*x as f64 * scale) as f32);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_then_normalizes() {
        let v = finish_embedding(vec![3.0, 4.0, 12.0], Some(2), true);
        assert!((v[0] - 0.6).abs() < 1e-6 && (v[1] - 0.8).abs() < 1e-6);
        assert_eq!(finish_embedding(vec![3.0, 4.0], None, false), vec![3.0, 4.0]);
        assert_eq!(finish_embedding(vec![0.0, 0.0], None, true), vec![0.0, 0.0]);
    }

    #[test]
    fn dense_activation_names() {
        assert_eq!(DenseActivation::from_torch_name("torch.nn.modules.activation.Tanh"), Some(DenseActivation::Tanh));
        assert_eq!(DenseActivation::from_torch_name("torch.nn.modules.linear.Identity"), Some(DenseActivation::Identity));
        assert_eq!(DenseActivation::from_torch_name("torch.nn.modules.activation.GELU"), None);
    }
}
