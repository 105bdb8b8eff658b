//! Reading one PEFT adapter folder (`adapter_config.json`, `adapter_model.safetensors`): what
//! its config asks for and what is refused (vLLM's messages), its factors matched to the
//! backbone's LoRA sites by module name at `.` boundaries, their scale, and its saved head.

use super::saved_head::ClassifierSource;
use super::Adapter;
use crate::kernels::lora::{LoraFactors, LoraSite, LoraWeights, SiteProduct};
use crate::loader::LoadError;
use candle_core::{DType, Device, Tensor};
use serde::Deserialize;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

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
    if !folder.join("adapter_config.json").is_file() {
        return Err(LoadError::AdapterNotFound { name: name.to_string(), path: path.to_string() });
    }
    let refused = |message: String| refused(name, message);
    let config = read_config(name, folder, max_rank)?;
    let (modules, saved) = read_weights(name, folder, &config)?;
    let own_classifier = match (saved.is_empty(), classifier) {
        (true, _) => None,
        (false, Some(source)) => Some(Arc::new(source.with_saved(saved).map_err(|e| refused(e.to_string()))?)),
        (false, None) => {
            let mut names: Vec<&String> = saved.keys().collect();
            names.sort();
            return Err(refused(format!(
                "modules_to_save replaces {names:?}, but this model serves no classifier head to replace: not supported"
            )));
        }
    };
    let factors = site_factors(name, modules, sites, &config, max_rank)?;
    let products = sites
        .iter()
        .zip(factors.per_site)
        .map(|(site, factors)| match factors.is_empty() {
            true => Ok(None),
            false => SiteProduct::new(site, factors).map(Some),
        })
        .collect::<candle_core::Result<Vec<_>>>()
        .map_err(|e| refused(crate::models::describe(&e)))?;
    Ok(Adapter {
        name: name.to_string(),
        path: path.to_string(),
        weights: std::sync::Arc::new(LoraWeights::new(products)),
        classifier: own_classifier,
        prompt: None,
        rank: factors.rank,
        floats: factors.floats,
        serial: super::next_serial(),
    })
}

/// Why the adapter `name` is refused, in its words.
fn refused(name: &str, message: impl std::fmt::Display) -> LoadError {
    LoadError::Adapter(format!("LoRA adapter `{name}`: {message}"))
}

/// `adapter_config.json`, with everything it asks for that cannot be applied refused in one
/// message; the weights must be in safetensors beside it.
fn read_config(name: &str, folder: &Path, max_rank: usize) -> Result<AdapterConfig, LoadError> {
    let text = std::fs::read_to_string(folder.join("adapter_config.json"))
        .map_err(|e| refused(name, format!("cannot read adapter_config.json: {e}")))?;
    let config: AdapterConfig = serde_json::from_str(&text).map_err(|e| refused(name, format!("invalid adapter_config.json: {e}")))?;
    let problems = config.refusals(max_rank);
    if !problems.is_empty() {
        return Err(refused(name, problems.join(" ")));
    }
    if !folder.join("adapter_model.safetensors").is_file() {
        return Err(refused(
            name,
            match folder.join("adapter_model.bin").is_file() {
                true => "adapter_model.bin (a torch pickle) is not read; save the adapter with safe_serialization=True",
                false => "adapter_model.safetensors is missing",
            },
        ));
    }
    Ok(config)
}

/// A module's `(lora_A, lora_B)`, as found.
type ModuleFactors = BTreeMap<String, (Option<Tensor>, Option<Tensor>)>;

