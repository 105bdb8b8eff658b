//! Micro-benchmark of the fused CPU kernels at all-MiniLM-L6-v2 shapes (32 sequences × 128
//! tokens, hidden 384, 12 heads, intermediate 1536): shows where a forward pass spends its time.
//! `cargo bench --bench ops`.

use candle_core::{Device, Tensor};
use poolserve::kernels::{with_cpu_weight_format, Activation, Attention, AttentionMask, LayerNorm, Linear, WeightFormat};
use std::time::Instant;

fn tensor(rows: usize, cols: usize) -> Tensor {
    let data: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
    Tensor::from_vec(data, (rows, cols), &Device::Cpu).expect("tensor")
}

fn time(name: &str, flops: f64, mut f: impl FnMut()) {
    for _ in 0..3 {
        f();
    }
    let n = 20;
    let start = Instant::now();
    for _ in 0..n {
        f();
    }
    let per = start.elapsed().as_secs_f64() / n as f64;
    if flops > 0.0 {
        println!("{name:<28} {:>8.3} ms  {:>6.1} GFLOP/s", per * 1e3, flops / per / 1e9);
    } else {
        println!("{name:<28} {:>8.3} ms", per * 1e3);
    }
}

fn main() {
    let (t, h, i) = (4096usize, 384usize, 1536usize);
    let x = tensor(t, h);
    let inter = tensor(t, i);
    let bias = |n| Tensor::from_vec(vec![0.1f32; n], n, &Device::Cpu).expect("bias");
    let qkv = Linear::new(tensor(3 * h, h), Some(bias(3 * h))).expect("qkv");
    let out = Linear::new(tensor(h, h), Some(bias(h))).expect("out");
    let up = Linear::new(tensor(i, h), Some(bias(i))).expect("up");
    let down = Linear::new(tensor(h, i), Some(bias(h))).expect("down");
    let norm = LayerNorm::new(bias(h), bias(h), 1e-12).expect("norm");
    let cu: Vec<usize> = (0..=32).map(|s| s * 128).collect();
    let attention = Attention {
        num_heads: 12,
        num_kv_heads: 12,
        head_dim: 32,
        cu_seqlens: &cu,
        mask: AttentionMask::Bidirectional,
        position_bias: None,
        disentangled: None,
        softcap: None,
    };
    let qkv_out = qkv.forward_unbiased(&x).expect("qkv");

    println!("per-layer kernels at 32x128 tokens (a MiniLM forward runs each 6 times)");
    time("qkv linear 384->1152", 2.0 * (t * h * 3 * h) as f64, || drop(qkv.forward_unbiased(&x)));
    time("attention 12 heads (+bias)", 4.0 * (32 * 128 * 128 * h) as f64, || drop(attention.forward(&qkv_out, qkv.bias())));
    time("out linear + residual", 2.0 * (t * h * h) as f64, || drop(out.forward_add(&x, &x)));
    let mut normed = x.copy().expect("copy");
    time("layer norm (in place)", 0.0, || normed = norm.forward(normed.clone()).expect("norm"));
    time("up linear 384->1536", 2.0 * (t * h * i) as f64, || drop(up.forward_unbiased(&x)));
    let mut activated = inter.copy().expect("copy");
    time("bias + gelu (in place)", 0.0, || activated = Activation::Gelu.forward_biased(activated.clone(), up.bias()).expect("gelu"));
    time("down linear + residual", 2.0 * (t * h * i) as f64, || drop(down.forward_add(&inter, &x)));

    // `--quantization int8`: the same products on this CPU's int8 kernel (ops counted as if f32).
    let int8 = |l: &Linear| {
        let mut q = l.clone();
        q.quantize_int8().expect("int8");
        q
    };
    let (qkv8, out8, up8, down8) = (int8(&qkv), int8(&out), int8(&up), int8(&down));
    println!("int8 linears at 32x128 tokens");
    time("qkv linear 384->1152", 2.0 * (t * h * 3 * h) as f64, || drop(qkv8.forward_unbiased(&x)));
    time("out linear + residual", 2.0 * (t * h * h) as f64, || drop(out8.forward_add(&x, &x)));
    time("up linear 384->1536", 2.0 * (t * h * i) as f64, || drop(up8.forward_unbiased(&x)));
    time("down linear + residual", 2.0 * (t * h * i) as f64, || drop(down8.forward_add(&inter, &x)));

    // A 16-token query: the weights dominate the traffic, the arithmetic is small.
    let q = 16usize;
    let (xq, interq) = (tensor(q, h), tensor(q, i));
    for (precision, [qkv, out, up, down]) in [("f32", [&qkv, &out, &up, &down]), ("int8", [&qkv8, &out8, &up8, &down8])] {
        println!("{precision} linears at 1x16 tokens");
        time("qkv linear 384->1152", 2.0 * (q * h * 3 * h) as f64, || drop(qkv.forward_unbiased(&xq)));
        time("out linear + residual", 2.0 * (q * h * h) as f64, || drop(out.forward_add(&xq, &xq)));
        time("up linear 384->1536", 2.0 * (q * h * i) as f64, || drop(up.forward_unbiased(&xq)));
        time("down linear + residual", 2.0 * (q * h * i) as f64, || drop(down.forward_add(&interq, &xq)));
    }

    // `--dtype bfloat16` at EmbeddingGemma 2's shapes (hidden 512, q 1024 + k, v 512, GeGLU
    // 2048), 8×128 tokens: the products that take most of its forward.
    let (t, h, q, i) = (1024usize, 512usize, 1024usize, 2048usize);
    let bf16 = |rows, cols| with_cpu_weight_format(WeightFormat::Bf16, || Linear::new(tensor(rows, cols), None).expect("bf16"));
    let (qkv, o, gate_up, down) = (bf16(q + 2 * h, h), bf16(h, q), bf16(2 * i, h), bf16(h, i));
    let (x, attended, inter) = (tensor(t, h), tensor(t, q), tensor(t, i));
    println!("bf16 linears at 8x128 tokens, EmbeddingGemma 2 shapes");
    time("qkv linear 512->2048", 2.0 * (t * h * (q + 2 * h)) as f64, || drop(qkv.forward_unbiased(&x)));
    time("out linear 1024->512 + res", 2.0 * (t * q * h) as f64, || drop(o.forward_add(&attended, &x)));
    time("gate+up linear 512->4096", 2.0 * (t * h * 2 * i) as f64, || drop(gate_up.forward_unbiased(&x)));
    time("down linear 2048->512 + res", 2.0 * (t * i * h) as f64, || drop(down.forward_add(&inter, &x)));

    // `--dtype bfloat16` at Gemma-2B's shapes (ColPali's language model: hidden 2048, GeGLU
    // 16384), one page of 1,036 tokens: the products that take most of a page's time.
    let (t, h, i) = (1036usize, 2048usize, 16384usize);
    let (gate_up, down) = (bf16(2 * i, h), bf16(h, i));
    let (x, inter) = (tensor(t, h), tensor(t, i));
    println!("bf16 linears at one ColPali page (1036 tokens), Gemma-2B shapes");
    time("gate+up linear 2048->32768", 2.0 * (t * h * 2 * i) as f64, || drop(gate_up.forward_unbiased(&x)));
    time("down linear 16384->2048 + res", 2.0 * (t * i * h) as f64, || drop(down.forward_add(&inter, &x)));
}
