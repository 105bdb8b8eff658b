//! What the AMX tile instructions compute, in plain Rust, as Intel's Software Developer's Manual
//! specifies them (`LDTILECFG`, `TILELOADD`, `TILESTORED`, `TILEZERO`, `TDPBF16PS`, `TDPBUSD`):
//! the shape rules the hardware faults on are assertions here, so a kernel that would fault on
//! an AMX CPU fails its tests on any CPU.

use super::{TileConfig, Tiles, ROW_BYTES, TILE_ROWS};

const TILE_BYTES: usize = TILE_ROWS * ROW_BYTES;

/// Eight tile registers and the configuration in force.
pub struct TileModel {
    config: Option<TileConfig>,
    tiles: [[u8; TILE_BYTES]; 8],
}

impl Default for TileModel {
    fn default() -> Self {
        Self::new()
    }
}

impl TileModel {
    pub fn new() -> Self {
        Self { config: None, tiles: [[0; TILE_BYTES]; 8] }
    }

    /// Tile `t`'s (rows, bytes per row); using an unconfigured tile faults (#UD) on hardware.
    fn shape(&self, t: usize) -> (usize, usize) {
        let config = self.config.as_ref().expect("AMX: tile instruction before LDTILECFG");
        let (rows, colsb) = config.shape(t);
        assert!(rows > 0 && colsb > 0, "AMX: tmm{t} is not configured");
        (rows, colsb)
    }

    fn dword(&self, t: usize, row: usize, i: usize) -> [u8; 4] {
        let at = row * ROW_BYTES + 4 * i;
        let mut d = [0; 4];
        d.copy_from_slice(&self.tiles[t][at..at + 4]);
        d
    }

    fn set_dword(&mut self, t: usize, row: usize, i: usize, d: [u8; 4]) {
        let at = row * ROW_BYTES + 4 * i;
        self.tiles[t][at..at + 4].copy_from_slice(&d);
    }

    /// The shapes a dot product needs (the hardware's #UD conditions): three distinct tiles,
    /// C as tall as A and as wide as B, A's 4-byte groups as many as B's rows. Returns
    /// (rows, C's dwords per row, K's dwords).
    fn dot_shapes(&self, c: usize, a: usize, b: usize) -> (usize, usize, usize) {
        assert!(c != a && c != b && a != b, "AMX: a dot product names tmm{c}, tmm{a}, tmm{b}");
        let ((cr, cc), (ar, ac), (br, bc)) = (self.shape(c), self.shape(a), self.shape(b));
        assert!(cr == ar && cc == bc && ac == 4 * br && cc % 4 == 0, "AMX: tmm{c} {cr}×{cc} += tmm{a} {ar}×{ac} · tmm{b} {br}×{bc}");
        (cr, cc / 4, br)
    }

    /// Zeroes what lies past `rows` × `colsb` of tile `t`, as every write to a tile does.
    fn zero_outside(&mut self, t: usize, rows: usize, colsb: usize) {
        for r in 0..TILE_ROWS {
            let from = if r < rows { colsb } else { 0 };
            self.tiles[t][r * ROW_BYTES + from..(r + 1) * ROW_BYTES].fill(0);
        }
    }
}

/// A bf16 as f32, denormals as zero (the instruction's DAZ).
fn bf16_daz(bits: u16) -> f32 {
    if bits & 0x7f80 == 0 {
        return 0.0;
    }
    f32::from_bits((bits as u32) << 16)
}

/// Denormal results flushed to zero (the instruction's FTZ), sign kept.
fn ftz(x: f32) -> f32 {
    if x != 0.0 && x.abs() < f32::MIN_POSITIVE {
        return 0.0f32.copysign(x);
    }
    x
}

impl Tiles for TileModel {
    unsafe fn configure(&mut self, config: &TileConfig) {
        assert_eq!(config.palette(), 1, "AMX: palette 1 is the only one");
        for t in 0..8 {
            let (rows, colsb) = config.shape(t);
            assert!(rows <= TILE_ROWS && colsb <= ROW_BYTES && (rows == 0) == (colsb == 0), "AMX: tmm{t} of {rows} × {colsb} bytes");
        }
        self.config = Some(*config);
        self.tiles = [[0; TILE_BYTES]; 8];
    }

