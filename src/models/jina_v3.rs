//! jina-embeddings-v3 (`XLMRobertaModel` with `position_embedding_type: "rotary"` and
//! `lora_adaptations`), as jinaai's published `xlm-roberta-flash-implementation` runs it
//! (`modeling_lora.py`, `modeling_xlm_roberta.py`, `block.py`, `mha.py`, `mlp.py`,
//! `embedding.py`): an XLM-RoBERTa encoder without a position table, with rotary positions
//! (GPT-NeoX half rotation over the whole head, `rotary_emb_base`, positions from 0), a fused
//! `Wqkv`, post-LayerNorm blocks `norm1(x + attn(x))`, `norm2(h + fc2(gelu(fc1(h))))`, and
//! embeddings `emb_ln(word + token_type)`.
//!
//! Every linear layer and both embedding tables carry one LoRA per task, stacked in the
//! checkpoint (torch parametrizations): `<layer>.parametrizations.weight.original` is the base
//! weight, `<layer>.parametrizations.weight.0.lora_A` `[tasks, r, in]` and `lora_B`
//! `[tasks, out, r]` (tables: `[tasks, rows, r]` and `[tasks, r, width]`), scaled by
//! `lora_alpha / lora_rank`; task `t` is `lora_adaptations[t]`. They become the model's
//! built-in adapters ([`task_adapters`]), one per task, so that one batch mixes tasks as it
//! mixes any LoRA adapters; without a task the base weights run, as the published `encode`
//! does when no `task` is given.
//!
//! jina-colbert-v2 is the same encoder without adapters (plain `weight`s under `roberta.`,
//! `architectures: ["HF_ColBERT"]`, or vLLM's `ColBERTJinaRobertaModel` override): a
//! multi-vector model whose root `linear.weight` projects every token (`loader::colbert_projection`).

