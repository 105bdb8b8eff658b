//! Intel AMX (Advanced Matrix Extensions; Xeon Sapphire Rapids and later): eight tile registers
//! of up to 16 rows × 64 bytes, and instructions that multiply two tiles into a third,
//! `TDPBF16PS` (bf16 pairs → f32) and `TDPBUSD` (u8 × s8 quadruples → i32). One instruction
//! does 16 × 16 × 32 bf16 multiply-adds, sixteen times what `vdpbf16ps` does.
//!
//! The kernels (the AMX products of [`crate::kernels::sgemm`], bf16, and of
//! [`crate::kernels::int8`], int8) are written against [`Tiles`], the handful of tile
//! operations they use with fixed tile numbers (accumulators `tmm0`–`tmm3`, activation tiles
//! `tmm4`–`tmm5`, weight tiles `tmm6`–`tmm7`), and both run the same [`block::Block`].
//! [`Tiles`] has two implementations:
//! - [`TileModel`]: plain Rust, what the instructions compute as Intel's manual specifies them,
//!   including the shape rules the hardware enforces. It runs on every CPU, so the packing, the
//!   edge tiles and the loop order of the AMX kernels are tested everywhere;
//! - [`NativeTiles`]: the instructions (`asm!`: stable Rust has no AMX intrinsics), only on a CPU
//!   with AMX once Linux has granted the tile state ([`granted`]); checked against the model at
//!   first use (the product's self-check) and wherever the tests run on such a CPU.

pub mod block;
mod model;
mod native;

pub use model::TileModel;
pub use native::NativeTiles;

/// Rows of a tile.
pub const TILE_ROWS: usize = 16;
/// Bytes of a tile row.
pub const ROW_BYTES: usize = 64;

/// The 64-byte operand of `LDTILECFG` (palette 1): each tile's rows and bytes per row. A tile
/// left at 0 × 0 is unconfigured: any instruction naming it faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct TileConfig([u8; 64]);

impl TileConfig {
    /// The block the product kernels run: accumulators `tmm0` (A0·B0), `tmm1` (A0·B1), `tmm2`
    /// (A1·B0), `tmm3` (A1·B1); activation tiles A0 = `tmm4`, A1 = `tmm5` of `a_rows` rows
    /// (A1's 0: unused), `k_dwords` 4-byte groups wide; weight tiles B0 = `tmm6`, B1 = `tmm7`
    /// (`b_tiles` of them) of `k_dwords` rows of 64 bytes.
    pub fn block(a_rows: [usize; 2], b_tiles: usize, k_dwords: usize) -> Self {
        assert!(a_rows[0] >= 1 && a_rows.iter().all(|&r| r <= TILE_ROWS), "AMX block: {a_rows:?} activation rows");
        assert!((1..=2).contains(&b_tiles) && (1..=TILE_ROWS).contains(&k_dwords), "AMX block: {b_tiles} × {k_dwords}");
        let mut shapes = [(0usize, 0usize); 8];
        for (a, &rows) in a_rows.iter().enumerate() {
            if rows == 0 {
                continue;
            }
            shapes[4 + a] = (rows, 4 * k_dwords);
            for b in 0..b_tiles {
                shapes[2 * a + b] = (rows, ROW_BYTES);
            }
        }
        for b in 0..b_tiles {
            shapes[6 + b] = (k_dwords, ROW_BYTES);
        }
        Self::with_shapes(&shapes)
    }

    /// Tile `i` of `rows` × `bytes` per row, for each entry.
    pub fn with_shapes(shapes: &[(usize, usize); 8]) -> Self {
        let mut bytes = [0u8; 64];
        bytes[0] = 1; // palette 1: 8 tiles of up to 16 × 64 bytes
        for (i, &(rows, colsb)) in shapes.iter().enumerate() {
            bytes[16 + 2 * i..18 + 2 * i].copy_from_slice(&(colsb as u16).to_le_bytes());
            bytes[48 + i] = rows as u8;
        }
        Self(bytes)
    }

    /// Tile `i`'s (rows, bytes per row).
    pub fn shape(&self, i: usize) -> (usize, usize) {
        (self.0[48 + i] as usize, u16::from_le_bytes([self.0[16 + 2 * i], self.0[17 + 2 * i]]) as usize)
    }

    pub fn palette(&self) -> u8 {
        self.0[0]
    }

    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.0.as_ptr()
    }
}

