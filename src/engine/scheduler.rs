//! The model thread: forms batches from queued inputs and runs the backbone (or the vision
//! tower) over them; the head runner ([`crate::pooling::head_runner`]) turns its hidden states
//! into answers.
//!
//! Every input is one [`Job`] with its own reply channel. The thread drains whatever has
//! arrived and forms a batch in which the waiting requests take turns ([`take_batch`]): each
//! adds its oldest input that fits the token budget and sequence cap, round after round, so a
//! one-text request behind a 2,048-input one runs in the next batch rather than after it. It
//! runs the batch as one flat, padding-free batch (mixing lengths costs nothing, so nothing is
//! sorted by length) and answers each job. Jobs whose client has gone (reply receiver dropped)
//! are skipped before they reach the model.

use super::batch_budget::BatchBudget;
use super::EngineError;
use crate::engine::params::ResolvedParams;
use crate::input::ModelInput;
use crate::kernels::lora::LoraWeights;
use crate::metrics;
use crate::models::batch::{Batch, TokenizedInput};
use crate::models::batch::{ImageGrid, SoftTokens};
use crate::models::gemma4_vision::ImagePatches;
use crate::models::{AudioTokenTower, Backbone, CropTokenTower, SoftTokenTower, VisionTower};
use crate::pooling::classifier::ClassifierHead;
use crate::pooling::head_runner::{HeadRunner, SequenceRequest};
use crate::pooling::method::HiddenStates;
use crate::pooling::PoolingOutput;
use candle_core::Device;
use candle_core::Tensor;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// What an image job's token accessor returns: images have no tokens.
static NO_TOKENS: TokenizedInput = TokenizedInput { ids: Vec::new(), type_ids: Vec::new() };

pub struct Job {
    /// The request the input belongs to: batches take turns between requests.
    pub request: u64,
    pub input: ModelInput,
    /// What the input costs in a batch's token budget: its tokens, or the sequence an image
    /// becomes in the vision tower.
    pub cost: usize,
    pub params: ResolvedParams,
    pub reply: oneshot::Sender<Result<(PoolingOutput, JobTiming), EngineError>>,
    /// When the job was queued (its queue time ends when its batch starts).
    pub enqueued: Instant,
    /// The LoRA adapter it runs with (`None`: the base model).
    pub adapter: Option<Arc<LoraWeights>>,
    /// The adapter's own classifier head (`modules_to_save`); `None`: the model's.
    pub classifier: Option<Arc<ClassifierHead>>,
}

/// A batch's jobs split in two, each with its index in the batch.
type IndexedJobs<'a> = (Vec<(usize, &'a Job)>, Vec<(usize, &'a Job)>);

impl Job {
    /// What this job asks of the heads.
    fn sequence_request(&self) -> SequenceRequest<'_> {
        let params = &self.params;
        SequenceRequest {
            labels: params.labels.as_deref(),
            task: params.task,
            dimensions: params.dimensions,
            activation: params.activation,
            late_chunk: params.late_chunk,
            ids: &self.tokens().ids,
            multi: params.multi,
            classifier: self.classifier.as_deref(),
        }
    }

    /// The text's tokens (none for an image a tower embeds alone; an image read as soft
    /// tokens has its text sequence).
    pub fn tokens(&self) -> &TokenizedInput {
        match &self.input {
            ModelInput::Text(t) => t,
            ModelInput::ImageSequence(image) => &image.tokens,
            ModelInput::Image(_) => &NO_TOKENS,
        }
    }
}

/// Where one input's time went on the model thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct JobTiming {
    pub queue: Duration,
    /// The whole forward batch the input ran in.
    pub inference: Duration,
}

/// Batch limits.
#[derive(Debug, Clone, Copy)]
pub struct BatchLimits {
    pub max_tokens: usize,
    pub max_seqs: usize,
    /// Most distinct LoRA adapters in one batch (`--max-loras`).
    pub max_loras: usize,
}

