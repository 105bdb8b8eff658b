//! The block both AMX products run: up to two activation tiles (A0 = `tmm4`, A1 = `tmm5`) ×
//! up to two weight tiles (B0 = `tmm6`, B1 = `tmm7`) into four accumulators (`tmm0`–`tmm3`),
//! over a run of 4-byte groups of the input dimension (bf16 pairs, or int8 quadruples) in
//! steps of 16, the last step configured smaller. Configuring zeroes every tile, so the
//! accumulators go through memory across that change.

use super::{TileConfig, Tiles, ROW_BYTES, TILE_ROWS};

/// One accumulator in memory: 16 rows of 16 values (f32 or i32), 64 bytes each.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct Accumulator<E: Copy>(pub [[E; 16]; TILE_ROWS]);

/// Which dot-product instruction a block runs.
pub trait Dot {
    /// # Safety
    /// As [`Tiles::dot_bf16`].
    unsafe fn dot<T: Tiles, const C: usize, const A: usize, const B: usize>(tiles: &mut T);
}

/// `TDPBF16PS`.
pub struct Bf16;
impl Dot for Bf16 {
    unsafe fn dot<T: Tiles, const C: usize, const A: usize, const B: usize>(tiles: &mut T) {
        // SAFETY: the trait's contract.
        unsafe { tiles.dot_bf16::<C, A, B>() }
    }
}

/// `TDPBUSD`.
pub struct U8S8;
impl Dot for U8S8 {
    unsafe fn dot<T: Tiles, const C: usize, const A: usize, const B: usize>(tiles: &mut T) {
        // SAFETY: the trait's contract.
        unsafe { tiles.dot_u8s8::<C, A, B>() }
    }
}

/// The shape of a block and the configuration in force (`LDTILECFG` only when it changes).
pub struct Block {
    /// Rows of A0 and A1 (A1's 0: unused).
    pub a_rows: [usize; 2],
    /// Weight tiles, 1 or 2.
    pub b_tiles: usize,
    current: Option<TileConfig>,
}

impl Default for Block {
    fn default() -> Self {
        Self { a_rows: [TILE_ROWS, TILE_ROWS], b_tiles: 2, current: None }
    }
}

/// Groups per step: one weight tile's rows.
const STEP: usize = TILE_ROWS;

impl Block {
    /// `acc` (f32 or i32, as `D` accumulates) = A · B over `groups` 4-byte groups: A0's rows
    /// start at `a` (`a_stride` bytes apart, A1 16 rows further), B0's at `b` (64-byte rows, B1
    /// `b_tile_offset` bytes further); a group is 4 bytes of an A row and one 64-byte B row.
    ///
    /// # Safety
    /// `tiles` runs on this CPU; the block's rows × `groups` groups lie inside the activations
    /// and the weights from `a` and `b`; `groups` > 0.
    pub unsafe fn accumulate<T: Tiles, D: Dot, E: Copy>(
        &mut self,
        tiles: &mut T,
        acc: &mut [Accumulator<E>; 4],
        groups: usize,
        (a, a_stride): (*const u8, usize),
        (b, b_tile_offset): (*const u8, usize),
    ) {
        let full = groups / STEP * STEP;
        // SAFETY: every tile loaded lies inside the buffers (this fn's contract); only configured
        // tiles are named.
        unsafe {
            if full > 0 {
                self.configure(tiles, STEP);
                self.accumulators(tiles, acc, Move::Zero);
                for g0 in (0..full).step_by(STEP) {
                    self.step::<T, D>(tiles, a.add(4 * g0), a_stride, b.add(g0 * ROW_BYTES), b_tile_offset);
                }
            }
            if full < groups {
                if full > 0 {
                    self.accumulators(tiles, acc, Move::Store);
                }
                self.configure(tiles, groups - full);
                self.accumulators(tiles, acc, if full > 0 { Move::Load } else { Move::Zero });
                self.step::<T, D>(tiles, a.add(4 * full), a_stride, b.add(full * ROW_BYTES), b_tile_offset);
            }
            self.accumulators(tiles, acc, Move::Store);
        }
    }

    /// # Safety
    /// `tiles` runs on this CPU.
    unsafe fn configure<T: Tiles>(&mut self, tiles: &mut T, k_groups: usize) {
        let config = TileConfig::block(self.a_rows, self.b_tiles, k_groups);
        if self.current != Some(config) {
            // SAFETY: a palette-1 configuration of at most 16 × 64-byte tiles.
            unsafe { tiles.configure(&config) };
            self.current = Some(config);
        }
    }

    /// Loads the block's tiles for one step and runs its dot products.
    ///
    /// # Safety
    /// The block is configured; the tiles' rows lie inside the buffers.
    #[inline(always)]
    unsafe fn step<T: Tiles, D: Dot>(&self, tiles: &mut T, a: *const u8, a_stride: usize, b: *const u8, b_tile_offset: usize) {
        let two_b = self.b_tiles == 2;
        // SAFETY: the caller's contract.
        unsafe {
            tiles.load::<6>(b, ROW_BYTES);
            if two_b {
                tiles.load::<7>(b.add(b_tile_offset), ROW_BYTES);
            }
            tiles.load::<4>(a, a_stride);
            D::dot::<T, 0, 4, 6>(tiles);
            if two_b {
                D::dot::<T, 1, 4, 7>(tiles);
            }
            if self.a_rows[1] > 0 {
                tiles.load::<5>(a.add(TILE_ROWS * a_stride), a_stride);
                D::dot::<T, 2, 5, 6>(tiles);
                if two_b {
                    D::dot::<T, 3, 5, 7>(tiles);
                }
            }
        }
    }

    /// Zeroes, stores or loads the configured accumulators.
    ///
    /// # Safety
    /// The block is configured.
    #[inline(always)]
    unsafe fn accumulators<T: Tiles, E: Copy>(&self, tiles: &mut T, acc: &mut [Accumulator<E>; 4], what: Move) {
        let used = [true, self.b_tiles == 2, self.a_rows[1] > 0, self.a_rows[1] > 0 && self.b_tiles == 2];
        for (t, acc) in acc.iter_mut().enumerate().filter(|&(t, _)| used[t]) {
            let at = acc.0.as_mut_ptr() as *mut u8;
            // SAFETY: tile t is configured (`used`); each accumulator is 16 rows of 64 bytes.
            unsafe {
                match (what, t) {
                    (Move::Zero, 0) => tiles.zero::<0>(),
                    (Move::Zero, 1) => tiles.zero::<1>(),
                    (Move::Zero, 2) => tiles.zero::<2>(),
                    (Move::Zero, _) => tiles.zero::<3>(),
                    (Move::Store, 0) => tiles.store::<0>(at, ROW_BYTES),
                    (Move::Store, 1) => tiles.store::<1>(at, ROW_BYTES),
                    (Move::Store, 2) => tiles.store::<2>(at, ROW_BYTES),
                    (Move::Store, _) => tiles.store::<3>(at, ROW_BYTES),
                    (Move::Load, 0) => tiles.load::<0>(at, ROW_BYTES),
                    (Move::Load, 1) => tiles.load::<1>(at, ROW_BYTES),
                    (Move::Load, 2) => tiles.load::<2>(at, ROW_BYTES),
                    (Move::Load, _) => tiles.load::<3>(at, ROW_BYTES),
                }
            }
        }
    }
}

#[derive(Clone, Copy)]
enum Move {
    Zero,
    Store,
    Load,
}
