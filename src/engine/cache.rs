//! The output cache (`--cache-size`, `--cache-dir`): a model's pooled outputs kept by what
//! decides them, so that an input run again (a re-indexing job, a repeated query) skips the
//! model. Off unless `--cache-size` is set.
//!
//! The key is a SHA-256 of everything that decides an output besides the model itself (one
//! cache per model): the token ids and segment ids as the model sees them (so the prompt,
//! truncation, special tokens and padding are in it), the task and the parameters that act on
//! the output (`dimensions`, activation or normalization, late chunking, BGE-M3's outputs),
//! the LoRA adapter (by its load, so an adapter replaced in place never answers from its
//! predecessor), and vLLM's `cache_salt`. A salted request only meets entries made with the
//! same salt, so a tenant cannot learn by timing what another tenant embedded. A cryptographic
//! hash, because a collision would be a wrong answer that nobody could tell from a right one.
//!
//! Bounded by bytes (the outputs' floats and a fixed overhead per entry), least recently used
//! out first; an output larger than an eighth of the budget is not kept. Text inputs only:
//! images, audio and video run every time. Generative scores (`label_token_ids`) are not kept
//! either: their key would be as long as their label lists.
//!
//! With `--cache-dir`, the entries of base-model requests are also appended to a file per
//! model there (named by [`CacheOptions::file_for`] from the model's identity: its options,
//! files and this build's version, so a changed model or binary never reads old outputs) and
//! read back at the next start. The file stops growing at twice the budget and is rewritten
//! from what was read at the next start. A torn last record (a crash mid-write) is dropped.

use crate::engine::params::ResolvedParams;
use crate::input::ModelInput;
use crate::pooling::m3::MultiVectors;
use crate::pooling::PoolingOutput;
use sha2::{Digest, Sha256};
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// What identifies an output: a SHA-256.
pub type Key = [u8; 32];

/// Bytes counted for an entry beyond its floats: the key, the map's slot and list links, the
/// output's allocation headers.
const ENTRY_OVERHEAD: usize = 128;

/// The file format's first bytes (a changed format is a new name, never a misread).
const MAGIC: &[u8; 8] = b"PSCACHE1";

/// `--cache-size` and `--cache-dir`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CacheOptions {
    /// The budget in bytes; 0 turns the cache off.
    pub bytes: usize,
    /// Where entries persist across restarts.
    pub dir: Option<PathBuf>,
}

impl CacheOptions {
    /// The file of the model `identity` describes, in `dir`.
    pub fn file_for(dir: &Path, identity: &str) -> PathBuf {
        let digest = Sha256::new().chain_update(env!("CARGO_PKG_VERSION")).chain_update([0]).chain_update(identity).finalize();
        let name: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
        dir.join(format!("{name}.cache"))
    }
}

struct Store {
    entries: lru::LruCache<Key, Arc<PoolingOutput>>,
    bytes: usize,
}

/// The file entries are appended to, and how far it may grow.
struct Persisted {
    writer: BufWriter<std::fs::File>,
    len: u64,
    max_len: u64,
}

impl Persisted {
    /// A write failed: the file takes no more entries (they stay in memory).
    fn fail(&mut self, e: std::io::Error) {
        tracing::warn!("output cache: cannot append to its file ({e}); entries stay in memory only");
        self.len = self.max_len;
    }
}

/// One model's output cache.
pub struct OutputCache {
    store: Mutex<Store>,
    budget: usize,
    file: Option<Mutex<Persisted>>,
    model: String,
}

