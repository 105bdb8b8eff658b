//! `--pooler-config` (vLLM's `PoolerConfig`): a model's pooling defaults, and the rules its
//! fields must satisfy together.

use super::PoolingType;
use serde::Deserialize;

/// Pooling defaults of a served model; every field optional (unset: the model's own choice).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PoolerConfig {
    pub pooling_type: Option<PoolingType>,
    pub normalize: Option<bool>,
    pub dimensions: Option<i64>,
    pub use_activation: Option<bool>,
    pub logit_bias: Option<f64>,
    pub step_tag_id: Option<u32>,
    pub returned_token_ids: Option<Vec<u32>>,
    pub enable_chunked_processing: Option<bool>,
    pub max_embed_len: Option<usize>,
}

impl PoolerConfig {
    /// Fields that only make sense with another one set.
    pub fn check(&self) -> Result<(), &'static str> {
        if self.max_embed_len.is_some() && self.enable_chunked_processing != Some(true) {
            return Err("max_embed_len needs enable_chunked_processing: true");
        }
        if self.pooling_type != Some(PoolingType::Step) && (self.step_tag_id.is_some() || self.returned_token_ids.is_some()) {
            return Err("step_tag_id and returned_token_ids need pooling_type STEP");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_unknown_fields() {
        let err = serde_json::from_str::<PoolerConfig>(r#"{"pooling_typ": "MEAN"}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field"));
        let ok: PoolerConfig = serde_json::from_str(r#"{"pooling_type": "MEAN", "normalize": false}"#).unwrap();
        assert_eq!(ok.pooling_type, Some(PoolingType::Mean));
    }

    #[test]
    fn fields_that_need_another() {
        assert!(PoolerConfig { max_embed_len: Some(10), ..Default::default() }.check().is_err());
        assert!(PoolerConfig { step_tag_id: Some(3), ..Default::default() }.check().is_err());
        assert!(PoolerConfig { step_tag_id: Some(3), pooling_type: Some(PoolingType::Step), ..Default::default() }.check().is_ok());
    }
}
