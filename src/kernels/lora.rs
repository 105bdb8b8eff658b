//! LoRA: low-rank additions to dense layers, chosen per sequence of a batch, so that requests
//! for different fine-tunes of one base model share its forward pass.
//!
//! A dense layer computes `y = x·Wᵀ + b`; a LoRA module adds `s·(x·Aᵀ)·Bᵀ` with `A` `[r, in]`
//! and `B` `[out, r]` as PEFT stores them (`s` = `lora_alpha / r`, or `/ √r` with rsLoRA). The
//! base product runs once over every token of the batch; then each run of consecutive
//! sequences that asked for one adapter (a [`Segment`]) adds its own two small products over
//! its rows, as S-LoRA and Punica's segmented kernels do, never a pass per adapter.
//!
//! Which adapter each token row belongs to reaches the layers through [`with_segments`], set by
//! `models::forward_chunked` around each backbone pass (as [`super::with_cpu_weight_format`]
//! scopes a load): the architectures' forward code does not change. A layer takes part when the
//! loader gave it a site number ([`super::Linear::set_lora_site`]); an adapter holds one
//! [`SiteProduct`] per site it reaches.

use super::sgemm::{PackedMatrix, WeightFormat};
use candle_core::{bail, DType, Device, Result, Tensor};
use std::cell::RefCell;
use std::sync::Arc;

/// A module of the checkpoint that a dense layer computes: its name (the weight's prefix,
/// `encoder.layer.0.attention.self.query`) and the output columns it fills. A fused Q/K/V layer
/// holds three; most layers one covering all outputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModulePart {
    pub name: String,
    pub offset: usize,
    pub len: usize,
}

/// One LoRA module's factors as PEFT saves them, in f32: `a` `[rank, in]`, `b` `[len, rank]`.
#[derive(Debug, Clone)]
pub struct LoraFactors {
    pub a: Vec<f32>,
    pub b: Vec<f32>,
    pub rank: usize,
    /// `lora_alpha / r` (or `/ √r` with rsLoRA), folded into `B` at load.
    pub scale: f32,
}

/// A dense layer adapters may reach: its modules and shape, and where its product runs.
#[derive(Debug, Clone)]
pub struct LoraSite {
    pub parts: Vec<ModulePart>,
    pub in_features: usize,
    /// Whether the layer runs on the CPU kernels (f32, bf16 or int8 weights); otherwise its
    /// adapters run as candle products on `device` in `dtype`.
    pub on_cpu_kernels: bool,
    pub device: Device,
    pub dtype: DType,
}

/// One module's product: `(x·Aᵀ)·(s·B)ᵀ` into output columns `offset..offset + len`.
#[derive(Debug)]
enum PartProduct {
    /// On the CPU kernels: `A` and `s·B` packed once, as the base weights are (f32).
    Packed { offset: usize, a: PackedMatrix, b: PackedMatrix },
    /// Elsewhere: `Aᵀ` `[in, r]` and `(s·B)ᵀ` `[r, len]` on the model's device.
    Tensors { offset: usize, a_t: Tensor, b_t: Tensor },
}

/// An adapter's addition to one site: a product per module it trained there.
#[derive(Debug)]
pub struct SiteProduct {
    parts: Vec<PartProduct>,
}

impl SiteProduct {
    /// The products of `factors` (each with the index of its part in `site.parts`).
    pub fn new(site: &LoraSite, factors: Vec<(usize, LoraFactors)>) -> Result<Self> {
        let mut parts = Vec::with_capacity(factors.len());
        for (index, f) in factors {
            let Some(part) = site.parts.get(index) else { bail!("LoRA: no module {index} on this layer") };
            if f.a.len() != f.rank * site.in_features || f.b.len() != f.rank * part.len {
                bail!(
                    "LoRA on `{}`: lora_A holds {} values and lora_B {}, expected [{}, {}] and [{}, {}]",
                    part.name,
                    f.a.len(),
                    f.b.len(),
                    f.rank,
                    site.in_features,
                    part.len,
                    f.rank
                );
            }
            let b: Vec<f32> = f.b.iter().map(|v| v * f.scale).collect();
            parts.push(if site.on_cpu_kernels {
                PartProduct::Packed {
                    offset: part.offset,
                    a: PackedMatrix::pack_out_in(WeightFormat::F32, &f.a, f.rank, site.in_features),
                    b: PackedMatrix::pack_out_in(WeightFormat::F32, &b, part.len, f.rank),
                }
            } else {
                let on_device = |v: Vec<f32>, rows: usize, cols: usize| -> Result<Tensor> {
                    Tensor::from_vec(v, (rows, cols), &Device::Cpu)?.t()?.to_dtype(site.dtype)?.to_device(&site.device)?.contiguous()
                };
                PartProduct::Tensors {
                    offset: part.offset,
                    a_t: on_device(f.a, f.rank, site.in_features)?,
                    b_t: on_device(b, part.len, f.rank)?,
                }
            });
        }
        Ok(Self { parts })
    }
}

