//! The AMX instructions themselves, one `asm!` each (stable Rust has no AMX intrinsics; the
//! tile numbers are const generics, so each call is one instruction naming fixed registers).
//! The register allocator knows nothing of tile registers: only these kernels use them, each
//! product configures them before use and releases them after.

use super::{TileConfig, Tiles};
#[cfg(target_arch = "x86_64")]
use std::arch::asm;

/// The tile unit of this CPU. Only [`NativeTiles::new`] makes one, where AMX is [`super::granted`].
pub struct NativeTiles(());

impl NativeTiles {
    /// The native unit, where this process may run AMX instructions.
    pub fn new() -> Option<Self> {
        super::granted().then_some(Self(()))
    }
}

#[cfg(target_arch = "x86_64")]
impl Tiles for NativeTiles {
    unsafe fn configure(&mut self, config: &TileConfig) {
        // SAFETY: AMX is granted (a `NativeTiles` exists); the config is 64 readable bytes.
        unsafe { asm!("ldtilecfg [{cfg}]", cfg = in(reg) config.as_ptr(), options(nostack, readonly)) }
    }

    unsafe fn zero<const T: usize>(&mut self) {
        // SAFETY: AMX is granted; tile T is configured (the caller's contract).
        unsafe { asm!("tilezero tmm{t}", t = const T, options(nostack, nomem)) }
    }

    unsafe fn load<const T: usize>(&mut self, base: *const u8, stride: usize) {
        // SAFETY: the caller's contract: the configured rows × bytes from `base` are readable.
        unsafe {
            asm!("tileloadd tmm{t}, [{base} + {stride}*1]", t = const T, base = in(reg) base, stride = in(reg) stride, options(nostack, readonly))
        }
    }

    unsafe fn store<const T: usize>(&mut self, base: *mut u8, stride: usize) {
        // SAFETY: the caller's contract: the configured rows × bytes from `base` are writable.
        unsafe {
            asm!("tilestored [{base} + {stride}*1], tmm{t}", t = const T, base = in(reg) base, stride = in(reg) stride, options(nostack))
        }
    }

    unsafe fn dot_bf16<const C: usize, const A: usize, const B: usize>(&mut self) {
        // SAFETY: AMX is granted; the three tiles are configured with matching shapes.
        unsafe { asm!("tdpbf16ps tmm{c}, tmm{a}, tmm{b}", c = const C, a = const A, b = const B, options(nostack, nomem)) }
    }

    unsafe fn dot_u8s8<const C: usize, const A: usize, const B: usize>(&mut self) {
        // SAFETY: AMX-INT8 is present (the int8 caller checks `int8_granted`); shapes as above.
        unsafe { asm!("tdpbusd tmm{c}, tmm{a}, tmm{b}", c = const C, a = const A, b = const B, options(nostack, nomem)) }
    }

    unsafe fn release(&mut self) {
        // SAFETY: AMX is granted; TILERELEASE takes no operands.
        unsafe { asm!("tilerelease", options(nostack, nomem)) }
    }
}

/// No AMX outside x86-64: [`NativeTiles::new`] never returns one there.
#[cfg(not(target_arch = "x86_64"))]
impl Tiles for NativeTiles {
    unsafe fn configure(&mut self, _: &TileConfig) {
        unreachable!("no AMX on this architecture")
    }
    unsafe fn zero<const T: usize>(&mut self) {
        unreachable!("no AMX on this architecture")
    }
    unsafe fn load<const T: usize>(&mut self, _: *const u8, _: usize) {
        unreachable!("no AMX on this architecture")
    }
    unsafe fn store<const T: usize>(&mut self, _: *mut u8, _: usize) {
        unreachable!("no AMX on this architecture")
    }
    unsafe fn dot_bf16<const C: usize, const A: usize, const B: usize>(&mut self) {
        unreachable!("no AMX on this architecture")
    }
    unsafe fn dot_u8s8<const C: usize, const A: usize, const B: usize>(&mut self) {
        unreachable!("no AMX on this architecture")
    }
    unsafe fn release(&mut self) {
        unreachable!("no AMX on this architecture")
    }
}