pub struct ModelThread {
    pub backbone: Box<dyn Backbone>,
    /// Pooling and the task heads, run on the backbone's output.
    pub heads: HeadRunner,
    pub limits: BatchLimits,
    /// Tokens per forward pass ([`crate::models::forward_chunk_tokens`]).
    pub chunk_tokens: usize,
    /// The served name, the `model` label of this thread's metrics.
    pub model: String,
    /// A one-thread pool of this model's own for small batches while another model computes
    /// ([`SOLO_TOKENS`]).
    pub solo: rayon::ThreadPool,
    /// Whether the backbone runs on the CPU (and so shares the compute pool).
    pub on_cpu: bool,
    /// The image tower of an image-text model.
    pub vision: Option<Box<dyn VisionTower>>,
    /// The image tower of a model that reads images as soft tokens in its text.
    pub soft_vision: Option<Box<dyn SoftTokenTower>>,
    /// The tower of a page retriever (ColPali), whose crops become soft tokens in the text.
    pub page_vision: Option<Box<dyn CropTokenTower>>,
    /// The audio tower of a model that reads audio as soft tokens in its text.
    pub soft_audio: Option<Box<dyn AudioTokenTower>>,
    /// How the next batch's token budget is set (time-sized on the CPU when others wait).
    pub budget: BatchBudget,
}

/// Batches of at most this many tokens run on the model's own thread while another model is
/// mid-batch, rather than queueing for the shared pool.
pub const SOLO_TOKENS: usize = 256;

/// Models running a batch right now, across the process.
static BUSY_MODELS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Counts this model as busy while alive; says whether another model already was.
struct BusyModel {
    others_busy: bool,
}

impl BusyModel {
    fn enter() -> Self {
        BusyModel { others_busy: BUSY_MODELS.fetch_add(1, std::sync::atomic::Ordering::SeqCst) > 0 }
    }
}

