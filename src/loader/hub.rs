//! Where model files come from: a local folder, or a Hugging Face hub id resolved through
//! hf-hub (its cache first; with `HF_HUB_OFFLINE=1` the cache only).

use super::LoadError;
use hf_hub::{api::sync::ApiBuilder, Cache, Repo, RepoType};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// A model's files, wherever they live.
// One value per model load: the hub variant's size costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub enum ModelSource {
    Local(PathBuf),
    /// Hub repository: `files` lists what the repository holds; `get` downloads on demand.
    Hub {
        repo: hf_hub::api::sync::ApiRepo,
        files: HashSet<String>,
    },
    /// Hub cache only (offline).
    Cache(hf_hub::CacheRepo),
}

fn hub_offline() -> bool {
    matches!(std::env::var("HF_HUB_OFFLINE").as_deref(), Ok("1") | Ok("true") | Ok("TRUE") | Ok("yes"))
}

impl ModelSource {
    /// Resolves the `MODEL` argument: an existing folder wins, anything else is a hub id.
    pub fn resolve(model: &str, revision: Option<&str>) -> Result<Self, LoadError> {
        let path = Path::new(model);
        if path.is_dir() {
            return Ok(Self::Local(path.to_path_buf()));
        }
        if path.exists() || model.starts_with('/') || model.starts_with('.') || model.matches('/').count() > 1 {
            return Err(LoadError::NotFound(format!("model folder `{model}` does not exist")));
        }
        let revision = revision.unwrap_or("main").to_string();
        let repo = Repo::with_revision(model.to_string(), RepoType::Model, revision);
        let cached = Cache::from_env().repo(repo.clone());
        if hub_offline() {
            return match cached.get("config.json") {
                Some(_) => Ok(Self::Cache(cached)),
                None => {
                    Err(LoadError::NotFound(format!("`{model}` is not a local folder and is not in the hub cache (HF_HUB_OFFLINE is set)")))
                }
            };
        }
        let api = ApiBuilder::from_env().with_progress(false).build().map_err(|e| LoadError::Hub(e.to_string()))?.repo(repo);
        match api.info() {
            Ok(info) => {
                let files = info.siblings.into_iter().map(|s| s.rfilename).collect();
                Ok(Self::Hub { repo: api, files })
            }
            // Unreachable hub: a complete cached copy still serves.
            Err(e) => match cached.get("config.json") {
                Some(_) => {
                    tracing::warn!("hub unreachable ({e}); using the cached copy of {model}");
                    Ok(Self::Cache(cached))
                }
                None => Err(LoadError::Hub(format!("cannot fetch `{model}` from the hub: {e}"))),
            },
        }
    }

    /// Path of `name` (relative to the model root), or `None` when the model has no such file.
    pub fn file(&self, name: &str) -> Result<Option<PathBuf>, LoadError> {
        match self {
            Self::Local(root) => {
                let p = root.join(name);
                Ok(p.is_file().then_some(p))
            }
            Self::Cache(cache) => Ok(cache.get(name)),
            Self::Hub { repo, files } => {
                if !files.contains(name) {
                    return Ok(None);
                }
                // Progress in the logs, one line per file (a terminal progress bar would only
                // garble a container's log stream).
                tracing::info!("fetching {name} from the hub (or its cache)");
                let started = std::time::Instant::now();
                let path = repo.get(name).map_err(|e| LoadError::Hub(format!("downloading {name}: {e}")))?;
                let mib = std::fs::metadata(&path).map(|m| m.len() as f64 / (1 << 20) as f64).unwrap_or(0.0);
                tracing::info!("{name}: {mib:.1} MiB ready in {:.1?}", started.elapsed());
                Ok(Some(path))
            }
        }
    }

    /// Like [`Self::file`], for files the model cannot do without.
    pub fn required(&self, name: &str) -> Result<PathBuf, LoadError> {
        self.file(name)?.ok_or_else(|| LoadError::NotFound(format!("the model has no {name}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_folder_files() {
        let dir = std::env::temp_dir().join(format!("poolserve-hub-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), "{}").unwrap();
        let source = ModelSource::resolve(dir.to_str().unwrap(), None).unwrap();
        assert!(source.file("config.json").unwrap().is_some());
        assert!(source.file("modules.json").unwrap().is_none());
        assert!(source.required("tokenizer.json").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_path_is_a_clear_error() {
        let err = ModelSource::resolve("./no/such/model", None).err().unwrap();
        assert!(err.to_string().contains("does not exist"));
    }
}