impl OutputCache {
    /// A cache of `options.bytes` for `model` (its served name, for the metrics), reading back
    /// its file in `options.dir` when there is one. `None` when the budget is 0.
    pub fn open(options: &CacheOptions, model: &str, identity: &str) -> std::io::Result<Option<Self>> {
        if options.bytes == 0 {
            return Ok(None);
        }
        let cache = OutputCache {
            store: Mutex::new(Store { entries: lru::LruCache::unbounded(), bytes: 0 }),
            budget: options.bytes,
            file: None,
            model: model.to_string(),
        };
        let Some(dir) = &options.dir else {
            cache.report();
            return Ok(Some(cache));
        };
        std::fs::create_dir_all(dir)?;
        let path = CacheOptions::file_for(dir, identity);
        let read = read_file(&path).unwrap_or_default();
        for (key, output) in read {
            cache.keep(key, Arc::new(output));
        }
        // Rewrite what was kept (oldest first, so that the next start sees the same order).
        let temporary = path.with_extension("tmp");
        let mut writer = BufWriter::new(std::fs::File::create(&temporary)?);
        writer.write_all(MAGIC)?;
        let mut len = MAGIC.len() as u64;
        {
            let store = cache.lock();
            for (key, output) in store.entries.iter().rev() {
                len += write_record(&mut writer, key, output)?;
            }
        }
        writer.flush()?;
        std::fs::rename(&temporary, &path)?;
        let file = std::fs::OpenOptions::new().append(true).open(&path)?;
        let entries = cache.lock().entries.len();
        tracing::info!("output cache: {entries} entries read back from {}", path.display());
        cache.report();
        Ok(Some(OutputCache {
            file: Some(Mutex::new(Persisted { writer: BufWriter::new(file), len, max_len: 2 * options.bytes as u64 })),
            ..cache
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The key of `input` run with `params` (and the adapter loaded as `adapter`); `None` for
    /// what is not kept.
    pub fn key(input: &ModelInput, params: &ResolvedParams, adapter: Option<u64>) -> Option<Key> {
        let ModelInput::Text(text) = input else { return None };
        // A plugin's compound task (token weights beside the dense vector) is not kept: the
        // file's records have no place for it.
        if params.labels.is_some() || !params.use_cache || params.multi.is_some_and(|m| m.token_weights) {
            return None;
        }
        let mut hash = Sha256::new();
        let mut field = |bytes: &[u8]| {
            hash.update((bytes.len() as u64).to_le_bytes());
            hash.update(bytes);
        };
        field(params.task.as_str().as_bytes());
        field(&params.dimensions.map_or(u64::MAX, |d| d as u64).to_le_bytes());
        field(&[params.activation as u8, params.pad_to_max_length as u8]);
        field(&params.late_chunk.map_or(u64::MAX, |c| c as u64).to_le_bytes());
        let multi = params.multi.map_or([2; 3], |m| [m.dense as u8, m.sparse as u8, m.colbert as u8]);
        field(&multi);
        let hybrid: Vec<u8> = params.hybrid.iter().flatten().flat_map(|w| w.to_le_bytes()).collect();
        field(&hybrid);
        field(&adapter.map_or(u64::MAX, |a| a).to_le_bytes());
        // `None` and every salt differ: a salt is at least one character, and the flag byte
        // comes first.
        match params.cache_salt.as_deref() {
            Some(salt) => field(&[&[1u8], salt.as_bytes()].concat()),
            None => field(&[0]),
        }
        let ids: Vec<u8> = text.ids.iter().flat_map(|i| i.to_le_bytes()).collect();
        field(&ids);
        let type_ids: Vec<u8> = text.type_ids.iter().flat_map(|i| i.to_le_bytes()).collect();
        field(&type_ids);
        Some(hash.finalize().into())
    }

    /// The output kept for `key`, if any.
    pub fn get(&self, key: &Key) -> Option<PoolingOutput> {
        self.lock().entries.get(key).map(|o| PoolingOutput::clone(o))
    }

    /// Keeps `output` for `key`; `persist`: also in the model's file (base-model entries),
    /// buffered until [`Self::finish`].
    pub fn insert(&self, key: Key, output: &PoolingOutput, persist: bool) {
        let output = Arc::new(output.clone());
        if !self.keep(key, output.clone()) {
            return;
        }
        if let (true, Some(file)) = (persist, &self.file) {
            let mut file = file.lock().unwrap_or_else(|e| e.into_inner());
            if file.len >= file.max_len {
                return;
            }
            match write_record(&mut file.writer, &key, &output) {
                Ok(n) => file.len += n,
                Err(e) => file.fail(e),
            }
        }
    }

    /// After a request's inserts: the file written through (one write for the request, not one
    /// per input) and the size reported to /metrics.
    pub fn finish(&self) {
        if let Some(file) = &self.file {
            let mut file = file.lock().unwrap_or_else(|e| e.into_inner());
            if let Err(e) = file.writer.flush() {
                file.fail(e);
            }
        }
        self.report();
    }

    /// Keeps an entry in memory, evicting the least recently used ones over the budget.
    /// `false` when it was not kept (too large, or already there).
    fn keep(&self, key: Key, output: Arc<PoolingOutput>) -> bool {
        let size = entry_bytes(&output);
        if size > self.budget / 8 {
            return false;
        }
        let mut store = self.lock();
        if store.entries.contains(&key) {
            return false;
        }
        store.entries.put(key, output);
        store.bytes += size;
        while store.bytes > self.budget {
            match store.entries.pop_lru() {
                Some((_, old)) => store.bytes -= entry_bytes(&old),
                None => break,
            }
        }
        true
    }

    fn report(&self) {
        let (entries, bytes) = {
            let store = self.lock();
            (store.entries.len(), store.bytes)
        };
        crate::metrics::cache_size(&self.model, entries, bytes);
    }
}

/// One request's inputs against the cache: the outputs found, then those that ran (kept as
/// they come), in the inputs' order.
pub(super) struct Lookup<'a> {
    cache: Option<&'a OutputCache>,
    keys: Vec<Option<Key>>,
    outputs: Vec<Option<PoolingOutput>>,
    /// Base-model outputs persist; an adapter's stay in memory (its serial is this process's).
    persist: bool,
}

impl<'a> Lookup<'a> {
    pub fn new(cache: Option<&'a OutputCache>, inputs: &[ModelInput], params: &ResolvedParams, adapter: Option<u64>) -> Self {
        let keys: Vec<Option<Key>> = match cache {
            Some(_) => inputs.iter().map(|input| OutputCache::key(input, params, adapter)).collect(),
            None => vec![None; inputs.len()],
        };
        let outputs: Vec<Option<PoolingOutput>> =
            keys.iter().map(|key| cache.zip(key.as_ref()).and_then(|(cache, key)| cache.get(key))).collect();
        if let Some(cache) = cache {
            let asked = keys.iter().flatten().count();
            let hits = outputs.iter().flatten().count();
            crate::metrics::cache_lookups(&cache.model, hits, asked - hits);
        }
        Lookup { cache, keys, outputs, persist: adapter.is_none() }
    }

    /// Whether input `index` was found (it need not run).
    pub fn found(&self, index: usize) -> bool {
        self.outputs[index].is_some()
    }

    /// Input `index` ran and gave `output`.
    pub fn ran(&mut self, index: usize, output: PoolingOutput) {
        if let (Some(cache), Some(key)) = (self.cache, &self.keys[index]) {
            cache.insert(*key, &output, self.persist);
        }
        self.outputs[index] = Some(output);
    }

    /// Every input's output, in order (each was found or ran).
    pub fn outputs(mut self) -> Vec<PoolingOutput> {
        std::mem::take(&mut self.outputs).into_iter().flatten().collect()
    }
}

impl Drop for Lookup<'_> {
    /// Once per request, whether it ended in outputs or an error.
    fn drop(&mut self) {
        if let Some(cache) = self.cache {
            cache.finish();
        }
    }
}

/// The bytes an entry is counted for.
fn entry_bytes(output: &PoolingOutput) -> usize {
    let floats = match output {
        PoolingOutput::Vector(v) => v.len(),
        PoolingOutput::Tokens(rows) => rows.iter().map(|r| r.len() + 6).sum(),
        PoolingOutput::Sparse(weights) => 2 * weights.len(),
        PoolingOutput::Multi(m) => {
            m.dense.as_ref().map_or(0, Vec::len)
                + 2 * m.sparse.as_ref().map_or(0, Vec::len)
                + m.colbert.as_ref().map_or(0, |c| c.iter().map(|r| r.len() + 6).sum())
        }
    };
    ENTRY_OVERHEAD + 4 * floats
}

// --- The file: MAGIC, then records of the key, the output's kind (one byte) and its body
// (little-endian u32 counts and f32 values).

fn write_record(w: &mut impl Write, key: &Key, output: &PoolingOutput) -> std::io::Result<u64> {
    let mut body = Vec::new();
    let (kind, ()) = match output {
        PoolingOutput::Vector(v) => (0u8, floats(&mut body, v)),
        PoolingOutput::Tokens(rows) => (1, rows_of(&mut body, rows)),
        PoolingOutput::Sparse(weights) => (2, sparse(&mut body, weights)),
        PoolingOutput::Multi(m) => {
            let flags = [m.dense.is_some(), m.sparse.is_some(), m.colbert.is_some()];
            body.extend(flags.map(u8::from));
            m.dense.iter().for_each(|d| floats(&mut body, d));
            m.sparse.iter().for_each(|s| sparse(&mut body, s));
            m.colbert.iter().for_each(|c| rows_of(&mut body, c));
            (3, ())
        }
    };
    w.write_all(key)?;
    w.write_all(&[kind])?;
    w.write_all(&(body.len() as u32).to_le_bytes())?;
    w.write_all(&body)?;
    Ok((key.len() + 5 + body.len()) as u64)
}

fn floats(body: &mut Vec<u8>, values: &[f32]) {
    body.extend((values.len() as u32).to_le_bytes());
    values.iter().for_each(|v| body.extend(v.to_le_bytes()));
}

fn rows_of(body: &mut Vec<u8>, rows: &[Vec<f32>]) {
    body.extend((rows.len() as u32).to_le_bytes());
    rows.iter().for_each(|r| floats(body, r));
}

fn sparse(body: &mut Vec<u8>, weights: &[(u32, f32)]) {
    body.extend((weights.len() as u32).to_le_bytes());
    weights.iter().for_each(|(i, w)| {
        body.extend(i.to_le_bytes());
        body.extend(w.to_le_bytes());
    });
}

/// Every whole record of the file at `path` (none when it is missing or not ours).
fn read_file(path: &Path) -> std::io::Result<Vec<(Key, PoolingOutput)>> {
    let mut r = BufReader::new(std::fs::File::open(path)?);
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic)?;
    if &magic != MAGIC {
        return Ok(Vec::new());
    }
    let mut records = Vec::new();
    loop {
        let mut head = [0u8; 37];
        if r.read_exact(&mut head).is_err() {
            break;
        }
        let len = u32::from_le_bytes([head[33], head[34], head[35], head[36]]) as usize;
        let mut body = vec![0u8; len];
        if r.read_exact(&mut body).is_err() {
            break; // a torn last record
        }
        let mut key = [0u8; 32];
        key.copy_from_slice(&head[..32]);
        match parse(head[32], &body) {
            Some(output) => records.push((key, output)),
            None => break,
        }
    }
    Ok(records)
}

/// A record's body, read back; `None` when it does not parse whole.
fn parse(kind: u8, body: &[u8]) -> Option<PoolingOutput> {
    let mut at = Reader { body, at: 0 };
    let output = match kind {
        0 => PoolingOutput::Vector(at.floats()?),
        1 => PoolingOutput::Tokens(at.rows()?),
        2 => PoolingOutput::Sparse(at.sparse()?),
        3 => {
            let flags = at.take(3)?.to_vec();
            let dense = if flags[0] == 1 { Some(at.floats()?) } else { None };
            let sparse = if flags[1] == 1 { Some(at.sparse()?) } else { None };
            let colbert = if flags[2] == 1 { Some(at.rows()?) } else { None };
            PoolingOutput::Multi(MultiVectors { dense, sparse, colbert, token_weights: None })
        }
        _ => return None,
    };
    (at.at == body.len()).then_some(output)
}

struct Reader<'a> {
    body: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let bytes = self.body.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(bytes)
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn count(&mut self, item_bytes: usize) -> Option<usize> {
        let n = self.u32()? as usize;
        // A count the body cannot hold is a damaged record, not an allocation.
        (n.checked_mul(item_bytes)? <= self.body.len() - self.at).then_some(n)
    }