/// LoRA on an embedding table (jina-embeddings-v3 adapts its word and token-type tables):
/// row `i` gains `s·A[i]·B`, with `A` `[rows, rank]` and `B` `[rank, width]` as the published
/// code stores them. Applied by the architecture to each looked-up row, never merged (a merged
/// table per adapter would be a copy of the vocabulary's embeddings).
#[derive(Debug)]
pub struct TableLora {
    /// The table's name in the checkpoint (`roberta.embeddings.word_embeddings`).
    pub table: String,
    a: Vec<f32>,
    /// `s·B`.
    b: Vec<f32>,
    rank: usize,
    width: usize,
}

impl TableLora {
    pub fn new(table: String, a: Vec<f32>, b: Vec<f32>, rank: usize, scale: f32) -> Result<Self> {
        if rank == 0 || !a.len().is_multiple_of(rank) || !b.len().is_multiple_of(rank) {
            bail!("LoRA on `{table}`: factors of {} and {} values do not have rank {rank}", a.len(), b.len());
        }
        let width = b.len() / rank;
        Ok(Self { table, a, b: b.into_iter().map(|v| v * scale).collect(), rank, width })
    }

    /// Adds row `row`'s delta to `out` (`width` values); rows past the table add nothing
    /// (the embedding lookup refuses them first).
    pub fn add_row(&self, row: usize, out: &mut [f32]) {
        let Some(a) = self.a.get(row * self.rank..(row + 1) * self.rank) else { return };
        for (k, &weight) in a.iter().enumerate() {
            let b = &self.b[k * self.width..(k + 1) * self.width];
            out.iter_mut().zip(b).for_each(|(o, v)| *o += weight * v);
        }
    }
}

/// An adapter's products on every site of one backbone (`None` where it trained nothing), and
/// its embedding-table deltas.
#[derive(Debug)]
pub struct LoraWeights {
    sites: Vec<Option<SiteProduct>>,
    tables: Vec<TableLora>,
}

impl LoraWeights {
    pub fn new(sites: Vec<Option<SiteProduct>>) -> Self {
        Self { sites, tables: Vec::new() }
    }

    /// The same adapter with deltas on embedding tables.
    pub fn with_tables(mut self, tables: Vec<TableLora>) -> Self {
        self.tables = tables;
        self
    }

    /// Its delta on the table `name`, if it trained one.
    pub fn table(&self, name: &str) -> Option<&TableLora> {
        self.tables.iter().find(|t| t.table == name)
    }

    fn site(&self, site: usize) -> Option<&SiteProduct> {
        self.sites.get(site).and_then(Option::as_ref)
    }
}

/// One of a model's built-in adapters (jina-embeddings-v3's tasks): its name, the prompt its
/// publisher prepends for it, and its weights.
#[derive(Debug)]
pub struct TaskAdapter {
    pub name: String,
    pub prompt: Option<String>,
    pub weights: LoraWeights,
    pub rank: usize,
    /// Floats held for it.
    pub floats: usize,
}

/// Consecutive token rows `start..end` of a pass that run one adapter.
#[derive(Debug, Clone)]
pub struct Segment {
    pub start: usize,
    pub end: usize,
    pub weights: Arc<LoraWeights>,
}

/// The segments of the pass running on this thread, and its token count.
struct Pass {
    tokens: usize,
    segments: Vec<Segment>,
}

thread_local! {
    static PASS: RefCell<Option<Pass>> = const { RefCell::new(None) };
}

/// Runs `forward` (one backbone pass over `tokens` rows) with `segments`' adapters added to
/// every layer with a site. No segments: the base model alone, at no cost.
pub fn with_segments<R>(tokens: usize, segments: Vec<Segment>, forward: impl FnOnce() -> R) -> R {
    if segments.is_empty() {
        return forward();
    }
    /// Clears the pass, also when `forward` unwinds.
    struct Clear;
    impl Drop for Clear {
        fn drop(&mut self) {
            PASS.set(None);
        }
    }
    PASS.set(Some(Pass { tokens, segments }));
    let _clear = Clear;
    forward()
}

