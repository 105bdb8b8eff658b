use super::*;
use crate::kernels::test_util::random_values as pseudo_random;

fn reference(x: &[f32], w: &[f32], m: usize, k: usize, n: usize, prior: &[f32]) -> Vec<f32> {
    let mut y = prior.to_vec();
    for i in 0..m {
        for r in 0..k {
            for c in 0..n {
                y[i * n + c] += x[i * k + r] * w[r * n + c];
            }
        }
    }
    y
}

fn rounded(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&v| widen(round(v))).collect()
}

#[test]
fn packing_round_trips() {
    let w = pseudo_random(37 * 50, 1);
    let w_out_in: Vec<f32> = (0..50).flat_map(|o| (0..37).map(move |i| (i, o))).map(|(i, o)| w[i * 50 + o]).collect();
    for (format, expected) in [(WeightFormat::F32, w.clone()), (WeightFormat::Bf16, rounded(&w))] {
        assert_eq!(PackedMatrix::pack_as(format, &w, 37, 50).unpack(), expected, "{format:?}");
        // The same panels from the checkpoint's [out, in] layout.
        assert_eq!(PackedMatrix::pack_out_in(format, &w_out_in, 50, 37).unpack(), expected, "{format:?}");
    }
}

#[test]
fn bf16_rounds_to_nearest_even() {
    assert_eq!(round(1.0), 0x3f80);
    // 1 + 2⁻⁸ lies halfway between 1 and 1 + 2⁻⁷: ties go to the even mantissa (1.0).
    assert_eq!(round(1.0 + 1.0 / 256.0), 0x3f80);
    assert_eq!(round(1.0 + 3.0 / 256.0), 0x3f82);
    assert_eq!(widen(round(-2.5)), -2.5);
    assert!(widen(round(f32::NAN)).is_nan());
    assert_eq!(widen(round(f32::INFINITY)), f32::INFINITY);
}

#[test]
fn every_kernel_matches_the_plain_product() {
    for format in [WeightFormat::F32, WeightFormat::Bf16] {
        let kernels = Kernel::available(format);
        println!("{format:?} kernels on this CPU: {kernels:?}");
        #[cfg(target_arch = "x86_64")]
        for (feature, kernel) in
            [("avx512f", Kernel::F32Avx512), ("avx512bf16", Kernel::Bf16Dot), ("amx-bf16 (granted, self-checked)", Kernel::Bf16Amx)]
        {
            let wanted = matches!(
                (format, kernel),
                (WeightFormat::F32, Kernel::F32Avx512) | (WeightFormat::Bf16, Kernel::Bf16Dot | Kernel::Bf16Amx)
            );
            if wanted && !kernels.contains(&kernel) {
                eprintln!("NOTE: this CPU has no {feature}: the {kernel:?} kernel is NOT exercised here");
            }
        }
        // Ragged shapes: rows that fill no tile or block, columns no panel, odd inputs,
        // inputs spanning several KC blocks, panels spanning several NC blocks (69 panels).
        for &(m, k, n) in &[(1, 5, 3), (13, 37, 50), (16, 384, 384), (125, 600, 17), (250, 64, 130), (7, 1201, 33), (130, 1100, 1100)] {
            let x = pseudo_random(m * k, 2);
            let w = pseudo_random(k * n, 3);
            let prior = pseudo_random(m * n, 4);
            let packed = PackedMatrix::pack_as(format, &w, k, n);
            let stored = packed.unpack();
            for &kernel in &kernels {
                // What the kernel multiplies: the stored weights, and bf16 activations for
                // the dot-product kernel.
                #[cfg(target_arch = "x86_64")]
                let x_used = if matches!(kernel, Kernel::Bf16Dot | Kernel::Bf16Amx) { rounded(&x) } else { x.clone() };
                #[cfg(not(target_arch = "x86_64"))]
                let x_used = x.clone();
                for read_dst in [true, false] {
                    let start = if read_dst { prior.clone() } else { vec![0.0; m * n] };
                    let expected = reference(&x_used, &stored, m, k, n, &start);
                    let mut y = if read_dst { prior.clone() } else { vec![f32::NAN; m * n] };
                    let activations = bf16::Activations::prepare(kernel, &x, m, k);
                    let job =
                        Job::of(&packed, activations.as_ptr(), activations.lda(), y.as_mut_ptr(), 0..m, 0..packed.panel_count(), read_dst);
                    // SAFETY: `kernel` is one this CPU has, for this format; `y` holds m × n floats and the ranges cover the product.
                    unsafe { kernel.run(&job) };
                    let worst = y.iter().zip(&expected).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
                    assert!(worst < 1e-4 * k as f32, "{kernel:?} {m}×{k}×{n} read_dst {read_dst}: {worst}");
                }
            }
            // The AMX kernel on the tile model, on every CPU: its packing, edge tiles and loop
            // order (the native kernel runs above where the CPU has AMX).
            if format == WeightFormat::Bf16 {
                for read_dst in [true, false] {
                    let start = if read_dst { prior.clone() } else { vec![0.0; m * n] };
                    let expected = reference(&rounded(&x), &stored, m, k, n, &start);
                    let mut y = if read_dst { prior.clone() } else { vec![f32::NAN; m * n] };
                    amx::product_on(&mut crate::kernels::amx::TileModel::new(), &packed, &x, m, &mut y, read_dst);
                    let worst = y.iter().zip(&expected).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
                    assert!(worst < 1e-4 * k as f32, "AMX on the tile model {m}×{k}×{n} read_dst {read_dst}: {worst}");
                }
            }
            // The threaded driver (rows or panels split) with the CPU's best kernel, against
            // f32 arithmetic on the stored weights (bf16 activations move it by < 1%).
            let expected = reference(&x, &stored, m, k, n, &prior);
            let mut y = prior.clone();
            // SAFETY: `y` holds m × n initialized floats.
            unsafe { packed.matmul(y.as_mut_ptr(), &x, m, true) };
            let tolerance = if format == WeightFormat::F32 { 1e-4 * k as f32 } else { 2e-2 * (k as f32).sqrt() };
            let worst = y.iter().zip(&expected).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(worst < tolerance, "threaded {format:?} {m}×{k}×{n}: {worst}");
        }
    }
}
