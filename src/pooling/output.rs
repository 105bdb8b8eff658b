//! What the model returns for one input, and its typed forms. A task fixes the shape of its
//! output (embed, classify and score: one vector; token_embed and token_classify: a row per
//! token; embed_sparse: `(token id, weight)` pairs; BGE-M3's outputs asked for together: one
//! [`super::m3::MultiVectors`]), so callers that run one task ask for
//! that shape ([`TaskOutput`]) and the engine checks it in one place; only callers that
//! serve any task (`/pooling`, the batch commands) take the enum.

/// The result for one input.
#[derive(Debug, Clone, PartialEq)]
pub enum PoolingOutput {
    /// One vector (embed, classify, score).
    Vector(Vec<f32>),
    /// One vector per token (token_embed, token_classify).
    Tokens(Vec<Vec<f32>>),
    /// Non-zero `(token id, weight)` pairs in id order (embed_sparse).
    Sparse(Vec<(u32, f32)>),
    /// BGE-M3's outputs a request asked for together (dense, lexical weights, ColBERT).
    Multi(super::m3::MultiVectors),
}

impl PoolingOutput {
    /// The shape's name, for messages.
    pub fn shape(&self) -> &'static str {
        match self {
            PoolingOutput::Vector(_) => "one vector",
            PoolingOutput::Tokens(_) => "one vector per token",
            PoolingOutput::Sparse(_) => "sparse weights",
            PoolingOutput::Multi(_) => "BGE-M3 outputs",
        }
    }
}

/// A typed form of [`PoolingOutput`]: `Vec<f32>` (one vector), `Vec<Vec<f32>>` (one row per
/// token), `Vec<(u32, f32)>` (sparse weights), or the enum itself (any shape).
pub trait TaskOutput: Sized {
    /// The output in this form, or the output back when its shape is another.
    fn from_output(output: PoolingOutput) -> Result<Self, PoolingOutput>;
}

impl TaskOutput for PoolingOutput {
    fn from_output(output: PoolingOutput) -> Result<Self, PoolingOutput> {
        Ok(output)
    }
}

impl TaskOutput for Vec<f32> {
    fn from_output(output: PoolingOutput) -> Result<Self, PoolingOutput> {
        match output {
            PoolingOutput::Vector(v) => Ok(v),
            other => Err(other),
        }
    }
}

impl TaskOutput for Vec<Vec<f32>> {
    fn from_output(output: PoolingOutput) -> Result<Self, PoolingOutput> {
        match output {
            PoolingOutput::Tokens(rows) => Ok(rows),
            other => Err(other),
        }
    }
}

impl TaskOutput for Vec<(u32, f32)> {
    fn from_output(output: PoolingOutput) -> Result<Self, PoolingOutput> {
        match output {
            PoolingOutput::Sparse(weights) => Ok(weights),
            other => Err(other),
        }
    }
}

impl TaskOutput for super::m3::MultiVectors {
    fn from_output(output: PoolingOutput) -> Result<Self, PoolingOutput> {
        match output {
            PoolingOutput::Multi(m) => Ok(m),
            other => Err(other),
        }
    }
}
