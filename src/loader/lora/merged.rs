//! A task adapter merged into the weights at load: jina-embeddings-v5 keeps its tasks as PEFT
//! adapters beside the weights (`adapters/<task>/adapter_config.json`,
//! `adapter_model.safetensors`), and vLLM's `jina.py` merges the one `jina_task` names,
//! `W + (lora_alpha / r) · B·A` for every module the adapter holds (rsLoRA and `alpha_pattern`
//! are not read, as vLLM reads neither). The model then runs as any other, at its full speed.
//! A missing adapter loads the base weights with a warning, as vLLM does.

use crate::loader::hub::ModelSource;
use crate::loader::LoadError;
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;

/// The deltas of the adapter in `folder`, keyed by the name of the checkpoint tensor each is
/// added to (`has` says which names the checkpoint holds).
pub fn deltas(source: &ModelSource, folder: &str, has: impl Fn(&str) -> bool) -> Result<HashMap<String, Tensor>, LoadError> {
    let (Some(config), Some(weights)) =
        (source.file(&format!("{folder}/adapter_config.json"))?, source.file(&format!("{folder}/adapter_model.safetensors"))?)
    else {
        tracing::warn!("No adapter found in {folder}. Loading raw base weights.");
        return Ok(HashMap::new());
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
    let scale = alpha / rank;
    let tensors = candle_core::safetensors::load(&weights, &Device::Cpu)?;
    let mut pairs: HashMap<String, (Option<Tensor>, Option<Tensor>)> = HashMap::new();
    for (key, tensor) in tensors {
        let key = key.strip_prefix("base_model.model.").unwrap_or(&key);
        let (module, slot) = match (key.split_once(".lora_A."), key.split_once(".lora_B.")) {
            (Some((module, _)), _) => (module, 0),
            (_, Some((module, _))) => (module, 1),
            _ => continue,
        };
        let entry = pairs.entry(format!("{module}.weight")).or_default();
        let tensor = tensor.to_dtype(DType::F32)?;
        if slot == 0 {
            entry.0 = Some(tensor);
        } else {
            entry.1 = Some(tensor);
        }
    }
    let mut deltas = HashMap::with_capacity(pairs.len());
    for (name, pair) in pairs {
        let (Some(a), Some(b)) = pair else { return Err(invalid(format!("{name}: lora_A without lora_B or the reverse"))) };
        // The checkpoint's name: as the adapter says, or with / without the `model.` prefix.
        let bare = name.strip_prefix("model.").unwrap_or(&name).to_string();
        let stored = [name.clone(), format!("model.{bare}"), bare]
            .into_iter()
            .find(|n| has(n))
            .ok_or_else(|| invalid(format!("the adapter's module {name} is not in the checkpoint")))?;
        let delta = (b.matmul(&a).map_err(|e| invalid(format!("{name}: {e}")))? * scale)?;
        deltas.insert(stored, delta);
    }
    tracing::info!("merged {} adapter modules of {folder} (scale {scale})", deltas.len());
    Ok(deltas)
}