use super::batch::Batch;
use super::encoder::{Embed, Embeddings, Encoder, EncoderLayer, EncoderModel, FeedForward, Ffn, Norms, RotaryPositions};
use super::weights::layer_norm;
use super::{parse_config, Architecture, Backbone, BackboneSizes, ModelError, SequencePooling};
use crate::kernels::lora::{LoraFactors, LoraSite, LoraWeights, SiteProduct, TableLora, TaskAdapter};
use crate::kernels::{Activation, Linear, Rotary};
use candle_core::{DType, Device, Result, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;

pub struct JinaV3;
pub static JINA_V3: JinaV3 = JinaV3;

/// The fields of the published `XLMRobertaFlashConfig`, with its defaults.
#[derive(Debug, Clone, Deserialize)]
struct JinaV3Config {
    vocab_size: usize,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    intermediate_size: usize,
    #[serde(default = "default_act")]
    hidden_act: String,
    #[serde(default = "default_eps")]
    layer_norm_eps: f64,
    #[serde(default = "one")]
    type_vocab_size: usize,
    #[serde(default = "default_positions")]
    max_position_embeddings: usize,
    #[serde(default = "default_base")]
    rotary_emb_base: f64,
    #[serde(default)]
    rotary_emb_interleaved: bool,
    #[serde(default)]
    rotary_emb_dim: Option<f64>,
    #[serde(default)]
    lora_adaptations: Vec<String>,
    #[serde(default)]
    task_instructions: BTreeMap<String, String>,
    #[serde(default = "default_rank")]
    lora_rank: usize,
    #[serde(default = "default_alpha")]
    lora_alpha: f64,
}

fn default_act() -> String {
    "gelu".into()
}
fn default_eps() -> f64 {
    1e-5
}
fn one() -> usize {
    1
}
fn default_positions() -> usize {
    8194
}
fn default_base() -> f64 {
    10_000.0
}
fn default_rank() -> usize {
    4
}
fn default_alpha() -> f64 {
    1.0
}

impl JinaV3Config {
    fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// `gelu` is erf's; the published code maps the tanh names to the approximation.
    fn activation(&self) -> std::result::Result<Activation, ModelError> {
        match self.hidden_act.as_str() {
            "gelu" => Ok(Activation::Gelu),
            "gelu_new" | "gelu_fast" | "gelu_pytorch_tanh" => Ok(Activation::GeluTanh),
            other => Err(ModelError::Config(format!("jina-embeddings-v3 with hidden_act `{other}` is not supported"))),
        }
    }

    fn refuse_unsupported(&self) -> std::result::Result<(), ModelError> {
        if self.rotary_emb_interleaved {
            return Err(ModelError::Config("jina-embeddings-v3 with rotary_emb_interleaved: true is not supported".into()));
        }
        if self.rotary_emb_dim.is_some_and(|d| d as usize != self.head_dim()) {
            return Err(ModelError::Config("jina-embeddings-v3 with a partial rotary_emb_dim is not supported".into()));
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) || !self.head_dim().is_multiple_of(2) {
            return Err(ModelError::Config("hidden_size does not split into even-sized heads".into()));
        }
        if self.lora_rank == 0 {
            return Err(ModelError::Config("lora_rank must be positive".into()));
        }
        Ok(())
    }
}

/// Whether `config` is the published XLM-RoBERTa flash implementation's: rotary positions on
/// an XLM-RoBERTa config, with task adapters (jina-embeddings-v3: `architectures` says
/// `XLMRobertaModel`, `model_type` is unset) or without (jina-colbert-v2, `HF_ColBERT`, which
/// vLLM serves as `ColBERTJinaRobertaModel`). No other family names its positions `rotary`
/// with an XLM-R `model_type`.
fn is_jina_v3(config: &Value) -> bool {
    let model_type = config.get("model_type").and_then(Value::as_str);
    config.get("position_embedding_type").and_then(Value::as_str) == Some("rotary")
        && (config.get("lora_adaptations").is_some_and(Value::is_array) || matches!(model_type, None | Some("xlm-roberta")))
}

/// Whether the config lists task adapters (jina-embeddings-v3; jina-colbert-v2 has none).
fn has_tasks(config: &Value) -> bool {
    config.get("lora_adaptations").and_then(Value::as_array).is_some_and(|tasks| !tasks.is_empty())
}

impl Architecture for JinaV3 {
    fn name(&self) -> &'static str {
        "jina-embeddings-v3"
    }

    /// Claimed by its config ([`Architecture::claims`]), never by name: the name is XLM-R's.
    fn architecture_stems(&self) -> &'static [&'static str] {
        &[]
    }

    fn model_types(&self) -> &'static [&'static str] {
        &[]
    }

    fn claims(&self, config: &Value) -> bool {
        is_jina_v3(config)
    }

    fn default_pooling(&self, _config: &Value) -> SequencePooling {
        SequencePooling::Mean
    }

    fn backbone(&self, config: &Value, vb: VarBuilder) -> std::result::Result<Box<dyn Backbone>, ModelError> {
        Ok(Box::new(load(config, vb)?))
    }

    fn has_task_adapters(&self, config: &Value) -> bool {
        has_tasks(config)
    }

    fn task_adapters(&self, config: &Value, vb: VarBuilder, sites: &[LoraSite]) -> std::result::Result<Vec<TaskAdapter>, ModelError> {
        task_adapters(config, vb, sites)
    }
}

/// Where a parametrized layer keeps its base weight: under `parametrizations.weight.original`
/// in the published checkpoint, as `weight` in one saved without its adapters.
fn base_weight(vb: &VarBuilder, shape: (usize, usize)) -> Result<Tensor> {
    if vb.contains_tensor("parametrizations.weight.original") {
        vb.get(shape, "parametrizations.weight.original")
    } else {
        vb.get(shape, "weight")
    }
}

fn linear(vb: &VarBuilder, out: usize, inp: usize) -> Result<Linear> {
    Ok(Linear::new(base_weight(vb, (out, inp))?, Some(vb.get(out, "bias")?))?.named(&vb.prefix()))
}

/// jina-embeddings-v3's embeddings: the shared sum, then each sequence's task deltas on its
/// rows of the word and token-type tables, then `emb_ln`.
struct TaskEmbeddings {
    tables: Embeddings,
    /// The tables' names, as task adapters name their deltas on them.
    word_name: String,
    token_type_name: Option<String>,
    hidden_size: usize,
}