impl Drop for BusyModel {
    fn drop(&mut self) {
        BUSY_MODELS.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Removes the next batch from `pending`, taking turns between requests: in each round every
/// waiting request (oldest first) adds its oldest input that still fits the token budget, until
/// the batch is full or nothing else fits. A one-text request that arrives behind two
/// 1,024-input requests thus runs in the next batch instead of after all 2,048 inputs, while
/// big requests still fill batches when they are alone. The oldest job always runs, even alone
/// over the budget, and at most `max_loras` distinct adapters share a batch (the others' jobs
/// wait for the next). Jobs whose client disconnected are dropped here. Under
/// `--scheduling-policy priority` the requests of the lowest `priority` take turns first and
/// the others get what budget is left, in the same way, priority by priority.
fn take_batch(pending: &mut VecDeque<Job>, limits: BatchLimits) -> Vec<Job> {
    pending.retain(|job| !job.reply.is_closed());
    // Each request's candidate jobs (indices into `pending`, oldest first), requests by first
    // arrival.
    let mut requests: Vec<VecDeque<usize>> = Vec::new();
    let mut slot_of: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    for (i, job) in pending.iter().enumerate() {
        let slot = *slot_of.entry(job.request).or_insert_with(|| {
            requests.push(VecDeque::new());
            requests.len() - 1
        });
        requests[slot].push_back(i);
    }
    // Lower priorities first, each priority's requests in arrival order (a stable sort; under
    // fcfs every priority is 0). A priority's requests take turns; the next priority's get
    // what budget is left.
    requests.sort_by_key(|jobs| jobs.front().map_or(0, |&i| pending[i].params.priority));
    let mut chosen = Vec::new();
    let mut tokens = 0;
    let mut adapters: Vec<&Arc<LoraWeights>> = Vec::new();
    let mut groups =
        requests.chunk_by_mut(|a, b| a.front().map(|&i| pending[i].params.priority) == b.front().map(|&i| pending[i].params.priority));
    let mut group = groups.next().unwrap_or_default();
    'rounds: loop {
        let mut added = false;
        for jobs in group.iter_mut() {
            if chosen.len() >= limits.max_seqs {
                break 'rounds;
            }
            // The batch only grows: a job that does not fit now will not fit later in this
            // batch, so it leaves the candidates (each job is looked at once per batch).
            while let Some(&i) = jobs.front() {
                jobs.pop_front();
                let new_adapter = pending[i].adapter.as_ref().filter(|a| !adapters.iter().any(|b| Arc::ptr_eq(a, b)));
                if new_adapter.is_some() && adapters.len() >= limits.max_loras && !chosen.is_empty() {
                    continue;
                }
                if chosen.is_empty() || tokens + pending[i].cost <= limits.max_tokens {
                    adapters.extend(new_adapter);
                    tokens += pending[i].cost;
                    chosen.push(i);
                    added = true;
                    break;
                }
            }
        }
        if !added {
            match groups.next() {
                Some(next) => group = next,
                None => break,
            }
        }
    }
    let mut slots: Vec<Option<Job>> = pending.drain(..).map(Some).collect();
    let batch = chosen.iter().filter_map(|&i| slots[i].take()).collect();
    pending.extend(slots.into_iter().flatten());
    batch
}

/// The request number of [`crate::engine::Engine::stop_model_thread`]'s job (a test hook):
/// the model thread exits when it receives it, as it would after a fatal error.
#[cfg(any(test, feature = "test-hooks"))]
pub(crate) const STOP_REQUEST: u64 = u64::MAX;

impl ModelThread {
    /// Runs until every sender of `jobs` is gone (or a [`STOP_REQUEST`] job arrives).
    pub fn run(mut self, mut jobs: mpsc::UnboundedReceiver<Job>) {
        let mut pending: VecDeque<Job> = VecDeque::new();
        loop {
            if pending.is_empty() {
                match jobs.blocking_recv() {
                    Some(job) => pending.push_back(job),
                    None => return,
                }
            }
            while let Ok(job) = jobs.try_recv() {
                pending.push_back(job);
            }
            #[cfg(any(test, feature = "test-hooks"))]
            if pending.iter().any(|job| job.request == STOP_REQUEST) {
                return;
            }
            let before = pending.len();
            pending.retain(|job| !job.reply.is_closed());
            if pending.len() < before {
                metrics::inputs_cancelled(&self.model, before - pending.len());
            }
            let contended = pending.iter().any(|job| job.request != pending[0].request);
            let limits = BatchLimits { max_tokens: self.budget.max_tokens(self.limits.max_tokens, contended), ..self.limits };
            let batch = take_batch(&mut pending, limits);
            metrics::queue_depth(&self.model, pending.len());
            if batch.is_empty() {
                continue;
            }
            let started = Instant::now();
            let batch_tokens: usize = batch.iter().map(|j| j.cost).sum();
            // Only CPU models share the compute pool; a GPU model's batch leaves it free.
            let _busy = self.on_cpu.then(BusyModel::enter);
            // A small batch while another model's batch holds the shared pool runs on this
            // model's own thread: queued behind the other model's kernels, each of its ops
            // would wait for one of theirs (measured: a 16-token query went from 3.4 ms to 66 ms
            // beside a flooded model).
            let solo = _busy.as_ref().is_some_and(|b| b.others_busy) && batch_tokens <= SOLO_TOKENS;
            // A bug in model code must fail this batch, not kill the thread and hang everyone.
            let outcome =
                catch_unwind(AssertUnwindSafe(|| if solo { self.solo.install(|| self.execute(&batch)) } else { self.execute(&batch) }))
                    .unwrap_or_else(|_| Err(EngineError::Model("the model thread panicked while running a batch".into())));
            match outcome {
                Ok(outputs) => {
                    let inference = started.elapsed();
                    self.budget.observe(batch_tokens, inference);
                    let tokens = batch_tokens;
                    metrics::batch_ran(&self.model, batch.len(), tokens, inference, batch.iter().map(|j| started - j.enqueued));
                    for (job, out) in batch.into_iter().zip(outputs) {
                        let timing = JobTiming { queue: started - job.enqueued, inference };
                        let _ = job.reply.send(Ok((out, timing)));
                    }
                }
                Err(error) => {
                    tracing::error!(model = %self.model, "batch of {} inputs failed: {error}", batch.len());
                    for job in batch {
                        let _ = job.reply.send(Err(error.clone()));
                    }
                }
            }
        }
    }

