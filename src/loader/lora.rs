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

use super::LoadError;
use crate::models::ops::lora::{LoraFactors, LoraSite, LoraWeights, SiteProduct, TaskAdapter};
use crate::models::ModelError;
use crate::pooling::classifier::ClassifierHead;
use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::VarBuilder;
use serde::Deserialize;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};

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
    type Err = String;

    /// vLLM's `LoRAParserAction`: `name=path` when the item has an `=` and no `,`, else JSON.
    fn from_str(item: &str) -> Result<Self, String> {
        let item = item.trim();
        if item.contains('=') && !item.contains(',') && !item.starts_with('{') {
            return match item.split_once('=') {
                Some((name, path)) if !name.is_empty() && !path.is_empty() && !path.contains('=') => {
                    Ok(LoraModule { name: name.to_string(), path: path.to_string(), base_model_name: None })
                }
                _ => Err(format!("Invalid format for --lora-modules: {item} (expected NAME=PATH or a JSON object)")),
            };
        }
        let value: Value = serde_json::from_str(item).map_err(|_| format!("Invalid JSON format for --lora-modules: {item}"))?;
        serde_json::from_value(value).map_err(|e| format!("Invalid fields for --lora-modules: {item} - {e}"))
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

/// How a model's classifier head is built, over any weights: the loader's recipe for the
/// base head, kept so that an adapter's `modules_to_save` build theirs the same way.
pub struct ClassifierSource {
    pub build: Box<dyn Fn(VarBuilder<'static>) -> Result<ClassifierHead, ModelError> + Send + Sync>,
    /// The model's own weights.
    pub base: VarBuilder<'static>,
}

impl std::fmt::Debug for ClassifierSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClassifierSource")
    }
}

impl ClassifierSource {
    /// The head over the model's own weights.
    pub fn base_head(&self) -> Result<ClassifierHead, ModelError> {
        (self.build)(self.base.clone())
    }

    /// The head over the base weights with `saved` (full names) in their place; an error
    /// naming any saved weight the head does not read.
    fn with_saved(&self, saved: HashMap<String, Tensor>) -> Result<ClassifierHead, String> {
        let names: BTreeSet<String> = saved.keys().cloned().collect();
        let overlay = Arc::new(SavedWeights { saved, base: self.base.clone(), read: Mutex::default() });
        let vb = VarBuilder::from_backend(Box::new(SharedSaved(Arc::clone(&overlay))), self.base.dtype(), self.base.device().clone());
        let head = (self.build)(vb).map_err(|e| format!("its modules_to_save do not fit this model's classifier head: {e}"))?;
        let read = overlay.read.lock().unwrap_or_else(|e| e.into_inner());
        let unread: Vec<&String> = names.difference(&read).collect();
        if !unread.is_empty() {
            return Err(format!(
                "modules_to_save replaces {unread:?}, outside the classifier head: not supported (the backbone is shared by every adapter of a batch)"
            ));
        }
        Ok(head)
    }
}

/// The base weights with an adapter's saved modules in their place, noting which saved ones
/// were read.
struct SavedWeights {
    saved: HashMap<String, Tensor>,
    base: VarBuilder<'static>,
    read: Mutex<BTreeSet<String>>,
}

impl SavedWeights {
    fn saved(&self, name: &str, dtype: DType, device: &Device) -> Option<candle_core::Result<Tensor>> {
        let tensor = self.saved.get(name)?;
        self.read.lock().unwrap_or_else(|e| e.into_inner()).insert(name.to_string());
        Some(tensor.to_dtype(dtype).and_then(|t| t.to_device(device)))
    }
}

/// [`SavedWeights`] as a VarBuilder backend, shared with the caller that checks what was read.
struct SharedSaved(Arc<SavedWeights>);

impl SimpleBackend for SharedSaved {
    fn get(&self, shape: Shape, name: &str, hints: candle_nn::Init, dtype: DType, device: &Device) -> candle_core::Result<Tensor> {
        match self.0.saved(name, dtype, device) {
            Some(tensor) => super::mapped::with_shape(tensor?, shape, name),
            None => self.0.base.get_with_hints_dtype(shape, name, hints, dtype),
        }
    }