impl Embed for TaskEmbeddings {
    fn embed(&self, batch: &Batch) -> Result<Tensor> {
        let summed = self.tables.sum(batch)?;
        if batch.adapters.iter().all(Option::is_none) {
            return self.tables.finish(summed);
        }
        let (n, h) = (batch.num_tokens(), self.hidden_size);
        let mut rows = summed.to_dtype(DType::F32)?.to_device(&Device::Cpu)?.flatten_all()?.to_vec1::<f32>()?;
        for ((start, len), adapter) in batch.spans().zip(&batch.adapters) {
            let Some(adapter) = adapter else { continue };
            let word = adapter.table(&self.word_name);
            let token_type = self.token_type_name.as_ref().and_then(|name| adapter.table(name));
            for token in start..start + len {
                let out = &mut rows[token * h..(token + 1) * h];
                if let Some(delta) = word {
                    delta.add_row(batch.input_ids[token] as usize, out);
                }
                if let Some(delta) = token_type {
                    delta.add_row(batch.token_type_ids.get(token).copied().unwrap_or(0) as usize, out);
                }
            }
        }
        let with_deltas = Tensor::from_vec(rows, (n, h), &Device::Cpu)?.to_device(summed.device())?.to_dtype(summed.dtype())?;
        self.tables.finish(with_deltas)
    }
}

/// jina-embeddings-v3's backbone: [`TaskEmbeddings`], then the shared post-norm encoder with
/// rotary positions and a plain GELU feed-forward.
fn load(raw: &Value, vb: VarBuilder) -> std::result::Result<EncoderModel<TaskEmbeddings>, ModelError> {
    let config: JinaV3Config = parse_config(raw)?;
    config.refuse_unsupported()?;
    let activation = config.activation()?;
    // The published checkpoint keeps the encoder under `roberta.` (XLMRobertaLoRA).
    let vb = if vb.contains_tensor("roberta.emb_ln.weight") { vb.pp("roberta") } else { vb };
    let (h, inner, eps) = (config.hidden_size, config.intermediate_size, config.layer_norm_eps);
    let mut layers = Vec::with_capacity(config.num_hidden_layers);
    for i in 0..config.num_hidden_layers {
        let lv = vb.pp(format!("encoder.layers.{i}"));
        layers.push(EncoderLayer {
            qkv: linear(&lv.pp("mixer.Wqkv"), 3 * h, h)?,
            attention_out: linear(&lv.pp("mixer.out_proj"), h, h)?,
            ffn: Ffn::Dense {
                up: linear(&lv.pp("mlp.fc1"), inner, h)?,
                feed_forward: FeedForward::Plain(activation),
                down: linear(&lv.pp("mlp.fc2"), h, inner)?,
            },
            norms: Norms::Post {
                attention_norm: layer_norm(&lv.pp("norm1"), h, eps)?,
                feed_forward_norm: layer_norm(&lv.pp("norm2"), h, eps)?,
            },
            local: false,
        });
    }
    let emb = vb.pp("embeddings");
    let word_vb = emb.pp("word_embeddings");
    let (token_type, token_type_name) = match config.type_vocab_size {
        0 => (None, None),
        types => {
            let tv = emb.pp("token_type_embeddings");
            (Some(base_weight(&tv, (types, h))?), Some(tv.prefix()))
        }
    };
    let tables = Embeddings {
        word: base_weight(&word_vb, (config.vocab_size, h))?,
        position: None,
        position_offset: 0,
        token_type,
        norm: layer_norm(&vb.pp("emb_ln"), h, eps)?,
        projection: None,
    };
    let embeddings = TaskEmbeddings { tables, word_name: word_vb.prefix(), token_type_name, hidden_size: h };
    let heads = config.num_attention_heads;
    let rotary = RotaryPositions { global: Rotary::new(config.head_dim(), config.rotary_emb_base), local: None };
    Ok(EncoderModel {
        embeddings,
        encoder: Encoder { layers, num_heads: heads, head_dim: config.head_dim(), rotary: Some(rotary), relative: None },
        final_norm: None,
        // Rotary positions need no table: the length the checkpoint declares (8194).
        sizes: BackboneSizes { hidden: h, vocab: config.vocab_size, max_positions: config.max_position_embeddings },
    })
}

