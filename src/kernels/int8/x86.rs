//! The x86-64 kernels, each compiled for the instructions it needs and run only where the CPU
//! has them (see [`super::Kernel::detect`]): AVX-512 VNNI and AVX-VNNI on bytes, AVX2 on
//! 16-bit activations (their activation quantizers are in [`super::quantize`]).

use super::activations::{ByteRows, WideRows};
use super::{Int8Weight, Out, Segments, BYTES_TILE_PANELS, BYTES_TILE_ROWS, PANEL, WIDE_TILE_ROWS};
use std::arch::x86_64::*;

/// Bytes of one 4-input group of a bytes panel: 16 columns × 4 inputs.
const GROUP_BYTES: usize = PANEL * 4;

/// AVX-512 VNNI: rows `tile·8..+8` × panels `p0..p0+3`, over `segments`.
///
/// # Safety
/// The CPU has avx512f, avx512bw and avx512vnni; the caller's contract of
/// [`super::Kernel::tile_bytes`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn tile_vnni(a: &ByteRows, tile: usize, w: &Int8Weight, p0: usize, segments: Segments, out: Out) {
    let panel_bytes = w.panel_bytes();
    let b = w.packed.as_ptr().add(p0 * panel_bytes);
    let x = a.data.as_ptr().add(tile * BYTES_TILE_ROWS * a.stride);
    for segment in segments.clone() {
        let mut acc = [[_mm512_setzero_si512(); BYTES_TILE_PANELS]; BYTES_TILE_ROWS];
        for g in w.segment_groups(segment) {
            let mut wv = [_mm512_setzero_si512(); BYTES_TILE_PANELS];
            for (p, v) in wv.iter_mut().enumerate() {
                *v = _mm512_loadu_si512(b.add(p * panel_bytes + g * GROUP_BYTES) as *const _);
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                let xv = _mm512_set1_epi32((x.add(r * a.stride + g * 4) as *const i32).read_unaligned());
                for (p, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm512_dpbusd_epi32(*acc, xv, wv[p]);
                }
            }
        }
        let read = out.read || segment > 0;
        for p in 0..BYTES_TILE_PANELS {
            let c0 = (p0 + p) * PANEL;
            if c0 >= out.cols {
                break;
            }
            let valid = (out.cols - c0).min(PANEL);
            let mask: __mmask16 = ((1u32 << valid) - 1) as u16;
            let i = segment * w.width() + c0;
            let column_sum = _mm512_loadu_si512(w.column_sum.as_ptr().add(i) as *const _);
            let scale = _mm512_loadu_ps(w.scale.as_ptr().add(i));
            for (r, acc) in acc.iter().enumerate() {
                let row = tile * BYTES_TILE_ROWS + r;
                if row >= out.rows {
                    break;
                }
                let (row_scale, zero) = a.params(row, segment);
                let offset = _mm512_mullo_epi32(_mm512_set1_epi32(zero), column_sum);
                let y = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[p], offset));
                let s = _mm512_mul_ps(scale, _mm512_set1_ps(row_scale));
                let d = out.ptr.add(row * out.cols + c0);
                let prior = if read { _mm512_maskz_loadu_ps(mask, d) } else { _mm512_setzero_ps() };
                _mm512_mask_storeu_ps(d, mask, _mm512_fmadd_ps(y, s, prior));
            }
        }
    }
}

