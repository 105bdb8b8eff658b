//! BGE-M3's two extra heads (BAAI/bge-m3): an XLM-R encoder whose folder carries, beside its
//! weights, `sparse_linear.pt` (`Linear(hidden, 1)`: a lexical weight per token) and
//! `colbert_linear.pt` (`Linear(hidden, colbert_dim)`: a ColBERT vector per token), as
//! FlagEmbedding's `BGEM3` model saves them with `torch.save` of each layer's state dict. One
//! forward pass of the backbone feeds the dense embedding (its sentence-transformers CLS pooling)
//! and both heads; what is computed from them lives in `pooling/m3.rs`.
//!
//! A folder is BGE-M3 when both files are there, whatever its `architectures` says; vLLM's way of
//! asking for it (`--hf-overrides '{"architectures": ["BgeM3EmbeddingModel"]}'`) is accepted too
//! and then requires them.

use super::head_weights::on_host;
use super::ModelError;
use crate::kernels::Linear;
use candle_core::Tensor;
use std::path::Path;

/// The files FlagEmbedding writes beside the encoder.
pub const SPARSE_FILE: &str = "sparse_linear.pt";
pub const COLBERT_FILE: &str = "colbert_linear.pt";
/// vLLM's architecture name for BGE-M3 (set with `--hf-overrides`).
pub const VLLM_ARCHITECTURE: &str = "BgeM3EmbeddingModel";

/// The two heads, on the host in f32.
pub struct M3Weights {
    /// `[1, hidden]`: the lexical weight of a token is `relu(sparse · h + b)`.
    pub sparse: Linear,
    /// `[colbert_dim, hidden]`.
    pub colbert: Linear,
}

/// One `torch.save`d `nn.Linear` state dict (`weight`, `bias`), checked against the hidden size.
fn read_linear(path: &Path, hidden: usize, out: Option<usize>) -> Result<Linear, ModelError> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let problem = |message: String| ModelError::Config(format!("{name}: {message}"));
    let tensors = candle_core::pickle::read_all(path).map_err(|e| problem(super::describe(&e)))?;
    let find = |key: &str| -> Result<Tensor, ModelError> {
        let tensor = tensors.iter().find(|(k, _)| k == key).map(|(_, t)| t.clone()).ok_or_else(|| problem(format!("no `{key}` tensor")))?;
        Ok(on_host(tensor)?)
    };
    let (weight, bias) = (find("weight")?, find("bias")?);
    let (rows, cols) = weight.dims2().map_err(|_| problem(format!("`weight` has shape {:?}, not [out, {hidden}]", weight.dims())))?;
    if cols != hidden || out.is_some_and(|o| o != rows) || bias.dims() != [rows] {
        return Err(problem(format!(
            "`weight` {:?} and `bias` {:?} do not make a layer from the {hidden} hidden features{}",
            weight.dims(),
            bias.dims(),
            out.map(|o| format!(" to {o}")).unwrap_or_default()
        )));
    }
    Ok(Linear::new(weight, Some(bias))?)
}

impl M3Weights {
    /// Reads both heads of a backbone with `hidden` features.
    pub fn read(sparse: &Path, colbert: &Path, hidden: usize) -> Result<Self, ModelError> {
        Ok(M3Weights { sparse: read_linear(sparse, hidden, Some(1))?, colbert: read_linear(colbert, hidden, None)? })
    }

    /// The width of a ColBERT vector.
    pub fn colbert_size(&self) -> usize {
        self.colbert.out_features()
    }
}
