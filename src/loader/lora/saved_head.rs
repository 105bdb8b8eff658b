//! An adapter's own classifier head (`modules_to_save`): the model's head recipe rebuilt over
//! the base weights with the adapter's saved ones in their place, refusing saved weights the
//! head does not read (the backbone is shared by every adapter of a batch).

use crate::loader::LoadError;
use crate::models::ModelError;
use crate::pooling::classifier::ClassifierHead;
use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::VarBuilder;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

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
    pub(super) fn with_saved(&self, saved: HashMap<String, Tensor>) -> Result<ClassifierHead, LoadError> {
        let names: BTreeSet<String> = saved.keys().cloned().collect();
        let overlay = Arc::new(SavedWeights { saved, base: self.base.clone(), read: Mutex::default() });
        let vb = VarBuilder::from_backend(Box::new(SharedSaved(Arc::clone(&overlay))), self.base.dtype(), self.base.device().clone());
        let head = (self.build)(vb)
            .map_err(|e| LoadError::Adapter(format!("its modules_to_save do not fit this model's classifier head: {e}")))?;
        let read = overlay.read.lock().unwrap_or_else(|e| e.into_inner());
        let unread: Vec<&String> = names.difference(&read).collect();
        if !unread.is_empty() {
            return Err(LoadError::Adapter(format!(
                "modules_to_save replaces {unread:?}, outside the classifier head: not supported (the backbone is shared by every adapter of a batch)"
            )));
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
            Some(tensor) => crate::loader::mapped::with_shape(tensor?, shape, name),
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