/// Adds `y·s` to the 8 floats at `d` (or writes it, when not `read`), only the first `valid`
/// of them: masked stores are slow on AMD (microcoded), so only at a ragged last panel.
///
/// # Safety
/// The CPU has avx2; `d` points to 8 writable floats (`valid` of them when fewer), initialized
/// when `read`.
#[inline(always)]
unsafe fn store8(d: *mut f32, y: __m256, s: __m256, read: bool, valid: usize) {
    // SAFETY: `d` points to 8 floats (`valid` of them when < 8) of the caller's tile row.
    unsafe {
        if valid >= 8 {
            let prior = if read { _mm256_loadu_ps(d) } else { _mm256_setzero_ps() };
            _mm256_storeu_ps(d, _mm256_fmadd_ps(y, s, prior));
        } else if valid > 0 {
            let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(valid as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            let prior = if read { _mm256_maskload_ps(d, mask) } else { _mm256_setzero_ps() };
            _mm256_maskstore_ps(d, mask, _mm256_fmadd_ps(y, s, prior));
        }
    }
}

/// AVX-VNNI: the AVX-512 VNNI tile in 256-bit registers, as 4-row halves one panel at a time
/// (4 rows × 16 columns are 8 ymm accumulators).
///
/// # Safety
/// The CPU has avx2, fma and avxvnni; the caller's contract of [`super::Kernel::tile_bytes`].
#[target_feature(enable = "avx2,fma,avxvnni")]
pub(super) unsafe fn tile_avxvnni(a: &ByteRows, tile: usize, w: &Int8Weight, p0: usize, segments: Segments, out: Out) {
    const ROWS: usize = 4;
    // SAFETY: this fn's contract: the CPU features and the tile's bounds in `a`, `w` and `out`.
    unsafe {
        let panel_bytes = w.panel_bytes();
        for half in 0..BYTES_TILE_ROWS / ROWS {
            let row0 = tile * BYTES_TILE_ROWS + half * ROWS;
            if row0 >= out.rows {
                break;
            }
            let x = a.data.as_ptr().add(row0 * a.stride);
            for p in p0..p0 + BYTES_TILE_PANELS {
                let c0 = p * PANEL;
                if c0 >= out.cols {
                    break;
                }
                let b = w.packed.as_ptr().add(p * panel_bytes);
                for segment in segments.clone() {
                    let mut acc = [[_mm256_setzero_si256(); 2]; ROWS];
                    for g in w.segment_groups(segment) {
                        let w0 = _mm256_loadu_si256(b.add(g * GROUP_BYTES) as *const _);
                        let w1 = _mm256_loadu_si256(b.add(g * GROUP_BYTES + 32) as *const _);
                        for (r, acc) in acc.iter_mut().enumerate() {
                            let xv = _mm256_set1_epi32((x.add(r * a.stride + g * 4) as *const i32).read_unaligned());
                            acc[0] = _mm256_dpbusd_avx_epi32(acc[0], xv, w0);
                            acc[1] = _mm256_dpbusd_avx_epi32(acc[1], xv, w1);
                        }
                    }
                    let read = out.read || segment > 0;
                    let i = segment * w.width() + c0;
                    for (r, acc) in acc.iter().enumerate().take(out.rows - row0) {
                        let (row_scale, zero) = a.params(row0 + r, segment);
                        for (h, acc) in acc.iter().enumerate() {
                            let column_sum = _mm256_loadu_si256(w.column_sum.as_ptr().add(i + 8 * h) as *const _);
                            let scale = _mm256_loadu_ps(w.scale.as_ptr().add(i + 8 * h));
                            let offset = _mm256_mullo_epi32(_mm256_set1_epi32(zero), column_sum);
                            let y = _mm256_cvtepi32_ps(_mm256_sub_epi32(*acc, offset));
                            let s = _mm256_mul_ps(scale, _mm256_set1_ps(row_scale));
                            let d = out.ptr.add((row0 + r) * out.cols + c0 + 8 * h);
                            store8(d, y, s, read, (out.cols - c0).saturating_sub(8 * h).min(8));
                        }
                    }
                }
            }
        }
    }
}

/// AVX2: rows `tile·6..+6` × the 16 columns of panel `p`, over `segments`. Per pair of inputs,
/// the panel's 32 weight bytes are sign-extended into two vectors of 8 columns × 2 inputs, and
/// each row's two 16-bit activations, broadcast, multiply them with `vpmaddwd`.
///
/// # Safety
/// The CPU has avx2 and fma; the caller's contract of [`super::Kernel::tile_wide`].
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile_avx2(a: &WideRows, tile: usize, w: &Int8Weight, p: usize, segments: Segments, out: Out) {
    // SAFETY: this fn's contract: the CPU features and the tile's bounds in `a`, `w` and `out`.
    unsafe {
        let c0 = p * PANEL;
        if c0 >= out.cols {
            return;
        }
        let row0 = tile * WIDE_TILE_ROWS;
        let b = w.packed.as_ptr().add(p * w.panel_bytes());
        let x = a.data.as_ptr().add(row0 * a.stride);
        let valid_rows = (out.rows - row0).min(WIDE_TILE_ROWS);
        for segment in segments.clone() {
            let mut acc = [[_mm256_setzero_si256(); 2]; WIDE_TILE_ROWS];
            for g in w.segment_groups(segment) {
                let w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(g * 32) as *const _));
                let w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(g * 32 + 16) as *const _));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let xv = _mm256_set1_epi32((x.add(r * a.stride + g * 2) as *const i32).read_unaligned());
                    acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(xv, w0));
                    acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(xv, w1));
                }
            }
            let read = out.read || segment > 0;
            let i = segment * w.width() + c0;
            let scale = [_mm256_loadu_ps(w.scale.as_ptr().add(i)), _mm256_loadu_ps(w.scale.as_ptr().add(i + 8))];
            for (r, acc) in acc.iter().enumerate().take(valid_rows) {
                let row_scale = _mm256_set1_ps(a.scale[row0 + r]);
                for h in 0..2 {
                    let d = out.ptr.add((row0 + r) * out.cols + c0 + 8 * h);
                    let s = _mm256_mul_ps(scale[h], row_scale);
                    store8(d, _mm256_cvtepi32_ps(acc[h]), s, read, (out.cols - c0).saturating_sub(8 * h).min(8));
                }
            }
        }
    }
}
