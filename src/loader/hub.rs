//! Where model files come from: a local folder, or a Hugging Face hub id resolved through
//! hf-hub (its cache first; with `HF_HUB_OFFLINE=1` the cache only).
//!
//! The hub is `HF_ENDPOINT` when set (mirrors, proxies; hf-hub reads it), and its token, as
//! TEI and huggingface_hub look for one: `--hf-token`, then `HF_TOKEN` (then the older
//! `HUGGING_FACE_HUB_TOKEN`), then the token file `$HF_HOME/token`. A gated or private model
//! that the hub refuses is one line naming `HF_TOKEN`; the token itself is never printed.

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
        /// The hub id, for error lines.
        model: String,
        token_sent: bool,
    },
    /// Hub cache only (offline).
    Cache(hf_hub::CacheRepo),
}

/// A hub access token. Its `Debug` hides it, so that no log or error line can carry it.
#[derive(Clone, PartialEq, Eq)]
pub struct HubToken(String);

impl HubToken {
    /// `None` for an empty or blank value (an unset secret often arrives as an empty variable).
    pub fn new(token: &str) -> Option<Self> {
        let token = token.trim();
        (!token.is_empty()).then(|| HubToken(token.to_string()))
    }

    /// The explicit token, else the environment's (`HF_TOKEN`, then `HUGGING_FACE_HUB_TOKEN`);
    /// `None` leaves hf-hub to read the token file.
    fn or_from_env(explicit: Option<&HubToken>) -> Option<HubToken> {
        explicit.cloned().or_else(|| {
            ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"].iter().find_map(|name| std::env::var(name).ok().and_then(|v| HubToken::new(&v)))
        })
    }
}

impl std::fmt::Debug for HubToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HubToken(<hidden>)")
    }
}

/// The hub's refusal in words a user can act on: 401 and 403 say the model is gated or private
/// and how a token is passed; anything else is hf-hub's message.
fn hub_refusal(model: &str, error: &hf_hub::api::sync::ApiError, token_sent: bool) -> String {
    use hf_hub::api::sync::ApiError;
    let status = match error {
        ApiError::RequestError(e) => match e.as_ref() {
            ureq::Error::Status(code, _) => Some(*code),
            ureq::Error::Transport(_) => None,
        },
        ApiError::TooManyRetries(inner) => return hub_refusal(model, inner, token_sent),
        _ => None,
    };
    match (status, token_sent) {
        (Some(401), false) => format!(
            "`{model}` is gated or private on the Hugging Face hub (HTTP 401, no token sent): pass a read token of an account with access in HF_TOKEN (or --hf-token)"
        ),
        (Some(401), true) => format!(
            "the Hugging Face hub refused the token for `{model}` (HTTP 401): HF_TOKEN (or --hf-token, or $HF_HOME/token) must be a valid read token of an account with access"
        ),
        (Some(403), _) => format!(
            "`{model}` is gated on the Hugging Face hub and the token's account has no access (HTTP 403): accept its conditions on the model's page with that account, or pass another token in HF_TOKEN"
        ),
        _ => format!("cannot fetch `{model}` from the hub: {error}"),
    }
}

/// 401 or 403: the hub answered, and refused (a cached copy must not hide that from the log).
fn is_refusal(error: &hf_hub::api::sync::ApiError) -> bool {
    use hf_hub::api::sync::ApiError;
    match error {
        ApiError::RequestError(e) => matches!(e.as_ref(), ureq::Error::Status(401 | 403, _)),
        ApiError::TooManyRetries(inner) => is_refusal(inner),
        _ => false,
    }
}

fn hub_offline() -> bool {
    matches!(std::env::var("HF_HUB_OFFLINE").as_deref(), Ok("1") | Ok("true") | Ok("TRUE") | Ok("yes"))
}

impl ModelSource {
    /// Resolves the `MODEL` argument: an existing folder wins, anything else is a hub id.
    /// `token`: `--hf-token`'s (see [`HubToken::or_from_env`] for the rest of the search).
    pub fn resolve(model: &str, revision: Option<&str>, token: Option<&HubToken>) -> Result<Self, LoadError> {
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
        let mut builder = ApiBuilder::from_env().with_progress(false);
        let explicit = HubToken::or_from_env(token);
        // hf-hub's builder holds the file's token when no other was given.
        let token_sent = explicit.is_some() || Cache::from_env().token().is_some();
        if let Some(HubToken(token)) = explicit {
            builder = builder.with_token(Some(token));
        }
        let api = builder.build().map_err(|e| LoadError::Hub(e.to_string()))?.repo(repo);
        match api.info() {
            Ok(info) => {
                let files = info.siblings.into_iter().map(|s| s.rfilename).collect();
                Ok(Self::Hub { repo: api, files, model: model.to_string(), token_sent })
            }
            // Unreachable or refusing hub: a complete cached copy still serves.
            Err(e) => match cached.get("config.json") {
                Some(_) => {
                    let why = if is_refusal(&e) { hub_refusal(model, &e, token_sent) } else { format!("hub unreachable ({e})") };
                    tracing::warn!("{why}; using the cached copy of {model}");
                    Ok(Self::Cache(cached))
                }
                None => Err(LoadError::Hub(hub_refusal(model, &e, token_sent))),
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
            Self::Hub { repo, files, model, token_sent } => {
                if !files.contains(name) {
                    return Ok(None);
                }
                // Progress in the logs, one line per file (a terminal progress bar would only
                // garble a container's log stream).
                tracing::info!("fetching {name} from the hub (or its cache)");
                let started = std::time::Instant::now();
                // Gated repositories list their files to anyone and refuse the downloads.
                let path = repo.get(name).map_err(|e| {
                    LoadError::Hub(if is_refusal(&e) { hub_refusal(model, &e, *token_sent) } else { format!("downloading {name}: {e}") })
                })?;
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
        let source = ModelSource::resolve(dir.to_str().unwrap(), None, None).unwrap();
        assert!(source.file("config.json").unwrap().is_some());
        assert!(source.file("modules.json").unwrap().is_none());
        assert!(source.required("tokenizer.json").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn tokens_never_print() {
        let token = HubToken::new("  hf_secret123 \n").unwrap();
        assert_eq!(token, HubToken("hf_secret123".into()));
        assert!(!format!("{token:?}").contains("secret"));
        assert!(HubToken::new(" ").is_none());
    }

    #[test]
    fn missing_path_is_a_clear_error() {
        let err = ModelSource::resolve("./no/such/model", None, None).err().unwrap();
        assert!(err.to_string().contains("does not exist"));
    }
}