    unsafe fn zero<const T: usize>(&mut self) {
        self.shape(T);
        self.tiles[T] = [0; TILE_BYTES];
    }

    unsafe fn load<const T: usize>(&mut self, base: *const u8, stride: usize) {
        let (rows, colsb) = self.shape(T);
        for r in 0..rows {
            // SAFETY: the caller's contract: `rows` rows of `colsb` bytes, `stride` apart.
            let src = unsafe { std::slice::from_raw_parts(base.add(r * stride), colsb) };
            self.tiles[T][r * ROW_BYTES..r * ROW_BYTES + colsb].copy_from_slice(src);
        }
        self.zero_outside(T, rows, colsb);
    }

    unsafe fn store<const T: usize>(&mut self, base: *mut u8, stride: usize) {
        let (rows, colsb) = self.shape(T);
        for r in 0..rows {
            // SAFETY: the caller's contract, as for `load`.
            let dst = unsafe { std::slice::from_raw_parts_mut(base.add(r * stride), colsb) };
            dst.copy_from_slice(&self.tiles[T][r * ROW_BYTES..r * ROW_BYTES + colsb]);
        }
    }

    /// For each row m and column n: for each k, `c += a[m][2k]·b[k][2n]`, then
    /// `c += a[m][2k+1]·b[k][2n+1]`, each product exact in f32 and each sum rounded to nearest
    /// even (the manual's order).
    unsafe fn dot_bf16<const C: usize, const A: usize, const B: usize>(&mut self) {
        let (rows, cols, depth) = self.dot_shapes(C, A, B);
        for m in 0..rows {
            for n in 0..cols {
                let mut acc = f32::from_le_bytes(self.dword(C, m, n));
                for k in 0..depth {
                    let (a, b) = (self.dword(A, m, k), self.dword(B, k, n));
                    for j in 0..2 {
                        let x = bf16_daz(u16::from_le_bytes([a[2 * j], a[2 * j + 1]]));
                        let y = bf16_daz(u16::from_le_bytes([b[2 * j], b[2 * j + 1]]));
                        acc = ftz(acc + x * y);
                    }
                }
                self.set_dword(C, m, n, acc.to_le_bytes());
            }
        }
        let colsb = self.shape(C).1;
        self.zero_outside(C, rows, colsb);
    }

    /// For each row m and column n: `c += Σ_k Σ_j zext(a[m][4k+j]) · sext(b[k][4n+j])`, in
    /// wrapping 32-bit integers.
    unsafe fn dot_u8s8<const C: usize, const A: usize, const B: usize>(&mut self) {
        let (rows, cols, depth) = self.dot_shapes(C, A, B);
        for m in 0..rows {
            for n in 0..cols {
                let mut acc = i32::from_le_bytes(self.dword(C, m, n));
                for k in 0..depth {
                    let (a, b) = (self.dword(A, m, k), self.dword(B, k, n));
                    let dot: i32 = (0..4).map(|j| a[j] as i32 * b[j] as i8 as i32).sum();
                    acc = acc.wrapping_add(dot);
                }
                self.set_dword(C, m, n, acc.to_le_bytes());
            }
        }
        let colsb = self.shape(C).1;
        self.zero_outside(C, rows, colsb);
    }

    unsafe fn release(&mut self) {
        *self = Self::new();
    }
}