/// The segments' rows must be the layer's: a layer with a site that runs on other rows (a
/// bug in a backbone's site list) must fail, never add one sequence's adapter to another's.
fn check_rows(pass: &Pass, rows: usize) -> Result<()> {
    if pass.tokens != rows {
        bail!("LoRA: a layer with adapters ran on {rows} rows in a pass of {} tokens", pass.tokens);
    }
    Ok(())
}

/// `dst += s·(x·Aᵀ)·Bᵀ` for every segment with an adapter on `site`; `x` is `[m, k]` and
/// `dst` `[m, n]`, row-major (the CPU kernels' layer).
pub(super) fn add_on_cpu(site: usize, x: &[f32], dst: &mut [f32], m: usize, k: usize, n: usize) -> Result<()> {
    PASS.with_borrow(|pass| {
        let Some(pass) = pass else { return Ok(()) };
        if pass.segments.iter().all(|s| s.weights.site(site).is_none()) {
            return Ok(());
        }
        check_rows(pass, m)?;
        let mut low_rank = Vec::new();
        let mut columns = Vec::new();
        for segment in &pass.segments {
            let Some(product) = segment.weights.site(site) else { continue };
            let rows = segment.end - segment.start;
            let x_rows = &x[segment.start * k..segment.end * k];
            for part in &product.parts {
                let PartProduct::Packed { offset, a, b } = part else { bail!("LoRA: device weights on a CPU layer") };
                let (rank, len) = (a.out_features(), b.out_features());
                low_rank.clear();
                low_rank.resize(rows * rank, 0.0);
                // SAFETY: `low_rank` holds rows × rank floats, `x_rows` rows × k (k = A's
                // inputs, checked by the caller against the base weight, which the site shares).
                unsafe { a.matmul(low_rank.as_mut_ptr(), x_rows, rows, false) };
                let out = &mut dst[segment.start * n..segment.end * n];
                if *offset == 0 && len == n {
                    // SAFETY: `out` is rows × n initialized floats and B has n outputs.
                    unsafe { b.matmul(out.as_mut_ptr(), &low_rank, rows, true) };
                } else {
                    // A fused layer's module fills some columns: into a buffer, then added.
                    columns.clear();
                    columns.resize(rows * len, 0.0);
                    // SAFETY: `columns` holds rows × len initialized floats and B has len outputs.
                    unsafe { b.matmul(columns.as_mut_ptr(), &low_rank, rows, true) };
                    for (row, add) in out.chunks_exact_mut(n).zip(columns.chunks_exact(len)) {
                        row[*offset..*offset + len].iter_mut().zip(add).for_each(|(y, d)| *y += d);
                    }
                }
            }
        }
        Ok(())
    })
}