    /// Forward passes, pooling and heads for one batch; outputs in job order. Texts and
    /// images run through their own towers.
    pub fn execute(&self, jobs: &[Job]) -> Result<Vec<PoolingOutput>, EngineError> {
        let (images, texts): IndexedJobs = jobs.iter().enumerate().partition(|(_, j)| matches!(j.input, ModelInput::Image(_)));
        if images.is_empty() {
            return self.execute_texts(&jobs.iter().collect::<Vec<_>>());
        }
        let mut outputs: Vec<Option<PoolingOutput>> = vec![None; jobs.len()];
        if !texts.is_empty() {
            let done = self.execute_texts(&texts.iter().map(|(_, j)| *j).collect::<Vec<_>>())?;
            texts.iter().zip(done).for_each(|((i, _), out)| outputs[*i] = Some(out));
        }
        let done = self.execute_images(&images.iter().map(|(_, j)| *j).collect::<Vec<_>>())?;
        images.iter().zip(done).for_each(|((i, _), out)| outputs[*i] = Some(out));
        outputs.into_iter().map(|o| o.ok_or_else(|| EngineError::Model("an input got no output".into()))).collect()
    }

    /// Image embeddings: one dense pass of the vision tower over every image of the batch.
    fn execute_images(&self, jobs: &[&Job]) -> Result<Vec<PoolingOutput>, EngineError> {
        let tower = self.vision.as_ref().ok_or_else(|| EngineError::Model("this model takes no images".into()))?;
        let mut pixels = Vec::new();
        for job in jobs {
            if let ModelInput::Image(crop) = &job.input {
                crop.normalized_into(&mut pixels);
            }
        }
        let embeddings = crate::models::forward_images_chunked(tower.as_ref(), &pixels, jobs.len(), self.chunk_tokens)
            .and_then(|e| e.to_device(&Device::Cpu))
            .and_then(|e| e.to_vec2::<f32>())
            .map_err(model_failure)?;
        let requests: Vec<SequenceRequest> = jobs.iter().map(|job| job.sequence_request()).collect();
        Ok(self.heads.images(embeddings, &requests))
    }

