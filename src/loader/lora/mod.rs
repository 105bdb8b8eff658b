//! LoRA adapters as PEFT publishes them: a folder with `adapter_config.json` and
//! `adapter_model.safetensors`, read onto the sites of a loaded backbone
//! ([`crate::models::enable_lora`]). What vLLM's flags say about them (`--lora-modules`,
//! `--max-loras`, `--max-lora-rank`) is [`LoraOptions`].
//!
//! An adapter's modules are matched to the backbone's layers by name: PEFT saves
//! `base_model.model.<module>.lora_A.weight`, and `<module>` depends on the class it was
//! trained on (`encoder.layer.0.attention.self.query` on `BertModel`, `bert.encoder…` on
//! `BertForSequenceClassification`, `model.layers.0.self_attn.q_proj` on a causal LM); a module
//! matches the one layer whose name ends with it, or that it ends with, at a `.`. Every
//! module must match exactly one layer, or the adapter is refused with the module's name.
//!
//! The math is PEFT's `Linear.forward`: `y += (x·Aᵀ)·Bᵀ · lora_alpha / r` (`/ √r` with
//! `use_rslora`), `lora_alpha` per module from `alpha_pattern`. `fan_in_fan_out` changes how
//! PEFT merges into a transposed base weight, not this product, so it is accepted as is.
//!
//! `modules_to_save` (PEFT's default for `SEQ_CLS` / `TOKEN_CLS` adapters: the classifier
//! head, trained whole) are full weights saved beside the factors, `base_model.model.
//! classifier.weight`: the adapter gets its own classifier head, built as the base's over the
//! base weights with the saved ones in their place ([`ClassifierSource`]). Saved weights the
//! head does not read (an embedding table, a layer norm of the backbone) are refused: the
//! backbone is shared by every adapter of a batch.
//!
//! Here: the flags' types ([`LoraModule`], [`LoraOptions`]), a loaded [`Adapter`] and each
//! model's [`LoraRegistry`]; `peft` reads an adapter folder, `saved_head` builds an adapter's
//! own classifier head.

pub mod merged;
mod peft;
mod saved_head;

pub use peft::load_adapter;
pub use saved_head::ClassifierSource;

use super::LoadError;
use crate::kernels::lora::{LoraSite, LoraWeights, TaskAdapter};
use crate::pooling::classifier::ClassifierHead;
use serde::Deserialize;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;

/// One `--lora-modules` entry: `NAME=PATH`, or vLLM's JSON form
/// `{"name": …, "path": …, "base_model_name": …}` (the served model it adapts; the first
/// one when unset).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraModule {
    pub name: String,
    pub path: String,
    #[serde(default)]
    pub base_model_name: Option<String>,
}

impl std::str::FromStr for LoraModule {
    type Err = LoadError;

    /// vLLM's `LoRAParserAction`: `name=path` when the item has an `=` and no `,`, else JSON.
    fn from_str(item: &str) -> Result<Self, LoadError> {
        let item = item.trim();
        if item.contains('=') && !item.contains(',') && !item.starts_with('{') {
            return match item.split_once('=') {
                Some((name, path)) if !name.is_empty() && !path.is_empty() && !path.contains('=') => {
                    Ok(LoraModule { name: name.to_string(), path: path.to_string(), base_model_name: None })
                }
                _ => Err(LoadError::Options(format!("Invalid format for --lora-modules: {item} (expected NAME=PATH or a JSON object)"))),
            };
        }
        let value: Value =
            serde_json::from_str(item).map_err(|_| LoadError::Options(format!("Invalid JSON format for --lora-modules: {item}")))?;
        serde_json::from_value(value).map_err(|e| LoadError::Options(format!("Invalid fields for --lora-modules: {item} - {e}")))
    }
}

/// How one model serves adapters (`--enable-lora` and its flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraOptions {
    /// Adapters loaded at start.
    pub modules: Vec<LoraModule>,
    /// Most distinct adapters in one forward pass (vLLM's "Max number of LoRAs in a single
    /// batch"); requests for more wait for the next batch.
    pub max_loras: usize,
    /// Largest rank accepted.
    pub max_lora_rank: usize,
}

impl Default for LoraOptions {
    /// vLLM's defaults.
    fn default() -> Self {
        LoraOptions { modules: Vec::new(), max_loras: 1, max_lora_rank: 16 }
    }
}

/// A loaded adapter: its name, where it came from, its products on the backbone's sites, and
/// its own classifier head when it saves one.
pub struct Adapter {
    pub name: String,
    /// The folder, as given (`/v1/models` reports it as `root`).
    pub path: String,
    pub weights: std::sync::Arc<LoraWeights>,
    /// Its classifier head (`modules_to_save`); `None`: the base model's.
    pub classifier: Option<Arc<ClassifierHead>>,
    /// Text prepended to its inputs when a request names no prompt (a built-in task's
    /// instruction: jina-embeddings-v3's `task_instructions`).
    pub prompt: Option<Arc<str>>,
    /// Largest rank among its modules.
    pub rank: usize,
    /// Floats held for it.
    pub floats: usize,
    /// Which load of an adapter this is (unique in the process): the output cache keys its
    /// outputs by it, so an adapter replaced in place never answers from its predecessor.
    pub serial: u64,
}

