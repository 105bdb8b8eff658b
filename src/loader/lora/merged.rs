//! Task adapters kept beside the weights as PEFT folders, one merged into the weights at load:
//! jina-embeddings-v5's `adapters/<task>/adapter_config.json` + `adapter_model.safetensors`.
//!
//! - The task `jina_task` names is merged as vLLM's `jina.py` merges it,
//!   `W + (lora_alpha / r) · B·A` for every module the adapter holds (rsLoRA and `alpha_pattern`
//!   are not read, as vLLM reads neither): a request without a task runs the merged weights at
//!   the model's full speed, as in vLLM. A missing adapter loads the base weights with a
//!   warning, as vLLM does.
//! - Beyond vLLM, every task is also a built-in adapter a request picks with `task` (as
//!   jina-embeddings-v3's): on the merged weights, task `t` adds `s_t·B_t·A_t − s_m·B_m·A_m`,
//!   one LoRA of rank `r_t + r_m` (`A = [A_t; A_m]`, `B = [s_t·B_t, −s_m·B_m]`); the merged task
//!   itself adds nothing.

use crate::kernels::lora::{LoraFactors, LoraSite, LoraWeights, SiteProduct, TaskAdapter};
use crate::loader::hub::ModelSource;
use crate::loader::LoadError;
use crate::models::AdapterFolders;
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;

/// One PEFT adapter: `lora_alpha / r`, and each module's `(A [r, in], B [out, r])` by module
/// name without `base_model.model.` (nor `model.`).
struct PeftFolder {
    scale: f64,
    modules: HashMap<String, (Tensor, Tensor)>,
}

/// The module name both sides compare: without the `model.` a checkpoint may keep.
fn bare(name: &str) -> &str {
    name.strip_prefix("model.").unwrap_or(name)
}

/// The adapter in `folder`, or `None` when its files are not there.
fn read(source: &ModelSource, folder: &str) -> Result<Option<PeftFolder>, LoadError> {
    let (Some(config), Some(weights)) =
        (source.file(&format!("{folder}/adapter_config.json"))?, source.file(&format!("{folder}/adapter_model.safetensors"))?)
    else {
        return Ok(None);
    };
    let invalid = |what: String| LoadError::Invalid(format!("{folder}: {what}"));
    let config: serde_json::Value = crate::loader::read_json(&config)?;
    let number = |key: &str| {
        config.get(key).and_then(serde_json::Value::as_f64).ok_or_else(|| invalid(format!("adapter_config.json lacks `{key}`")))
    };
    let (alpha, rank) = (number("lora_alpha")?, number("r")?);
    if rank <= 0.0 {
        return Err(invalid(format!("r must be positive, got {rank}")));
    }
    let mut halves: HashMap<String, (Option<Tensor>, Option<Tensor>)> = HashMap::new();
    for (key, tensor) in candle_core::safetensors::load(&weights, &Device::Cpu)? {
        let key = key.strip_prefix("base_model.model.").unwrap_or(&key);
        let (module, is_a) = match (key.split_once(".lora_A."), key.split_once(".lora_B.")) {
            (Some((module, _)), _) => (module, true),
            (_, Some((module, _))) => (module, false),
            _ => continue,
        };
        let entry = halves.entry(bare(module).to_string()).or_default();
        let tensor = Some(tensor.to_dtype(DType::F32)?);
        if is_a {
            entry.0 = tensor;
        } else {
            entry.1 = tensor;
        }
    }
    let mut modules = HashMap::with_capacity(halves.len());
    for (module, pair) in halves {
        let (Some(a), Some(b)) = pair else { return Err(invalid(format!("{module}: lora_A without lora_B or the reverse"))) };
        modules.insert(module, (a, b));
    }
    Ok(Some(PeftFolder { scale: alpha / rank, modules }))
}