    /// Text forward pass, then the heads; outputs in job order.
    fn execute_texts(&self, jobs: &[&Job]) -> Result<Vec<PoolingOutput>, EngineError> {
        let mut batch = Batch::from_inputs(jobs.iter().map(|j| j.tokens()));
        if jobs.iter().any(|j| j.adapter.is_some()) {
            batch.adapters = jobs.iter().map(|j| j.adapter.clone()).collect();
        }
        let started = Instant::now();
        batch.soft_tokens = self.soft_tokens(jobs, &batch)?;
        let hidden = crate::models::forward_chunked(self.backbone.as_ref(), &batch, self.chunk_tokens).map_err(model_failure)?;
        // The timing breakdown (debug level) waits for the device, so that the forward pass's
        // time is its own and not the copy's.
        let timing = tracing::enabled!(tracing::Level::DEBUG);
        if timing {
            hidden.device().synchronize().map_err(model_failure)?;
        }
        let forward = started.elapsed();
        // To f32 where the states are, then one copy to the host: a GPU converts half precision
        // in one kernel, where the host would convert element by element (about 5 ms for
        // 5,900 tokens of BERT-base, on the model thread).
        let hidden = hidden
            .to_dtype(candle_core::DType::F32)
            .and_then(|h| h.to_device(&Device::Cpu))
            .and_then(|h| h.contiguous())
            .map_err(model_failure)?;
        let copied = started.elapsed();
        let (storage, layout) = hidden.storage_and_layout();
        let states =
            HiddenStates { data: host_rows(&storage, layout)?, hidden_size: self.backbone.hidden_size(), input_ids: &batch.input_ids };
        let requests: Vec<SequenceRequest> = jobs.iter().map(|job| job.sequence_request()).collect();
        let outputs = self.heads.texts(&states, batch.spans(), &requests).map_err(|e| EngineError::Model(e.to_string()));
        if timing {
            let heads = started.elapsed();
            tracing::debug!(
                model = %self.model,
                tokens = batch.num_tokens(),
                sequences = jobs.len(),
                "batch: forward {:.2?}, to host {:.2?}, heads {:.2?}",
                forward,
                copied - forward,
                heads - copied
            );
        }
        outputs
    }
}

impl ModelThread {
    /// The soft tokens of the batch's images, video frames and audio read as text
    /// ([`ModelInput::ImageSequence`]): one pass of each tower over all of its inputs, each
    /// row placed at its medium's next placeholder.
    fn soft_tokens(&self, jobs: &[&Job], batch: &Batch) -> Result<Option<SoftTokens>, EngineError> {
        let (mut images, mut frames, mut audio, mut sequences) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut crop_pixels, mut crops) = (Vec::new(), 0);
        let patches = |p: &crate::input::image::patches::Patches| ImagePatches { pixels: p.rescaled(), positions: p.positions.clone() };
        for (i, job) in jobs.iter().enumerate() {
            if let ModelInput::ImageSequence(media) = &job.input {
                sequences.push(i);
                images.extend(media.patches.iter().map(patches));
                frames.extend(media.video_frames.iter().map(patches));
                audio.extend(media.audio.iter().map(|a| (a.values.as_slice(), a.frames)));
                for crop in &media.crops {
                    crop.normalized_into(&mut crop_pixels);
                    crops += 1;
                }
            }
        }
        // (position in the batch, tower rows) of each medium's placeholders, in batch order.
        let placed = |placeholder: u32, rows: Tensor| -> Result<(Vec<usize>, Tensor), EngineError> {
            let mut positions = Vec::new();
            for &i in &sequences {
                let start = batch.cu_seqlens[i];
                positions.extend(jobs[i].tokens().ids.iter().enumerate().filter(|(_, &id)| id == placeholder).map(|(t, _)| start + t));
            }
            let count = rows.dim(0).map_err(model_failure)?;
            if count != positions.len() {
                return Err(EngineError::Model(format!("{count} soft tokens for {} placeholders", positions.len())));
            }
            Ok((positions, rows))
        };
        let (mut parts, mut grids) = (Vec::new(), Vec::new());
        if !images.is_empty() || !frames.is_empty() {
            // Images and video frames in one pass of the tower, then split at the images' rows.
            let tower = self.soft_vision.as_ref().ok_or_else(|| EngineError::Model("this model takes no images".into()))?;
            let rows = tower.forward(&images.iter().chain(&frames).collect::<Vec<_>>()).map_err(model_failure)?;
            let (_, kernel) = tower.patch_geometry();
            let image_rows: usize = images.iter().map(|p| p.positions.len() / (kernel * kernel).max(1)).sum();
            let total = rows.dim(0).map_err(model_failure)?;
            if image_rows > total {
                return Err(EngineError::Model(format!("{total} soft tokens for {image_rows} image placeholders")));
            }
            if !images.is_empty() {
                let (positions, rows) = placed(tower.image_tokens().placeholder, rows.narrow(0, 0, image_rows).map_err(model_failure)?)?;
                if tower.places_soft_tokens() {
                    grids = image_grids(&images, kernel, &positions)?;
                }
                parts.push((positions, rows));
            }
            if !frames.is_empty() {
                let video = tower.video_token().ok_or_else(|| EngineError::Model("this model takes no video".into()))?;
                parts.push(placed(video, rows.narrow(0, image_rows, total - image_rows).map_err(model_failure)?)?);
            }
        }
        if crops > 0 {
            let tower = self.page_vision.as_ref().ok_or_else(|| EngineError::Model("this model takes no page images".into()))?;
            let rows =
                crate::models::forward_crops_chunked(tower.as_ref(), &crop_pixels, crops, self.chunk_tokens).map_err(model_failure)?;
            parts.push(placed(tower.placeholder(), rows)?);
        }
        if !audio.is_empty() {
            let tower = self.soft_audio.as_ref().ok_or_else(|| EngineError::Model("this model takes no audio".into()))?;
            let rows = tower.forward(&audio).map_err(model_failure)?;
            parts.push(placed(tower.audio_tokens().placeholder, rows)?);
        }
        let soft = match parts.len() {
            0 => return Ok(None),
            1 => {
                let (positions, rows) = parts.swap_remove(0);
                SoftTokens::new(positions, rows).map_err(model_failure)?
            }
            _ => {
                // Several media: the rows in position order.
                let positions: Vec<usize> = parts.iter().flat_map(|(p, _)| p.iter().copied()).collect();
                let rows = Tensor::cat(&parts.iter().map(|(_, r)| r.clone()).collect::<Vec<_>>(), 0).map_err(model_failure)?;
                let mut order: Vec<u32> = (0..positions.len() as u32).collect();
                order.sort_by_key(|&i| positions[i as usize]);
                let index = Tensor::from_vec(order.clone(), order.len(), rows.device()).map_err(model_failure)?;
                let rows = rows.index_select(&index, 0).map_err(model_failure)?;
                let positions = order.iter().map(|&i| positions[i as usize]).collect();
                SoftTokens::new(positions, rows).map_err(model_failure)?
            }
        };
        let mut soft = soft;
        soft.grids = grids;
        Ok(Some(soft))
    }
}