    fn get_unchecked(&self, name: &str, dtype: DType, device: &Device) -> candle_core::Result<Tensor> {
        match self.0.saved(name, dtype, device) {
            Some(tensor) => tensor,
            None => self.0.base.get_unchecked_dtype(name, dtype),
        }
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.0.saved.contains_key(name) || self.0.base.contains_tensor(name)
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

/// `adapter_config.json`: the fields that change the math, and those that are refused.
#[derive(Debug, Deserialize)]
struct AdapterConfig {
    #[serde(default)]
    peft_type: Option<String>,
    r: Option<usize>,
    lora_alpha: Option<f64>,
    target_modules: Option<Value>,
    #[serde(default)]
    use_rslora: bool,
    #[serde(default)]
    use_dora: bool,
    #[serde(default)]
    bias: Option<String>,
    #[serde(default)]
    alpha_pattern: BTreeMap<String, f64>,
    #[serde(default)]
    modules_to_save: Option<Vec<String>>,
    #[serde(default)]
    lora_bias: bool,
    #[serde(default)]
    layer_replication: Option<Value>,
    #[serde(default)]
    target_parameters: Option<Vec<String>>,
    #[serde(default)]
    alora_invocation_tokens: Option<Value>,
    #[serde(default)]
    use_qalora: bool,
    /// PEFT's LoRA variants whose product is not `x·Aᵀ·Bᵀ`: refused when set.
    #[serde(default)]
    use_bdlora: Option<Value>,
    #[serde(default)]
    arrow_config: Option<Value>,
    #[serde(default)]
    kasa_config: Option<Value>,
    #[serde(default)]
    monteclora_config: Option<Value>,
}

impl AdapterConfig {
    /// Everything this server cannot apply, in one message (as vLLM's `validate_legal`).
    fn refusals(&self, max_rank: usize) -> Vec<String> {
        let mut problems = Vec::new();
        let missing: Vec<&str> =
            [("r", self.r.is_none()), ("lora_alpha", self.lora_alpha.is_none()), ("target_modules", self.target_modules.is_none())]
                .into_iter()
                .filter_map(|(name, missing)| missing.then_some(name))
                .collect();
        if !missing.is_empty() {
            let names: Vec<String> = missing.iter().map(|m| format!("'{m}'")).collect();
            problems.push(format!("Missing required configuration fields: [{}]", names.join(", ")));
        }
        if let Some(kind) = self.peft_type.as_deref().filter(|t| *t != "LORA") {
            problems.push(format!("PEFT type {kind} is not supported: only LORA adapters are."));
        }
        if self.use_dora {
            problems.push("DoRA (use_dora) is not supported.".into());
        }
        if self.bias.as_deref().is_some_and(|b| b != "none") || self.lora_bias {
            problems.push("Adapter bias is not supported.".into());
        }
        if self.layer_replication.as_ref().is_some_and(|v| !v.is_null()) {
            problems.push("layer_replication is not supported.".into());
        }
        if self.target_parameters.as_ref().is_some_and(|t| !t.is_empty()) {
            problems.push("target_parameters (LoRA on parameters rather than modules) is not supported.".into());
        }
        if self.alora_invocation_tokens.as_ref().is_some_and(|v| !v.is_null()) {
            problems.push("Activated LoRA (aLoRA) is not supported.".into());
        }
        if self.use_qalora {
            problems.push("QALoRA is not supported.".into());
        }
        let set = |v: &Option<Value>| v.as_ref().is_some_and(|v| !v.is_null() && *v != Value::Bool(false));
        for (field, what) in [
            (&self.use_bdlora, "block-diagonal LoRA (use_bdlora)"),
            (&self.arrow_config, "Arrow routing (arrow_config)"),
            (&self.kasa_config, "KaSA (kasa_config)"),
            (&self.monteclora_config, "MonteCLoRA (monteclora_config)"),
        ] {
            if set(field) {
                problems.push(format!("{what} is not supported."));
            }
        }
        match self.r {
            Some(0) => problems.push("LoRA rank `r` must be a positive integer, got 0.".into()),
            Some(r) if r > max_rank => problems.push(format!("LoRA rank {r} is greater than max_lora_rank {max_rank}.")),
            _ => {}
        }
        problems
    }

    /// Whether `key` (a weight's name) belongs to one of `modules_to_save`.
    fn saves(&self, key: &str) -> bool {
        let modules = self.modules_to_save.iter().flatten();
        modules.into_iter().any(|module| {
            key.strip_suffix(".weight").or_else(|| key.strip_suffix(".bias")).is_some_and(|owner| {
                // `classifier` saves `classifier.weight` and `classifier.out_proj.weight`;
                // `bert.pooler` is named from the model's root, `pooler` from anywhere.
                let parts: Vec<&str> = owner.split('.').collect();
                (1..=parts.len()).any(|end| (0..end).any(|start| parts[start..end].join(".") == *module))
            })
        })
    }

    /// `lora_alpha` of `module`: `alpha_pattern`'s entry whose key the module's name ends with
    /// (PEFT matches `(.*\.)?key$`), else the adapter's.
    fn alpha_of(&self, module: &str) -> f64 {
        self.alpha_pattern
            .iter()
            .find(|(key, _)| ends_at_dot(module, key))
            .map(|(_, alpha)| *alpha)
            .unwrap_or(self.lora_alpha.unwrap_or(8.0))
    }
}

/// Whether `name` is `tail` or ends with `.tail`.
fn ends_at_dot(name: &str, tail: &str) -> bool {
    name == tail || (name.len() > tail.len() && name.ends_with(tail) && name.as_bytes()[name.len() - tail.len() - 1] == b'.')
}

/// Reads the adapter `name` at `path` onto `sites`; its `modules_to_save` build their head
/// from `classifier`.
pub fn load_adapter(
    name: &str,
    path: &str,
    sites: &[LoraSite],
    classifier: Option<&ClassifierSource>,
    max_rank: usize,
) -> Result<Adapter, LoadError> {
    let folder = Path::new(path);
    let config_file = folder.join("adapter_config.json");
    let weights_file = folder.join("adapter_model.safetensors");
    if !config_file.is_file() {
        return Err(LoadError::AdapterNotFound { name: name.to_string(), path: path.to_string() });
    }
    let invalid = |m: String| LoadError::Adapter(format!("LoRA adapter `{name}`: {m}"));
    let text = std::fs::read_to_string(&config_file).map_err(|e| invalid(format!("cannot read adapter_config.json: {e}")))?;
    let config: AdapterConfig = serde_json::from_str(&text).map_err(|e| invalid(format!("invalid adapter_config.json: {e}")))?;
    let problems = config.refusals(max_rank);
    if !problems.is_empty() {
        return Err(invalid(problems.join(" ")));
    }
    if !weights_file.is_file() {
        let pickle = folder.join("adapter_model.bin").is_file();
        return Err(invalid(match pickle {
            true => "adapter_model.bin (a torch pickle) is not read; save the adapter with safe_serialization=True".into(),
            false => "adapter_model.safetensors is missing".into(),
        }));
    }
    let tensors = candle_core::safetensors::load(&weights_file, &Device::Cpu)
        .map_err(|e| invalid(format!("adapter_model.safetensors: {}", crate::models::describe(&e))))?;

    // Module → its A and B.
    let mut modules: BTreeMap<String, (Option<Tensor>, Option<Tensor>)> = BTreeMap::new();
    let mut saved = HashMap::new();
    for (key, tensor) in tensors {
        let key = key.strip_prefix("base_model.model.").unwrap_or(&key);
        let (module, which) = match lora_factor(key) {
            Some(found) => found,
            None if config.saves(key) => {
                saved.insert(key.to_string(), tensor);
                continue;
            }
            None if key.contains("lora_embedding_") => return Err(invalid(format!("LoRA on embeddings (`{key}`) is not supported"))),
            None if key.contains("lora_magnitude_vector") => return Err(invalid("DoRA (use_dora) is not supported.".into())),
            None => {
                return Err(invalid(format!(
                    "`{key}` is neither a lora_A nor a lora_B weight nor one of modules_to_save; only LoRA products on the base model's layers and saved classifier heads are applied"
                )))
            }
        };
        let entry = modules.entry(module.to_string()).or_default();
        match which {
            Factor::A => entry.0 = Some(tensor),
            Factor::B => entry.1 = Some(tensor),
        }
    }
    if modules.is_empty() {
        return Err(invalid("adapter_model.safetensors holds no lora_A / lora_B weights".into()));
    }
    let own_classifier = match (saved.is_empty(), classifier) {
        (true, _) => None,
        (false, Some(source)) => Some(Arc::new(source.with_saved(saved).map_err(invalid)?)),
        (false, None) => {
            let mut names: Vec<&String> = saved.keys().collect();
            names.sort();
            return Err(invalid(format!(
                "modules_to_save replaces {names:?}, but this model serves no classifier head to replace: not supported"
            )));
        }
    };

    let mut per_site: Vec<Vec<(usize, LoraFactors)>> = sites.iter().map(|_| Vec::new()).collect();
    let (mut rank_max, mut floats) = (0, 0);
    for (module, (a, b)) in modules {
        let (Some(a), Some(b)) = (a, b) else {
            return Err(invalid(format!("`{module}` has lora_A without lora_B or the other way round")));
        };
        let (site, part) = find_site(sites, &module).map_err(invalid)?;
        let as_f32 = |t: Tensor| -> Result<(Vec<f32>, usize, usize), LoadError> {
            let (rows, cols) = t.dims2().map_err(|_| invalid(format!("`{module}`: a LoRA factor of shape {:?}", t.shape())))?;
            let values = t.to_dtype(DType::F32).and_then(|t| t.flatten_all()).and_then(|t| t.to_vec1::<f32>());
            Ok((values.map_err(|e| invalid(crate::models::describe(&e)))?, rows, cols))
        };
        let (a, rank, a_in) = as_f32(a)?;
        let (b, b_out, b_rank) = as_f32(b)?;
        let (in_features, out_len) = (sites[site].in_features, sites[site].parts[part].len);
        if a_in != in_features || b_out != out_len || b_rank != rank {
            return Err(invalid(format!(
                "`{module}`: lora_A is [{rank}, {a_in}] and lora_B [{b_out}, {b_rank}]; this model's layer needs [r, {in_features}] and [{out_len}, r]"
            )));
        }
        if rank > max_rank {
            return Err(invalid(format!("LoRA rank {rank} is greater than max_lora_rank {max_rank}.")));
        }
        let alpha = config.alpha_of(&module);
        let scale = if config.use_rslora { alpha / (rank as f64).sqrt() } else { alpha / rank as f64 } as f32;
        rank_max = rank_max.max(rank);
        floats += a.len() + b.len();
        if per_site[site].iter().any(|(p, _)| *p == part) {
            return Err(invalid(format!("two modules of the adapter reach `{}`", sites[site].parts[part].name)));
        }
        per_site[site].push((part, LoraFactors { a, b, rank, scale }));
    }
    let products = sites
        .iter()
        .zip(per_site)
        .map(|(site, factors)| match factors.is_empty() {
            true => Ok(None),
            false => SiteProduct::new(site, factors).map(Some),
        })
        .collect::<candle_core::Result<Vec<_>>>()
        .map_err(|e| invalid(crate::models::describe(&e)))?;
    Ok(Adapter {
        name: name.to_string(),
        path: path.to_string(),
        weights: std::sync::Arc::new(LoraWeights::new(products)),
        classifier: own_classifier,
        prompt: None,
        rank: rank_max,
        floats,
    })
}

enum Factor {
    A,
    B,
}

/// `(module, A or B)` of a key `<module>.lora_A.weight` (or `.lora_A.<adapter>.weight`, as
/// PEFT names them before saving).
fn lora_factor(key: &str) -> Option<(&str, Factor)> {
    for (marker, factor) in [(".lora_A.", Factor::A), (".lora_B.", Factor::B)] {
        if let Some(at) = key.find(marker) {
            if key.ends_with(".weight") {
                return Some((&key[..at], factor));
            }
        }
    }
    None
}

/// The one site (and part of it) `module` names; an error naming the module otherwise.
fn find_site(sites: &[LoraSite], module: &str) -> Result<(usize, usize), String> {
    let mut found = Vec::new();
    for (s, site) in sites.iter().enumerate() {
        for (p, part) in site.parts.iter().enumerate() {
            if ends_at_dot(&part.name, module) || ends_at_dot(module, &part.name) {
                found.push((s, p));
            }
        }
    }
    match found.as_slice() {
        [one] => Ok(*one),
        [] => {
            let kinds: Vec<&str> = sites
                .iter()
                .flat_map(|s| &s.parts)
                .map(|p| p.name.rsplit('.').next().unwrap_or(&p.name))
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            Err(format!(
                "LoRA on `{module}` is not supported: adapters of this model may train its dense layers {}",
                if kinds.is_empty() { "(none: this architecture takes no adapters yet)".to_string() } else { kinds.join(", ") }
            ))
        }
        _ => Err(format!("`{module}` names several layers of this model")),
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
        assert!("{not json".parse::<LoraModule>().unwrap_err().starts_with("Invalid JSON format for --lora-modules"));
        assert!(r#"{"name": "x"}"#.parse::<LoraModule>().unwrap_err().starts_with("Invalid fields for --lora-modules"));
        assert!("a=b=c".parse::<LoraModule>().is_err());
    }

    #[test]
    fn names_match_at_dots_only() {
        assert!(ends_at_dot("bert.encoder.layer.1.output.dense", "encoder.layer.1.output.dense"));
        assert!(!ends_at_dot("encoder.layer.11.output.dense", "1.output.dense"));
        assert!(!ends_at_dot("encoder.layer.0.attention.output.dense", "layer.0.output.dense"));
    }

    #[test]
    fn refusals_name_what_is_refused() {
        let config: AdapterConfig = serde_json::from_str(
            r#"{"peft_type": "LORA", "r": 32, "lora_alpha": 16, "target_modules": ["q"], "use_dora": true, "bias": "all"}"#,
        )
        .unwrap();
        let problems = config.refusals(16).join(" ");
        assert!(problems.contains("DoRA (use_dora) is not supported."), "{problems}");
        assert!(problems.contains("Adapter bias is not supported."), "{problems}");
        assert!(problems.contains("LoRA rank 32 is greater than max_lora_rank 16."), "{problems}");
        let config: AdapterConfig = serde_json::from_str(r#"{"peft_type": "IA3"}"#).unwrap();
        let problems = config.refusals(16).join(" ");
        assert!(problems.contains("Missing required configuration fields: ['r', 'lora_alpha', 'target_modules']"), "{problems}");
        assert!(problems.contains("PEFT type IA3 is not supported"), "{problems}");
    }
}