    fn floats(&mut self) -> Option<Vec<f32>> {
        let n = self.count(4)?;
        let bytes = self.take(4 * n)?;
        Some(bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
    }

    fn rows(&mut self) -> Option<Vec<Vec<f32>>> {
        let n = self.count(4)?;
        (0..n).map(|_| self.floats()).collect()
    }

    fn sparse(&mut self) -> Option<Vec<(u32, f32)>> {
        let n = self.count(8)?;
        (0..n).map(|_| Some((self.u32()?, f32::from_bits(self.u32()?)))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::batch::TokenizedInput;
    use crate::pooling::Task;

    fn text(ids: &[u32]) -> ModelInput {
        ModelInput::Text(TokenizedInput { ids: ids.to_vec(), type_ids: vec![0; ids.len()] })
    }

    fn every_shape() -> Vec<PoolingOutput> {
        vec![
            PoolingOutput::Vector(vec![1.0, -2.5, 3.25]),
            PoolingOutput::Tokens(vec![vec![0.5; 4], vec![], vec![-1.0; 2]]),
            PoolingOutput::Sparse(vec![(7, 0.25), (4_000_000, 1.5)]),
            PoolingOutput::Multi(MultiVectors {
                dense: Some(vec![1.0]),
                sparse: None,
                colbert: Some(vec![vec![2.0, 3.0]]),
                token_weights: None,
            }),
        ]
    }

    #[test]
    fn the_key_changes_with_everything_that_decides_an_output() {
        let params = ResolvedParams::plain(Task::Embed);
        let base = OutputCache::key(&text(&[1, 2, 3]), &params, None).unwrap();
        let salted = |s: &str| ResolvedParams { cache_salt: Some(s.into()), ..params.clone() };
        let variants = [
            OutputCache::key(&text(&[1, 2, 4]), &params, None),
            OutputCache::key(&text(&[1, 2]), &params, None),
            OutputCache::key(&text(&[1, 2, 3]), &ResolvedParams::plain(Task::TokenEmbed), None),
            OutputCache::key(&text(&[1, 2, 3]), &ResolvedParams { dimensions: Some(2), ..params.clone() }, None),
            OutputCache::key(&text(&[1, 2, 3]), &ResolvedParams { activation: false, ..params.clone() }, None),
            OutputCache::key(&text(&[1, 2, 3]), &ResolvedParams { late_chunk: Some(2), ..params.clone() }, None),
            OutputCache::key(&text(&[1, 2, 3]), &params, Some(0)),
            OutputCache::key(&text(&[1, 2, 3]), &salted("a"), None),
            OutputCache::key(&text(&[1, 2, 3]), &salted("b"), None),
            OutputCache::key(&ModelInput::Text(TokenizedInput { ids: vec![1, 2, 3], type_ids: vec![0, 1, 1] }), &params, None),
        ];
        let mut seen = vec![base];
        for v in variants {
            let v = v.unwrap();
            assert!(!seen.contains(&v));
            seen.push(v);
        }
        // What only orders the work does not change it.
        assert_eq!(OutputCache::key(&text(&[1, 2, 3]), &ResolvedParams { priority: 5, ..params.clone() }, None), Some(base));
        let labels = crate::pooling::next_token::LabelQuery::new(&[1], false);
        assert_eq!(OutputCache::key(&text(&[1]), &ResolvedParams { labels: Some(Arc::new(labels)), ..params.clone() }, None), None);
        assert_eq!(OutputCache::key(&text(&[1]), &ResolvedParams { use_cache: false, ..params }, None), None);
    }

    #[test]
    fn least_recently_used_entries_leave_first_within_the_budget() {
        let one = entry_bytes(&PoolingOutput::Vector(vec![0.0; 8]));
        let cache = OutputCache::open(&CacheOptions { bytes: 8 * one + one / 2, dir: None }, "test", "").unwrap().unwrap();
        let key = |i: u8| [i; 32];
        for i in 0..8 {
            cache.insert(key(i), &PoolingOutput::Vector(vec![i as f32; 8]), false);
        }
        assert!(cache.get(&key(0)).is_some()); // 0 is now the most recent
        cache.insert(key(8), &PoolingOutput::Vector(vec![8.0; 8]), false);
        assert!(cache.get(&key(1)).is_none(), "the least recently used entry left");
        assert_eq!(cache.get(&key(0)), Some(PoolingOutput::Vector(vec![0.0; 8])));
        assert!(cache.lock().bytes <= 8 * one + one / 2);
        // An output over an eighth of the budget is not kept.
        cache.insert(key(9), &PoolingOutput::Vector(vec![0.0; 1000]), false);
        assert!(cache.get(&key(9)).is_none());
    }

    #[test]
    fn entries_persist_across_opens_and_a_torn_record_is_dropped() {
        let dir = std::env::temp_dir().join(format!("poolserve-cache-test-{}", std::process::id()));
        let options = CacheOptions { bytes: 1 << 20, dir: Some(dir.clone()) };
        let cache = OutputCache::open(&options, "test", "model A").unwrap().unwrap();
        for (i, output) in every_shape().into_iter().enumerate() {
            cache.insert([i as u8; 32], &output, true);
        }
        cache.insert([9; 32], &PoolingOutput::Vector(vec![9.0]), false); // an adapter's: memory only
        cache.finish();
        drop(cache);
        let path = CacheOptions::file_for(&dir, "model A");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(&[5; 20]); // a torn record
        std::fs::write(&path, &bytes).unwrap();

        let again = OutputCache::open(&options, "test", "model A").unwrap().unwrap();
        for (i, output) in every_shape().into_iter().enumerate() {
            assert_eq!(again.get(&[i as u8; 32]), Some(output));
        }
        assert!(again.get(&[9; 32]).is_none());
        // Another model (or build) reads nothing of it.
        let other = OutputCache::open(&options, "test", "model B").unwrap().unwrap();
        assert!(other.get(&[0; 32]).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
