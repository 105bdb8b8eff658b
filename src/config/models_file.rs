//! `--config FILE`: the models file. One schema, in YAML or JSON (JSON is read as YAML, of
//! which it is a subset): `models`, a list of entries with `model` (folder or hub id), an
//! optional `name`, and any per-model serve option under its flag's snake_case name. An
//! entry's option replaces the flag's value (objects such as `pooler_config` are not merged).

use super::{content_format, unique_names, ConfigError};
use crate::loader::lora::{LoraModule, LoraOptions};
use crate::loader::options::{Convert, DTypeArg, DeviceArg, ModelOptions, Quantization, Runner};
use crate::pooling::config::PoolerConfig;
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelsFile {
    models: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: Option<String>,
    model: String,
    revision: Option<String>,
    runner: Option<Runner>,
    convert: Option<Convert>,
    pooler_config: Option<PoolerConfig>,
    hf_overrides: Option<serde_json::Map<String, serde_json::Value>>,
    max_model_len: Option<usize>,
    auto_truncate: Option<bool>,
    device: Option<DeviceArg>,
    dtype: Option<DTypeArg>,
    quantization: Option<Quantization>,
    default_prompt_name: Option<String>,
    default_prompt: Option<String>,
    reranker_instruction: Option<String>,
    dense_path: Option<String>,
    io_processor_plugin: Option<String>,
    chat_template: Option<String>,
    chat_template_content_format: Option<String>,
    enable_lora: Option<bool>,
    lora_modules: Option<Vec<LoraEntry>>,
    max_loras: Option<usize>,
    max_lora_rank: Option<usize>,
}

/// A `lora_modules` item: `NAME=PATH`, or the object form.
#[derive(Deserialize)]
#[serde(untagged)]
enum LoraEntry {
    Text(String),
    Object(LoraModule),
}

/// The entry's adapters: its own switch and limits over the flags'.
fn lora_of(e: &mut Entry, defaults: Option<LoraOptions>) -> Result<Option<LoraOptions>, ConfigError> {
    let enabled = e.enable_lora.unwrap_or(defaults.is_some() || e.lora_modules.is_some());
    if !enabled {
        return match e.lora_modules {
            Some(_) => Err(ConfigError("lora_modules needs enable_lora".into())),
            None => Ok(None),
        };
    }
    let mut lora = defaults.unwrap_or_default();
    lora.max_loras = e.max_loras.unwrap_or(lora.max_loras);
    lora.max_lora_rank = e.max_lora_rank.unwrap_or(lora.max_lora_rank);
    for item in e.lora_modules.take().unwrap_or_default() {
        lora.modules.push(match item {
            LoraEntry::Text(text) => text.parse().map_err(|e: crate::loader::LoadError| ConfigError(e.to_string()))?,
            LoraEntry::Object(module) => module,
        });
    }
    if lora.max_loras == 0 || lora.max_lora_rank == 0 {
        return Err(ConfigError("max_loras and max_lora_rank must be greater than 0".into()));
    }
    Ok(Some(lora))
}

pub(super) fn read(path: &std::path::Path, defaults: &ModelOptions) -> Result<Vec<ModelOptions>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError(format!("--config {}: {e}", path.display())))?;
    parse(&text, defaults).map_err(|e| ConfigError(format!("--config {}: {e}", path.display())))
}

pub(super) fn parse(text: &str, defaults: &ModelOptions) -> Result<Vec<ModelOptions>, ConfigError> {
    let file: ModelsFile = serde_norway::from_str(text).map_err(|e| ConfigError(e.to_string()))?;
    if let Some(e) = file.models.iter().find(|e| e.default_prompt_name.is_some() && e.default_prompt.is_some()) {
        return Err(ConfigError(format!(
            "model `{}`: default_prompt_name and default_prompt exclude each other",
            e.name.as_deref().unwrap_or(&e.model)
        )));
    }
    let models: Vec<ModelOptions> = file
        .models
        .into_iter()
        .map(|mut e| -> Result<ModelOptions, ConfigError> {
            let d = defaults.clone();
            let lora = lora_of(&mut e, d.lora.clone())
                .map_err(|m| ConfigError(format!("model `{}`: {m}", e.name.as_deref().unwrap_or(&e.model))))?;
            // An entry that sets a default prompt sets it alone: the flags' prompt defaults
            // do not mix with it (one would silently win).
            let (default_prompt_name, default_prompt) = if e.default_prompt_name.is_some() || e.default_prompt.is_some() {
                (e.default_prompt_name, e.default_prompt)
            } else {
                (d.default_prompt_name, d.default_prompt)
            };
            Ok(ModelOptions {
                served_name: e.name.unwrap_or_else(|| e.model.clone()),
                source: e.model,
                revision: e.revision.or(d.revision),
                hub_token: d.hub_token.clone(),
                runner: e.runner.unwrap_or(d.runner),
                convert: e.convert.unwrap_or(d.convert),
                pooler: e.pooler_config.unwrap_or(d.pooler),
                hf_overrides: e.hf_overrides.unwrap_or(d.hf_overrides),
                max_model_len: e.max_model_len.or(d.max_model_len),
                auto_truncate: e.auto_truncate.unwrap_or(d.auto_truncate),
                device: e.device.unwrap_or(d.device),
                dtype: e.dtype.unwrap_or(d.dtype),
                quantization: e.quantization.or(d.quantization),
                reranker_instruction: e.reranker_instruction.or(d.reranker_instruction),
                dense_path: e.dense_path.or(d.dense_path),
                io_processor_plugin: e.io_processor_plugin.or(d.io_processor_plugin),
                default_prompt_name,
                default_prompt,
                chat_template: e.chat_template.or(d.chat_template),
                chat_template_content_format: match e.chat_template_content_format {
                    Some(format) => content_format(&format)?,
                    None => d.chat_template_content_format,
                },
                lora,
            })
        })
        .collect::<Result<_, ConfigError>>()?;
    unique_names(&models)?;
    Ok(models)
}