/// The deltas of the adapter in `folder`, keyed by the name of the checkpoint tensor each is
/// added to (`has` says which names the checkpoint holds).
pub fn deltas(source: &ModelSource, folder: &str, has: impl Fn(&str) -> bool) -> Result<HashMap<String, Tensor>, LoadError> {
    let Some(adapter) = read(source, folder)? else {
        tracing::warn!("No adapter found in {folder}. Loading raw base weights.");
        return Ok(HashMap::new());
    };
    let mut deltas = HashMap::with_capacity(adapter.modules.len());
    for (module, (a, b)) in &adapter.modules {
        // The checkpoint's name: with or without the `model.` prefix.
        let stored = [format!("{module}.weight"), format!("model.{module}.weight")]
            .into_iter()
            .find(|n| has(n))
            .ok_or_else(|| LoadError::Invalid(format!("{folder}: the adapter's module {module} is not in the checkpoint")))?;
        let delta = (b.matmul(a).map_err(|e| LoadError::Invalid(format!("{folder}: {module}: {e}")))? * adapter.scale)?;
        deltas.insert(stored, delta);
    }
    tracing::info!("merged {} adapter modules of {folder} (scale {})", deltas.len(), adapter.scale);
    Ok(deltas)
}

/// Every task of `folders` as a built-in adapter on the merged weights (see the module docs);
/// none when the merged task's adapter is missing (the base weights then run, and a task's
/// own adapter would be the whole story: the folders are read as they are).
pub fn task_adapters(source: &ModelSource, folders: &AdapterFolders, sites: &[LoraSite]) -> Result<Vec<TaskAdapter>, LoadError> {
    let Some((_, merged_folder)) = folders.tasks.iter().find(|(task, _)| *task == folders.merged) else {
        return Ok(Vec::new());
    };
    let empty = PeftFolder { scale: 1.0, modules: HashMap::new() };
    let merged = read(source, merged_folder)?.unwrap_or(empty);
    let mut adapters = Vec::with_capacity(folders.tasks.len());
    for (task, folder) in &folders.tasks {
        let own = match task == &folders.merged {
            true => None,
            false => Some(read(source, folder)?.ok_or_else(|| LoadError::Invalid(format!("task `{task}`: no adapter in {folder}")))?),
        };
        let (mut products, mut floats, mut widest) = (Vec::with_capacity(sites.len()), 0, 0);
        for site in sites {
            let mut parts = Vec::new();
            for (index, part) in site.parts.iter().enumerate() {
                let module = bare(&part.name);
                // `(A, s·B)` terms: the task's own, and the merged one taken back.
                let mut terms: Vec<(&Tensor, Tensor)> = Vec::new();
                if let Some(own) = &own {
                    if let Some((a, b)) = own.modules.get(module) {
                        terms.push((a, (b * own.scale)?));
                    }
                    if let Some((a, b)) = merged.modules.get(module) {
                        terms.push((a, (b * -merged.scale)?));
                    }
                }
                if terms.is_empty() {
                    continue;
                }
                let a = Tensor::cat(&terms.iter().map(|(a, _)| (*a).clone()).collect::<Vec<_>>(), 0)?;
                let b = Tensor::cat(&terms.iter().map(|(_, b)| b.clone()).collect::<Vec<_>>(), 1)?;
                let rank = a.dim(0)?;
                let (a, b) = (a.flatten_all()?.to_vec1::<f32>()?, b.flatten_all()?.to_vec1::<f32>()?);
                floats += a.len() + b.len();
                widest = widest.max(rank);
                parts.push((index, LoraFactors { a, b, rank, scale: 1.0 }));
            }
            products.push(match parts.is_empty() {
                true => None,
                false => Some(SiteProduct::new(site, parts).map_err(|e| LoadError::Invalid(format!("task `{task}`: {e}")))?),
            });
        }
        adapters.push(TaskAdapter { name: task.clone(), prompt: None, weights: LoraWeights::new(products), rank: widest, floats });
    }
    Ok(adapters)
}