/// The tile operations the AMX kernels use. `T`, `C`, `A`, `B` name tile registers (0–7).
///
/// # Safety (every method)
/// The tiles named are configured with shapes that satisfy the instruction (see [`TileModel`],
/// which checks them); a load reads, and a store writes, the configured rows × bytes from
/// `base`, rows `stride` bytes apart.
pub trait Tiles {
    /// `LDTILECFG`: sets every tile's shape and zeroes every tile.
    unsafe fn configure(&mut self, config: &TileConfig);
    /// `TILEZERO`.
    unsafe fn zero<const T: usize>(&mut self);
    /// `TILELOADD`.
    unsafe fn load<const T: usize>(&mut self, base: *const u8, stride: usize);
    /// `TILESTORED`.
    unsafe fn store<const T: usize>(&mut self, base: *mut u8, stride: usize);
    /// `TDPBF16PS C, A, B`: C (f32) += A (bf16 pairs) · B (bf16 pairs).
    unsafe fn dot_bf16<const C: usize, const A: usize, const B: usize>(&mut self);
    /// `TDPBUSD C, A, B`: C (i32) += A (u8 quadruples) · B (s8 quadruples).
    unsafe fn dot_u8s8<const C: usize, const A: usize, const B: usize>(&mut self);
    /// `TILERELEASE`: back to the unconfigured state (the tiles leave the thread's saved state).
    unsafe fn release(&mut self);
}

/// What the CPU has: `(tile, bf16, int8)` from CPUID leaf 7.
#[cfg(target_arch = "x86_64")]
fn cpu_has_amx() -> (bool, bool, bool) {
    // Leaf 7 on a CPU without it reads as zeros: no AMX.
    let leaf = std::arch::x86_64::__cpuid_count(7, 0);
    (leaf.edx >> 24 & 1 == 1, leaf.edx >> 22 & 1 == 1, leaf.edx >> 25 & 1 == 1)
}

/// Whether this process may run AMX instructions: the CPU has AMX-TILE and AMX-BF16, and Linux
/// granted the tile data state (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`; the
/// kernel grants it per process, once, and refuses where the signal stack would be too small or
/// the feature is disabled). Asked once; a refusal is logged and the other kernels run.
pub fn granted() -> bool {
    static GRANTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *GRANTED.get_or_init(|| {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            let (tile, bf16, _) = cpu_has_amx();
            if !(tile && bf16) {
                return false;
            }
            const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
            const XFEATURE_XTILEDATA: libc::c_long = 18;
            // SAFETY: arch_prctl with ARCH_REQ_XCOMP_PERM takes a feature number and touches no
            // memory of ours.
            let status = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) };
            if status != 0 {
                tracing::warn!(
                    "the CPU has AMX but Linux refused the tile state ({}): AMX kernels stay off",
                    std::io::Error::last_os_error()
                );
                return false;
            }
            true
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        false
    })
}

/// Whether the CPU also has AMX-INT8 (`TDPBUSD`), given [`granted`].
pub fn int8_granted() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        granted() && cpu_has_amx().2
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_config_shapes_follow_the_instruction_rules() {
        let c = TileConfig::block([16, 5], 2, 7);
        assert_eq!(c.palette(), 1);
        for (tile, shape) in
            [(0, (16, 64)), (1, (16, 64)), (2, (5, 64)), (3, (5, 64)), (4, (16, 28)), (5, (5, 28)), (6, (7, 64)), (7, (7, 64))]
        {
            assert_eq!(c.shape(tile), shape, "tmm{tile}");
        }
        // One activation tile, one weight tile: the rest stay unconfigured.
        let c = TileConfig::block([3, 0], 1, 16);
        assert_eq!([c.shape(0), c.shape(1), c.shape(2), c.shape(3)], [(3, 64), (0, 0), (0, 0), (0, 0)]);
        assert_eq!([c.shape(4), c.shape(5), c.shape(6), c.shape(7)], [(3, 64), (0, 0), (16, 64), (0, 0)]);
    }

    /// The native tiles against the model, on a CPU with AMX; elsewhere says loudly that it
    /// could not run (the model's own tests and the product tests still run).
    #[test]
    fn native_tiles_match_the_model() {
        let Some(mut native) = NativeTiles::new() else {
            eprintln!("NOTE: this CPU has no AMX (or Linux refused it): the native AMX instructions are NOT exercised here");
            return;
        };
        let mut model = TileModel::new();
        // int8: exact, any bytes.
        let a: Vec<u8> = (0..2048).map(|i| (i * 37 % 251) as u8).collect();
        let b: Vec<u8> = (0..2048).map(|i| (i * 53 % 241) as u8).collect();
        for config in [TileConfig::block([16, 9], 2, 11), TileConfig::block([16, 16], 2, 16)] {
            assert_eq!(model::exercise(&mut native, &config, &a, &b, true), model::exercise(&mut model, &config, &a, &b, true));
        }
        // bf16: finite values; the hardware may sum a row's products in another order.
        let half = |seed: usize| -> Vec<u8> {
            (0..1024).flat_map(|i| crate::kernels::sgemm::round_bf16(((i * seed) % 17) as f32 * 0.37 - 3.0).to_le_bytes()).collect()
        };
        let (a, b) = (half(7), half(11));
        let config = TileConfig::block([16, 5], 2, 9);
        let (got, want) = (model::exercise(&mut native, &config, &a, &b, false), model::exercise(&mut model, &config, &a, &b, false));
        for (g, w) in got.chunks(4).zip(want.chunks(4)) {
            let (g, w) = (f32::from_le_bytes([g[0], g[1], g[2], g[3]]), f32::from_le_bytes([w[0], w[1], w[2], w[3]]));
            assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{g} vs {w}");
        }
    }
}