/// Each image's soft tokens as a grid ([`ImageGrid`]): its patch grid over the kernel, from
/// where its first placeholder stands in the batch (`positions`: every image's placeholders,
/// in image order).
fn image_grids(images: &[ImagePatches], kernel: usize, positions: &[usize]) -> Result<Vec<ImageGrid>, EngineError> {
    let (mut grids, mut offset) = (Vec::with_capacity(images.len()), 0);
    for image in images {
        let side = |pick: fn(&(u32, u32)) -> u32| image.positions.iter().map(pick).max().map_or(0, |m| m as usize + 1) / kernel.max(1);
        let (rows, cols) = (side(|p| p.1), side(|p| p.0));
        let first = *positions.get(offset).ok_or_else(|| EngineError::Model("an image without placeholders".into()))?;
        grids.push(ImageGrid { first, rows, cols });
        offset += rows * cols;
    }
    Ok(grids)
}

/// The host rows of contiguous f32 hidden states, borrowed (no copy of the whole batch).
fn host_rows<'a>(storage: &'a candle_core::Storage, layout: &candle_core::Layout) -> Result<&'a [f32], EngineError> {
    let candle_core::Storage::Cpu(cpu) = storage else { return Err(EngineError::Model("hidden states are not on the host".into())) };
    let data = cpu.as_slice::<f32>().map_err(model_failure)?;
    let (start, end) = layout.contiguous_offsets().ok_or_else(|| EngineError::Model("hidden states are not contiguous".into()))?;
    data.get(start..end).ok_or_else(|| EngineError::Model("hidden states outside their storage".into()))
}