/// Runs the block the product kernels run (A0, A1 from `a`, B0, B1 from `b`, 64-byte rows; all
/// four dot products of `config`'s configured tiles, bf16 then int8 into separate results) and
/// returns the accumulators' bytes: the same sequence for the model and the native unit.
#[cfg(test)]
pub(super) fn exercise<T: Tiles>(tiles: &mut T, config: &TileConfig, a: &[u8], b: &[u8], int8: bool) -> Vec<u8> {
    assert!(a.len() >= 2 * TILE_BYTES && b.len() >= 2 * TILE_BYTES);
    let mut out = vec![0u8; 4 * TILE_BYTES];
    // SAFETY: the config's tiles hold at most 16 rows of 64 bytes, and every buffer holds that
    // many from each base used.
    unsafe {
        tiles.configure(config);
        tiles.load::<4>(a.as_ptr(), ROW_BYTES);
        tiles.load::<5>(a.as_ptr().add(TILE_BYTES), ROW_BYTES);
        tiles.load::<6>(b.as_ptr(), ROW_BYTES);
        tiles.load::<7>(b.as_ptr().add(TILE_BYTES), ROW_BYTES);
        for t in 0..4 {
            let base = out.as_mut_ptr().add(t * TILE_BYTES);
            match (t, int8) {
                (0, false) => tiles.dot_bf16::<0, 4, 6>(),
                (1, false) => tiles.dot_bf16::<1, 4, 7>(),
                (2, false) => tiles.dot_bf16::<2, 5, 6>(),
                (3, false) => tiles.dot_bf16::<3, 5, 7>(),
                (0, true) => tiles.dot_u8s8::<0, 4, 6>(),
                (1, true) => tiles.dot_u8s8::<1, 4, 7>(),
                (2, true) => tiles.dot_u8s8::<2, 5, 6>(),
                _ => tiles.dot_u8s8::<3, 5, 7>(),
            }
            match t {
                0 => tiles.store::<0>(base, ROW_BYTES),
                1 => tiles.store::<1>(base, ROW_BYTES),
                2 => tiles.store::<2>(base, ROW_BYTES),
                _ => tiles.store::<3>(base, ROW_BYTES),
            }
        }
        tiles.release();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::sgemm::round_bf16;

    fn bf16_tile(values: impl Fn(usize, usize) -> f32) -> Vec<u8> {
        let values = &values;
        (0..TILE_ROWS).flat_map(|r| (0..32).flat_map(move |i| round_bf16(values(r, i)).to_le_bytes())).collect()
    }

    /// TDPBF16PS on a full block against the plain sum in f64 (the products are exact; the
    /// f32 rounding of 32 sums stays far inside 1e-5 of these magnitudes).
    #[test]
    fn tdpbf16ps_is_a_sum_of_pair_products() {
        let a = [bf16_tile(|r, i| ((r * 7 + i * 3) % 11) as f32 * 0.25 - 1.0), bf16_tile(|r, i| ((r + i) % 5) as f32 - 2.0)].concat();
        let b = [bf16_tile(|r, i| ((r * 5 + i) % 9) as f32 * 0.5 - 2.0), bf16_tile(|r, i| ((r * 3 + i * 7) % 13) as f32 * 0.125)].concat();
        for k_dwords in [16, 5, 1] {
            for a_rows in [[16, 16], [16, 3], [7, 0]] {
                let b_tiles = if a_rows[1] == 0 { 1 } else { 2 };
                let config = TileConfig::block(a_rows, b_tiles, k_dwords);
                if b_tiles == 1 {
                    // The one-tile block: the single dot product it configures.
                    let mut model = TileModel::new();
                    let mut c = vec![0u8; TILE_BYTES];
                    // SAFETY: buffers of a full tile each.
                    unsafe {
                        model.configure(&config);
                        model.load::<4>(a.as_ptr(), ROW_BYTES);
                        model.load::<6>(b.as_ptr(), ROW_BYTES);
                        model.dot_bf16::<0, 4, 6>();
                        model.store::<0>(c.as_mut_ptr(), ROW_BYTES);
                    }
                    check(&c, &a, &b, 0, 0, a_rows[0], k_dwords);
                    continue;
                }
                let out = exercise(&mut TileModel::new(), &config, &a, &b, false);
                for (t, (ai, bi)) in [(0, 0), (0, 1), (1, 0), (1, 1)].into_iter().enumerate() {
                    check(&out[t * TILE_BYTES..(t + 1) * TILE_BYTES], &a, &b, ai, bi, a_rows[ai], k_dwords);
                }
            }
        }

        fn check(c: &[u8], a: &[u8], b: &[u8], ai: usize, bi: usize, rows: usize, k_dwords: usize) {
            let half = |buf: &[u8], tile: usize, row: usize, i: usize| {
                let at = tile * TILE_BYTES + row * ROW_BYTES + 2 * i;
                f32::from_bits((u16::from_le_bytes([buf[at], buf[at + 1]]) as u32) << 16) as f64
            };
            for m in 0..rows {
                for n in 0..16 {
                    let want: f64 = (0..2 * k_dwords).map(|i| half(a, ai, m, i) * half(b, bi, i / 2, 2 * n + i % 2)).sum();
                    let at = m * ROW_BYTES + 4 * n;
                    let got = f32::from_le_bytes([c[at], c[at + 1], c[at + 2], c[at + 3]]) as f64;
                    assert!((got - want).abs() <= 1e-5 * want.abs().max(1.0), "tile {ai}{bi} [{m}][{n}] k {k_dwords}: {got} vs {want}");
                }
            }
        }
    }

    /// TDPBUSD against the plain integer sum: unsigned activations, signed weights, exact.
    #[test]
    fn tdpbusd_is_an_exact_integer_sum() {
        let a: Vec<u8> = (0..2 * TILE_BYTES).map(|i| (i * 37 % 256) as u8).collect();
        let b: Vec<u8> = (0..2 * TILE_BYTES).map(|i| (i * 91 % 256) as u8).collect();
        let config = TileConfig::block([16, 10], 2, 13);
        let out = exercise(&mut TileModel::new(), &config, &a, &b, true);
        for (t, (ai, bi)) in [(0usize, 0usize), (0, 1), (1, 0), (1, 1)].into_iter().enumerate() {
            let rows = if ai == 0 { 16 } else { 10 };
            for m in 0..16 {
                for n in 0..16 {
                    let want: i32 = if m < rows {
                        (0..4 * 13)
                            .map(|i| {
                                a[ai * TILE_BYTES + m * ROW_BYTES + i] as i32
                                    * b[bi * TILE_BYTES + (i / 4) * ROW_BYTES + 4 * n + i % 4] as i8 as i32
                            })
                            .sum()
                    } else {
                        0
                    };
                    let at = t * TILE_BYTES + m * ROW_BYTES + 4 * n;
                    assert_eq!(i32::from_le_bytes([out[at], out[at + 1], out[at + 2], out[at + 3]]), want, "tile {t} [{m}][{n}]");
                }
            }
        }
    }

    #[test]
    fn denormals_are_zero_in_and_out() {
        assert_eq!(bf16_daz(0x0001), 0.0);
        assert_eq!(bf16_daz(0x3f80), 1.0);
        assert_eq!(ftz(f32::MIN_POSITIVE / 2.0), 0.0);
        assert_eq!(ftz(-1.5), -1.5);
    }

    #[test]
    #[should_panic(expected = "tmm1 is not configured")]
    fn an_unconfigured_tile_faults() {
        let mut model = TileModel::new();
        // SAFETY: the model checks the shapes (this one faults, as the hardware would).
        unsafe {
            model.configure(&TileConfig::block([16, 0], 1, 16));
            model.dot_bf16::<1, 4, 7>();
        }
    }

    #[test]
    #[should_panic(expected = "AMX: tmm0 16×64 += tmm4 16×64 · tmm6 8×64")]
    fn mismatched_depths_fault() {
        let mut shapes = [(0, 0); 8];
        shapes[0] = (16, 64);
        shapes[4] = (16, 64);
        shapes[6] = (8, 64);
        let mut model = TileModel::new();
        // SAFETY: as above.
        unsafe {
            model.configure(&TileConfig::with_shapes(&shapes));
            model.dot_bf16::<0, 4, 6>();
        }
    }
}