/// A new [`Adapter::serial`].
pub fn next_serial() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl std::fmt::Debug for Adapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Adapter")
            .field("name", &self.name)
            .field("path", &self.path)
            .field("rank", &self.rank)
            .field("floats", &self.floats)
            .field("own_classifier", &self.classifier.is_some())
            .finish()
    }
}

/// The `path` of a built-in task adapter (`/v1/models` shows it as the card's `root`).
pub const BUILT_IN: &str = "(built into the model)";

/// vLLM's message for a name already loaded.
fn already_loaded(name: &str) -> LoadError {
    LoadError::Adapter(format!(
        "The lora adapter '{name}' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True."
    ))
}

/// The adapters a model serves: its sites, its classifier's recipe, its limits, and the
/// adapters loaded so far.
#[derive(Debug)]
pub struct LoraRegistry {
    pub sites: Vec<LoraSite>,
    classifier: Option<ClassifierSource>,
    /// The built-in task adapters' names ([`Self::add_task`]), in the model's order.
    tasks: Vec<String>,
    pub max_loras: usize,
    pub max_lora_rank: usize,
    adapters: std::sync::RwLock<HashMap<String, std::sync::Arc<Adapter>>>,
}

impl LoraRegistry {
    pub fn new(sites: Vec<LoraSite>, classifier: Option<ClassifierSource>, options: &LoraOptions) -> Self {
        LoraRegistry {
            sites,
            classifier,
            tasks: Vec::new(),
            max_loras: options.max_loras,
            max_lora_rank: options.max_lora_rank,
            adapters: Default::default(),
        }
    }

    /// Reads and registers the adapter `name`; vLLM's message when the name is taken.
    pub fn load(&self, name: &str, path: &str) -> Result<std::sync::Arc<Adapter>, LoadError> {
        // Refused before reading the files when the name is already taken.
        if self.get(name).is_some() {
            return Err(already_loaded(name));
        }
        self.register(name, path, false)
    }

    /// Reads the adapter `name` and registers it, replacing one of that name (vLLM's
    /// `load_inplace`).
    pub fn replace(&self, name: &str, path: &str) -> Result<std::sync::Arc<Adapter>, LoadError> {
        self.register(name, path, true)
    }

    /// Reads the adapter, then registers it under the lock: of two loads of one new name at
    /// once, the second is refused rather than replacing the first.
    fn register(&self, name: &str, path: &str, replace: bool) -> Result<std::sync::Arc<Adapter>, LoadError> {
        let adapter = std::sync::Arc::new(load_adapter(name, path, &self.sites, self.classifier.as_ref(), self.max_lora_rank)?);
        let mut adapters = self.adapters.write().unwrap_or_else(|e| e.into_inner());
        if !replace && adapters.contains_key(name) {
            return Err(already_loaded(name));
        }
        adapters.insert(name.to_string(), adapter.clone());
        Ok(adapter)
    }

    /// Registers one of the model's built-in task adapters (its rank is the checkpoint's, not
    /// bound by `--max-lora-rank`); each may share a batch with every other.
    pub fn add_task(&mut self, task: TaskAdapter) -> Result<std::sync::Arc<Adapter>, LoadError> {
        let adapter = Arc::new(Adapter {
            name: task.name,
            path: BUILT_IN.to_string(),
            weights: Arc::new(task.weights),
            classifier: None,
            prompt: task.prompt.map(Into::into),
            rank: task.rank,
            floats: task.floats,
            serial: next_serial(),
        });
        let mut adapters = self.adapters.write().unwrap_or_else(|e| e.into_inner());
        if adapters.contains_key(&adapter.name) {
            return Err(already_loaded(&adapter.name));
        }
        adapters.insert(adapter.name.clone(), adapter.clone());
        self.max_loras = self.max_loras.max(adapters.len());
        drop(adapters);
        self.tasks.push(adapter.name.clone());
        Ok(adapter)
    }

    /// The built-in task adapters' names, in the model's order.
    pub fn tasks(&self) -> &[String] {
        &self.tasks
    }

    /// Forgets the adapter `name`; whether it was there. Batches already holding it finish
    /// with it (they keep their own reference).
    pub fn unload(&self, name: &str) -> bool {
        self.adapters.write().unwrap_or_else(|e| e.into_inner()).remove(name).is_some()
    }

    pub fn get(&self, name: &str) -> Option<std::sync::Arc<Adapter>> {
        self.adapters.read().unwrap_or_else(|e| e.into_inner()).get(name).cloned()
    }

    /// Every adapter, by name.
    pub fn list(&self) -> Vec<std::sync::Arc<Adapter>> {
        let mut all: Vec<_> = self.adapters.read().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lora_modules_parse_as_vllm_parses_them() {
        let m: LoraModule = "sql=/adapters/sql".parse().unwrap();
        assert_eq!(m, LoraModule { name: "sql".into(), path: "/adapters/sql".into(), base_model_name: None });
        let m: LoraModule = r#"{"name": "sql", "path": "/a", "base_model_name": "base"}"#.parse().unwrap();
        assert_eq!(m.base_model_name.as_deref(), Some("base"));
        assert!("{not json".parse::<LoraModule>().unwrap_err().to_string().starts_with("Invalid JSON format for --lora-modules"));
        assert!(r#"{"name": "x"}"#.parse::<LoraModule>().unwrap_err().to_string().starts_with("Invalid fields for --lora-modules"));
        assert!("a=b=c".parse::<LoraModule>().is_err());
    }
}