/// The adapters' addition to `x·Wᵀ` (`[m, n]`) as candle products, for layers off the CPU
/// kernels (CUDA, half precision): `None` without adapters on `site` in this pass.
pub(super) fn delta(site: usize, x: &Tensor, n: usize) -> Result<Option<Tensor>> {
    PASS.with_borrow(|pass| {
        let Some(pass) = pass else { return Ok(None) };
        if pass.segments.iter().all(|s| s.weights.site(site).is_none()) {
            return Ok(None);
        }
        let m = x.dim(0)?;
        check_rows(pass, m)?;
        let zeros = |rows: usize| Tensor::zeros((rows, n), x.dtype(), x.device());
        let mut pieces = Vec::new();
        let mut done = 0;
        for segment in &pass.segments {
            let Some(product) = segment.weights.site(site) else { continue };
            if segment.start > done {
                pieces.push(zeros(segment.start - done)?);
            }
            let rows = x.narrow(0, segment.start, segment.end - segment.start)?;
            let mut sum: Option<Tensor> = None;
            for part in &product.parts {
                let PartProduct::Tensors { offset, a_t, b_t } = part else { bail!("LoRA: packed weights on a device layer") };
                let d = rows.matmul(a_t)?.matmul(b_t)?;
                let len = d.dim(1)?;
                let d = d.pad_with_zeros(1, *offset, n - offset - len)?;
                sum = Some(match sum {
                    Some(s) => (s + d)?,
                    None => d,
                });
            }
            pieces.push(sum.map_or_else(|| zeros(segment.end - segment.start), Ok)?);
            done = segment.end;
        }
        if done < m {
            pieces.push(zeros(m - done)?);
        }
        Ok(Some(Tensor::cat(&pieces, 0)?))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_util::{max_diff, random};
    use crate::kernels::Linear;

    /// A site of `n` outputs over `k` inputs, split in `parts` equal modules.
    fn site(k: usize, n: usize, parts: usize, on_cpu_kernels: bool) -> LoraSite {
        let len = n / parts;
        LoraSite {
            parts: (0..parts).map(|p| ModulePart { name: format!("m{p}"), offset: p * len, len }).collect(),
            in_features: k,
            on_cpu_kernels,
            device: Device::Cpu,
            dtype: DType::F32,
        }
    }

    fn factors(rank: usize, k: usize, len: usize, seed: u64) -> (LoraFactors, Tensor, Tensor) {
        let a = random((rank, k), seed);
        let b = random((len, rank), seed + 1);
        let f = LoraFactors {
            a: a.flatten_all().unwrap().to_vec1().unwrap(),
            b: b.flatten_all().unwrap().to_vec1().unwrap(),
            rank,
            scale: 0.5,
        };
        (f, a, b)
    }

    /// Base rows untouched, each segment's rows with its own adapter, on the packed kernels and
    /// on candle's products, for a plain layer and a fused one whose second module alone trained.
    #[test]
    fn each_segment_gets_its_own_adapter() {
        let (m, k, n) = (9, 24, 32);
        let x = random((m, k), 1);
        let w = random((n, k), 2);
        for on_cpu_kernels in [true, false] {
            for parts in [1, 2] {
                let site = site(k, n, parts, on_cpu_kernels);
                let len = n / parts;
                let trained = parts - 1;
                let (f1, a1, b1) = factors(4, k, len, 10);
                let (f2, a2, b2) = factors(3, k, len, 20);
                let one = Arc::new(LoraWeights::new(vec![Some(SiteProduct::new(&site, vec![(trained, f1)]).unwrap())]));
                let two = Arc::new(LoraWeights::new(vec![Some(SiteProduct::new(&site, vec![(trained, f2)]).unwrap())]));
                let mut layer = Linear::new(w.clone(), None).unwrap();
                layer.set_lora_site(0);
                let layer = if on_cpu_kernels { layer } else { layer.on_candle().unwrap() };
                let segments = vec![
                    Segment { start: 2, end: 5, weights: one.clone() },
                    Segment { start: 5, end: 6, weights: two.clone() },
                    Segment { start: 7, end: 9, weights: one },
                ];
                let y = with_segments(m, segments, || layer.forward(&x)).unwrap();
                let base = x.matmul(&w.t().unwrap()).unwrap();
                let add = |a: &Tensor, b: &Tensor| {
                    let d = (x.matmul(&a.t().unwrap()).unwrap().matmul(&b.t().unwrap()).unwrap() * 0.5).unwrap();
                    d.pad_with_zeros(1, trained * len, n - trained * len - len).unwrap()
                };
                let (d1, d2) = (add(&a1, &b1), add(&a2, &b2));
                let expected: Vec<Tensor> = (0..m)
                    .map(|r| {
                        let row = base.narrow(0, r, 1).unwrap();
                        match r {
                            2..=4 | 7 | 8 => (row + d1.narrow(0, r, 1).unwrap()).unwrap(),
                            5 => (row + d2.narrow(0, r, 1).unwrap()).unwrap(),
                            _ => row,
                        }
                    })
                    .collect();
                let expected = Tensor::cat(&expected, 0).unwrap();
                assert!(max_diff(&y, &expected) < 1e-4, "cpu kernels {on_cpu_kernels}, {parts} parts");
                // Outside a pass the layer is the base layer.
                assert!(max_diff(&layer.forward(&x).unwrap(), &base) < 1e-4);
            }
        }
    }

    #[test]
    fn a_pass_of_other_rows_is_an_error() {
        let site = site(8, 16, 1, true);
        let (f, _, _) = factors(2, 8, 16, 3);
        let weights = Arc::new(LoraWeights::new(vec![Some(SiteProduct::new(&site, vec![(0, f)]).unwrap())]));
        let mut layer = Linear::new(random((16, 8), 4), None).unwrap();
        layer.set_lora_site(0);
        let err = with_segments(5, vec![Segment { start: 0, end: 5, weights }], || layer.forward(&random((3, 8), 5))).unwrap_err();
        assert!(err.to_string().contains("ran on 3 rows in a pass of 5 tokens"), "{err}");
    }
}