/// A forward pass's candle error as the batch's failure (its first line: no backtrace).
fn model_failure(e: candle_core::Error) -> EngineError {
    EngineError::Model(crate::models::describe(&e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pooling::Task;

    type Reply = oneshot::Receiver<Result<(PoolingOutput, JobTiming), EngineError>>;

    fn job(len: usize) -> (Job, Reply) {
        let (reply, rx) = oneshot::channel();
        let params = ResolvedParams::plain(Task::Embed);
        let input = ModelInput::Text(TokenizedInput { ids: vec![1; len], type_ids: vec![0; len] });
        (Job { request: 0, input, cost: len, params, reply, enqueued: Instant::now(), adapter: None, classifier: None }, rx)
    }

    #[test]
    fn requests_take_turns() {
        let limits = BatchLimits { max_tokens: 100, max_seqs: 4, max_loras: 1 };
        let mut pending = VecDeque::new();
        let mut receivers = Vec::new();
        // Two big requests queued before a one-input request.
        for (request, count) in [(1, 6), (2, 6), (3, 1)] {
            for _ in 0..count {
                let (mut j, rx) = job(5);
                j.request = request;
                pending.push_back(j);
                receivers.push(rx);
            }
        }
        let first = take_batch(&mut pending, limits);
        assert_eq!(first.iter().map(|j| j.request).collect::<Vec<_>>(), vec![1, 2, 3, 1]);
        let second = take_batch(&mut pending, limits);
        assert_eq!(second.iter().map(|j| j.request).collect::<Vec<_>>(), vec![1, 2, 1, 2]);
        assert_eq!(pending.len(), 5);
    }

    #[test]
    fn lower_priorities_go_first_and_equal_ones_take_turns() {
        let limits = BatchLimits { max_tokens: 100, max_seqs: 5, max_loras: 1 };
        let mut pending = VecDeque::new();
        let mut receivers = Vec::new();
        // (request, priority, inputs): a bulk request, then two urgent ones, then another bulk.
        for (request, priority, count) in [(1, 5, 4), (2, -1, 2), (3, -1, 2), (4, 5, 4)] {
            for _ in 0..count {
                let (mut j, rx) = job(5);
                j.request = request;
                j.params.priority = priority;
                pending.push_back(j);
                receivers.push(rx);
            }
        }
        let first = take_batch(&mut pending, limits);
        assert_eq!(first.iter().map(|j| j.request).collect::<Vec<_>>(), vec![2, 3, 2, 3, 1]);
        let second = take_batch(&mut pending, limits);
        assert_eq!(second.iter().map(|j| j.request).collect::<Vec<_>>(), vec![1, 4, 1, 4, 1]);
    }

    #[test]
    fn batches_oldest_first_within_budget() {
        let limits = BatchLimits { max_tokens: 10, max_seqs: 3, max_loras: 1 };
        let mut receivers = Vec::new();
        let mut pending = VecDeque::new();
        for len in [6, 6, 3, 1, 1] {
            let (j, rx) = job(len);
            pending.push_back(j);
            receivers.push(rx);
        }
        let lens = |b: &Vec<Job>| b.iter().map(|j| j.cost).collect::<Vec<_>>();
        let first = take_batch(&mut pending, limits);
        assert_eq!(lens(&first), vec![6, 3, 1]); // the second 6 does not fit; smaller ones do
        let second = take_batch(&mut pending, limits);
        assert_eq!(lens(&second), vec![6, 1]); // the skipped job leads the next batch
        assert!(pending.is_empty());
    }

    #[test]
    fn oversized_first_job_still_runs_and_cancelled_jobs_are_dropped() {
        let limits = BatchLimits { max_tokens: 4, max_seqs: 8, max_loras: 1 };
        let (a, rx_a) = job(3);
        let (b, rx_b) = job(9);
        drop(rx_a); // client went away
        let mut pending: VecDeque<Job> = [a, b].into_iter().collect();
        let batch = take_batch(&mut pending, limits);
        assert_eq!(batch.len(), 1);
        assert_eq!(batch[0].cost, 9);
        drop(rx_b);
    }
}