/// `adapter_model.safetensors` sorted out: each module's factors, and the weights
/// `modules_to_save` saved whole; anything else is refused with its name.
fn read_weights(name: &str, folder: &Path, config: &AdapterConfig) -> Result<(ModuleFactors, HashMap<String, Tensor>), LoadError> {
    let tensors = candle_core::safetensors::load(folder.join("adapter_model.safetensors"), &Device::Cpu)
        .map_err(|e| refused(name, format!("adapter_model.safetensors: {}", crate::models::describe(&e))))?;
    let mut modules = ModuleFactors::new();
    let mut saved = HashMap::new();
    for (key, tensor) in tensors {
        let key = key.strip_prefix("base_model.model.").unwrap_or(&key);
        let (module, which) = match lora_factor(key) {
            Some(found) => found,
            None if config.saves(key) => {
                saved.insert(key.to_string(), tensor);
                continue;
            }
            None if key.contains("lora_embedding_") => return Err(refused(name, format!("LoRA on embeddings (`{key}`) is not supported"))),
            None if key.contains("lora_magnitude_vector") => return Err(refused(name, "DoRA (use_dora) is not supported.")),
            None => {
                return Err(refused(name, format!(
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
        return Err(refused(name, "adapter_model.safetensors holds no lora_A / lora_B weights"));
    }
    Ok((modules, saved))
}

/// An adapter's factors placed on the backbone's sites.
struct SiteFactors {
    /// Per site, the factors of each of its parts the adapter reaches.
    per_site: Vec<Vec<(usize, LoraFactors)>>,
    /// Largest rank among the modules.
    rank: usize,
    floats: usize,
}

/// Each module's factors on the one site (and part) its name matches, shapes checked against
/// the layer, scaled by its `lora_alpha / r` (`/ √r` with rsLoRA).
fn site_factors(
    name: &str,
    modules: ModuleFactors,
    sites: &[LoraSite],
    config: &AdapterConfig,
    max_rank: usize,
) -> Result<SiteFactors, LoadError> {
    let mut out = SiteFactors { per_site: sites.iter().map(|_| Vec::new()).collect(), rank: 0, floats: 0 };
    for (module, (a, b)) in modules {
        let (Some(a), Some(b)) = (a, b) else {
            return Err(refused(name, format!("`{module}` has lora_A without lora_B or the other way round")));
        };
        let (site, part) = find_site(sites, &module).map_err(|e| refused(name, e))?;
        let as_f32 = |t: Tensor| -> Result<(Vec<f32>, usize, usize), LoadError> {
            let (rows, cols) = t.dims2().map_err(|_| refused(name, format!("`{module}`: a LoRA factor of shape {:?}", t.shape())))?;
            let values = t.to_dtype(DType::F32).and_then(|t| t.flatten_all()).and_then(|t| t.to_vec1::<f32>());
            Ok((values.map_err(|e| refused(name, crate::models::describe(&e)))?, rows, cols))
        };
        let (a, rank, a_in) = as_f32(a)?;
        let (b, b_out, b_rank) = as_f32(b)?;
        let (in_features, out_len) = (sites[site].in_features, sites[site].parts[part].len);
        if a_in != in_features || b_out != out_len || b_rank != rank {
            return Err(refused(name, format!(
                "`{module}`: lora_A is [{rank}, {a_in}] and lora_B [{b_out}, {b_rank}]; this model's layer needs [r, {in_features}] and [{out_len}, r]"
            )));
        }
        if rank > max_rank {
            return Err(refused(name, format!("LoRA rank {rank} is greater than max_lora_rank {max_rank}.")));
        }
        let alpha = config.alpha_of(&module);
        let scale = if config.use_rslora { alpha / (rank as f64).sqrt() } else { alpha / rank as f64 } as f32;
        out.rank = out.rank.max(rank);
        out.floats += a.len() + b.len();
        if out.per_site[site].iter().any(|(p, _)| *p == part) {
            return Err(refused(name, format!("two modules of the adapter reach `{}`", sites[site].parts[part].name)));
        }
        out.per_site[site].push((part, LoraFactors { a, b, rank, scale }));
    }
    Ok(out)
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
fn find_site(sites: &[LoraSite], module: &str) -> Result<(usize, usize), LoadError> {
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
            Err(LoadError::Adapter(format!(
                "LoRA on `{module}` is not supported: adapters of this model may train its dense layers {}",
                if kinds.is_empty() { "(none: this architecture takes no adapters yet)".to_string() } else { kinds.join(", ") }
            )))
        }
        _ => Err(LoadError::Adapter(format!("`{module}` names several layers of this model"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
