//! The sentence-transformers files of a model folder: `modules.json`, the Pooling module's
//! config, Dense modules (with their activation), Normalize, and `sentence_bert_config.json`.

use super::hub::ModelSource;
use super::{read_json, LoadError};
use crate::kernels::Linear;
use crate::pooling::embedding_head::{Dense, DenseActivation};
use crate::pooling::PoolingType;
use candle_core::Device;
use serde::Deserialize;

/// What the sentence-transformers files say, when the model has them.
#[derive(Debug, Default)]
pub struct SentenceTransformer {
    pub pooling: Option<PoolingType>,
    pub dense: Vec<Dense>,
    pub normalize: bool,
    pub max_seq_length: Option<usize>,
    pub do_lower_case: bool,
    /// `config_sentence_transformers.json` says `MultiVectorEncoder` (ColBERT-style: one
    /// vector per token, scored by MaxSim).
    pub multi_vector: bool,
    /// modules.json has a Transformer followed by a Pooling module.
    pub pooling_module: bool,
    /// `prompts` of `config_sentence_transformers.json`: name → text prepended to an input.
    pub prompts: std::collections::BTreeMap<String, String>,
    /// `default_prompt_name` of `config_sentence_transformers.json`.
    pub default_prompt_name: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct SpladeConfig {
    pooling_strategy: Option<String>,
    activation_function: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct StConfig {
    model_type: Option<String>,
    /// PyLate's fields (its folders name no `model_type`; PyLate reads them as ColBERT).
    query_prefix: Option<String>,
    query_length: Option<usize>,
    prompts: std::collections::BTreeMap<String, String>,
    default_prompt_name: Option<String>,
}

#[derive(Deserialize)]
struct Module {
    path: String,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct PoolingConfig {
    pooling_mode_cls_token: bool,
    pooling_mode_mean_tokens: bool,
    pooling_mode_max_tokens: bool,
    pooling_mode_mean_sqrt_len_tokens: bool,
    pooling_mode_weightedmean_tokens: bool,
    pooling_mode_lasttoken: bool,
    pooling_mode: Option<String>,
    /// sentence-transformers' default: prompt tokens are pooled like the rest.
    #[serde(default = "yes")]
    include_prompt: bool,
}

#[derive(Deserialize)]
struct DenseConfig {
    in_features: usize,
    out_features: usize,
    #[serde(default = "yes")]
    bias: bool,
    #[serde(default = "identity", alias = "activation")]
    activation_function: String,
    /// PyLate's Dense may add its input back (through its own `residual` layer when the widths
    /// differ); no published ColBERT uses it.
    #[serde(default)]
    use_residual: bool,
}

fn yes() -> bool {
    true
}
fn identity() -> String {
    "torch.nn.modules.linear.Identity".into()
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct BertConfigFile {
    max_seq_length: Option<usize>,
    do_lower_case: bool,
}

fn pooling_type(config: &PoolingConfig, path: &str) -> Result<PoolingType, LoadError> {
    if let Some(mode) = &config.pooling_mode {
        return match mode.as_str() {
            "cls" => Ok(PoolingType::Cls),
            "mean" => Ok(PoolingType::Mean),
            "lasttoken" => Ok(PoolingType::Last),
            other => Err(LoadError::Unsupported(format!("{path}: pooling mode `{other}`"))),
        };
    }
    let flags = [
        (config.pooling_mode_cls_token, Some(PoolingType::Cls), "cls_token"),
        (config.pooling_mode_mean_tokens, Some(PoolingType::Mean), "mean_tokens"),
        (config.pooling_mode_lasttoken, Some(PoolingType::Last), "lasttoken"),
        (config.pooling_mode_max_tokens, None, "max_tokens"),
        (config.pooling_mode_mean_sqrt_len_tokens, None, "mean_sqrt_len_tokens"),
        (config.pooling_mode_weightedmean_tokens, None, "weightedmean_tokens"),
    ];
    let set: Vec<_> = flags.iter().filter(|f| f.0).collect();
    match set.as_slice() {
        [(_, Some(kind), _)] => Ok(*kind),
        [(_, None, name)] => Err(LoadError::Unsupported(format!("{path}: pooling_mode_{name}"))),
        [] => Err(LoadError::Invalid(format!("{path}: no pooling mode is enabled"))),
        _ => Err(LoadError::Unsupported(format!("{path}: several pooling modes concatenated"))),
    }
}

fn load_dense(source: &ModelSource, path: &str) -> Result<Dense, LoadError> {
    let config: DenseConfig = read_json(&source.required(&format!("{path}/config.json"))?)?;
    if config.use_residual {
        return Err(LoadError::Unsupported(format!("{path}: a Dense module with use_residual")));
    }
    let activation = DenseActivation::from_torch_name(&config.activation_function)
        .ok_or_else(|| LoadError::Unsupported(format!("{path}: Dense activation `{}`", config.activation_function)))?;
    let weights_path = source
        .file(&format!("{path}/model.safetensors"))?
        .ok_or_else(|| LoadError::Unsupported(format!("{path}: only model.safetensors weights are supported")))?;
    let tensors = candle_core::safetensors::load(&weights_path, &Device::Cpu)
        .map_err(|e| LoadError::Invalid(format!("{}: {e}", weights_path.display())))?;
    let weight = tensors
        .get("linear.weight")
        .ok_or_else(|| LoadError::Invalid(format!("{path}: no linear.weight")))?
        .to_dtype(candle_core::DType::F32)?;
    if weight.dims() != [config.out_features, config.in_features] {
        return Err(LoadError::Invalid(format!("{path}: linear.weight has shape {:?}", weight.dims())));
    }
    let bias = match (config.bias, tensors.get("linear.bias")) {
        (true, Some(b)) => Some(b.to_dtype(candle_core::DType::F32)?),
        (true, None) => return Err(LoadError::Invalid(format!("{path}: no linear.bias"))),
        (false, _) => None,
    };
    Ok(Dense { linear: Linear::new(weight, bias)?, activation })
}

impl SentenceTransformer {
    /// Reads the folder's sentence-transformers files; `dense_path` (`--dense-path`) names the
    /// Dense module to load instead of the one modules.json lists, as TEI's flag does (stella's
    /// `2_Dense_<dims>` folders, one per output width), or the Dense after pooling when there is
    /// no modules.json.
    pub fn read(source: &ModelSource, dense_path: Option<&str>) -> Result<Self, LoadError> {
        let mut st = SentenceTransformer::default();
        if let Some(path) = source.file("sentence_bert_config.json")? {
            let config: BertConfigFile = read_json(&path)?;
            st.max_seq_length = config.max_seq_length;
            st.do_lower_case = config.do_lower_case;
        }
        if let Some(path) = source.file("config_sentence_transformers.json")? {
            let config: StConfig = read_json(&path)?;
            // sentence-transformers' MultiVectorEncoder, and PyLate's ColBERT folders (PyLate
            // reads a folder without `model_type` as ColBERT; its own fields say it is one).
            let pylate = config.query_prefix.is_some() || config.query_length.is_some();
            st.multi_vector = matches!(config.model_type.as_deref(), Some("MultiVectorEncoder" | "ColBERT")) || pylate;
            st.prompts = config.prompts;
            st.default_prompt_name = config.default_prompt_name.filter(|name| !name.is_empty());
        }
        let Some(modules_path) = source.file("modules.json")? else {
            if let Some(path) = dense_path {
                st.dense.push(load_dense(source, path)?);
            }
            return Ok(st);
        };
        let mut modules: Vec<Module> = read_json(&modules_path)?;
        if let Some(path) = dense_path {
            let mut dense = modules.iter_mut().filter(|m| m.kind.rsplit('.').next() == Some("Dense"));
            match (dense.next(), dense.next()) {
                (Some(only), None) => only.path = path.to_string(),
                (None, _) => return Err(LoadError::Invalid(format!("--dense-path {path}: modules.json lists no Dense module to replace"))),
                (Some(_), Some(_)) => {
                    return Err(LoadError::Invalid(format!(
                        "--dense-path {path}: modules.json lists several Dense modules; the flag replaces a single one"
                    )))
                }
            }
        }
        let mut after_transformer = false;
        for module in modules {
            let kind = module.kind.rsplit('.').next().unwrap_or(&module.kind);
            match kind {
                "Transformer" => after_transformer = true,
                "Pooling" => {
                    st.pooling_module = after_transformer;
                    let config: PoolingConfig = read_json(&source.required(&format!("{}/config.json", module.path))?)?;
                    st.pooling = Some(pooling_type(&config, &module.path)?);
                    // Pooling that skips the prompt's tokens (INSTRUCTOR-style) is not built yet:
                    // serving it with the prompt pooled in would silently change the vectors.
                    if !config.include_prompt {
                        return Err(LoadError::Unsupported(format!(
                            "{}: include_prompt: false (pooling without the prompt's tokens)",
                            module.path
                        )));
                    }
                }
                "Dense" => st.dense.push(load_dense(source, &module.path)?),
                "SpladePooling" => {
                    let config: SpladeConfig = read_json(&source.required(&format!("{}/config.json", module.path))?)?;
                    let strategy = config.pooling_strategy.as_deref().unwrap_or("max");
                    let activation = config.activation_function.as_deref().unwrap_or("relu");
                    if strategy != "max" || activation != "relu" {
                        return Err(LoadError::Unsupported(format!(
                            "{}: SPLADE pooling `{strategy}` with `{activation}` (only max with relu)",
                            module.path
                        )));
                    }
                    st.pooling = Some(PoolingType::Splade);
                }
                // all-MiniLM-L6-v2 lists 2_Normalize without shipping a folder for it.
                "Normalize" => st.normalize = true,
                other => return Err(LoadError::Unsupported(format!("sentence-transformers module `{other}` ({})", module.path))),
            }
        }
        Ok(st)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_flags() {
        let cfg = PoolingConfig { pooling_mode_mean_tokens: true, ..Default::default() };
        assert_eq!(pooling_type(&cfg, "1_Pooling").unwrap(), PoolingType::Mean);
        let cfg = PoolingConfig { pooling_mode_lasttoken: true, ..Default::default() };
        assert_eq!(pooling_type(&cfg, "1_Pooling").unwrap(), PoolingType::Last);
        let cfg = PoolingConfig { pooling_mode_max_tokens: true, ..Default::default() };
        assert!(pooling_type(&cfg, "1_Pooling").is_err());
        let cfg = PoolingConfig { pooling_mode_cls_token: true, pooling_mode_mean_tokens: true, ..Default::default() };
        assert!(pooling_type(&cfg, "1_Pooling").is_err());
    }
}