/// The checkpoint's stacked task LoRAs as one adapter per task, on the backbone's `sites`
/// ([`super::enable_lora`]) and its embedding tables. A checkpoint saved without them (no
/// `lora_A` beside a layer) has none.
pub fn task_adapters(raw: &Value, vb: VarBuilder, sites: &[LoraSite]) -> std::result::Result<Vec<TaskAdapter>, ModelError> {
    let config: JinaV3Config = parse_config(raw)?;
    let rank = config.lora_rank;
    let scale = (config.lora_alpha / rank as f64) as f32;
    let tasks = config.lora_adaptations.len();
    let factors = |module: &str| -> Result<Option<(Tensor, Tensor)>> {
        let prefix = format!("{module}.parametrizations.weight.0");
        let (a, b) = (format!("{prefix}.lora_A"), format!("{prefix}.lora_B"));
        if !vb.contains_tensor(&a) {
            return Ok(None);
        }
        let load = |name: &str| vb.get_unchecked_dtype(name, DType::F32).and_then(|t| t.to_device(&Device::Cpu));
        Ok(Some((load(&a)?, load(&b)?)))
    };
    let task_slice = |t: &Tensor, task: usize| -> Result<Vec<f32>> { t.get(task)?.flatten_all()?.to_vec1::<f32>() };

    // Per site: its stacked factors (each site is one module here).
    let mut stacked = Vec::with_capacity(sites.len());
    for site in sites {
        let [part] = site.parts.as_slice() else {
            return Err(ModelError::Config(format!("a jina-embeddings-v3 layer with {} modules", site.parts.len())));
        };
        stacked.push(factors(&part.name)?);
    }
    // The tables are named as the backbone names them ([`load`]).
    let root = if vb.contains_tensor("roberta.emb_ln.weight") { "roberta." } else { "" };
    let mut tables = Vec::new();
    for (table, present) in [("word_embeddings", true), ("token_type_embeddings", config.type_vocab_size > 0)] {
        let name = format!("{root}embeddings.{table}");
        if let Some(pair) = factors(&name)?.filter(|_| present) {
            tables.push((name, pair));
        }
    }
    if stacked.iter().all(Option::is_none) && tables.is_empty() {
        return Ok(Vec::new());
    }

    let mut adapters = Vec::with_capacity(tasks);
    for (task, name) in config.lora_adaptations.iter().enumerate() {
        let mut floats = 0;
        let mut products = Vec::with_capacity(sites.len());
        for (site, pair) in sites.iter().zip(&stacked) {
            let Some((a, b)) = pair else {
                products.push(None);
                continue;
            };
            if a.dims3()?.0 != tasks || b.dims3()?.0 != tasks || a.dims3()?.1 != rank {
                return Err(ModelError::Config(format!(
                    "`{}`: LoRA factors {:?} and {:?} for {tasks} tasks of rank {rank}",
                    site.parts[0].name,
                    a.shape(),
                    b.shape()
                )));
            }
            let (a, b) = (task_slice(a, task)?, task_slice(b, task)?);
            floats += a.len() + b.len();
            products.push(Some(SiteProduct::new(site, vec![(0, LoraFactors { a, b, rank, scale })])?));
        }
        let mut deltas = Vec::with_capacity(tables.len());
        for (table, (a, b)) in &tables {
            let (a, b) = (task_slice(a, task)?, task_slice(b, task)?);
            floats += a.len() + b.len();
            deltas.push(TableLora::new(table.clone(), a, b, rank, scale)?);
        }
        adapters.push(TaskAdapter {
            name: name.clone(),
            prompt: config.task_instructions.get(name).filter(|p| !p.is_empty()).cloned(),
            weights: LoraWeights::new(products).with_tables(deltas),
            rank,
            floats,
        });
    }
    Ok(adapters)
}
