// poolserve's CUDA kernels for the flat, padding-free batch (see mod.rs for what each one
// replaces and why). Every kernel reads and writes the model's dtype T (float, half or
// bfloat16) and computes in float32, rounding once on the way out. Instantiated per dtype at
// the end of the file as `name_f32`, `name_f16`, `name_bf16`; compiled to PTX by build.rs.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#define FULL_MASK 0xffffffffu

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(FULL_MASK, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, offset));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32); every thread gets the result.
__device__ float block_sum(float v, float *scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // an earlier call's readers are done with scratch
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = lane < warps ? scratch[lane] : 0.f;
        w = warp_sum(w);
        if (lane == 0) scratch[0] = w;
    }
    __syncthreads();
    return scratch[0];
}

// The activations of `Activation` (activation.rs), same codes.
#define ACT_GELU 0
#define ACT_GELU_TANH 1
#define ACT_RELU 2
#define ACT_SILU 3
#define ACT_QUICK_GELU 4

__device__ __forceinline__ float activate(float x, int act) {
    switch (act) {
    case ACT_GELU: return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
    case ACT_GELU_TANH: return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    case ACT_RELU: return fmaxf(x, 0.f);
    case ACT_QUICK_GELU: return x / (1.f + expf(-1.702f * x));
    default: return x / (1.f + expf(-x));
    }
}

// out = act(x + bias) over a rows×cols matrix; bias (cols) may be null.
template <typename T>
__device__ void bias_activation(const T *x, const T *bias, T *out, int64_t n, int cols, int act) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float v = to_f(x[i]);
        if (bias) v += to_f(bias[i % cols]);
        out[i] = from_f<T>(activate(v, act));
    }
}

// out = x + bias + residual; bias (cols) and residual (rows×cols) may be null.
template <typename T>
__device__ void bias_residual(const T *x, const T *bias, const T *residual, T *out, int64_t n, int cols) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float v = to_f(x[i]);
        if (bias) v += to_f(bias[i % cols]);
        if (residual) v += to_f(residual[i]);
        out[i] = from_f<T>(v);
    }
}

// Gated linear unit: x is rows×(2·cols); out[r, c] = act(x[r, act_offset + c]) · x[r, up_offset + c].
template <typename T>
__device__ void gated(const T *x, T *out, int64_t n, int cols, int act, int act_on_first) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = i / cols;
        const int c = (int)(i % cols);
        const T *src = x + row * 2 * cols;
        const float a = to_f(src[act_on_first ? c : cols + c]);
        const float u = to_f(src[act_on_first ? cols + c : c]);
        out[i] = from_f<T>(activate(a, act) * u);
    }
}

// LayerNorm of (x + bias + residual), one block per row; bias and residual may be null.
// Dynamic shared memory: cols floats (the row, summed once, read three times).
template <typename T>
__device__ void layer_norm(const T *x, const T *bias, const T *residual, const T *gamma, const T *beta, T *out,
                           int cols, float eps) {
    extern __shared__ float row[];
    __shared__ float scratch[32];
    const int64_t base = (int64_t)blockIdx.x * cols;
    float sum = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = to_f(x[base + c]);
        if (bias) v += to_f(bias[c]);
        if (residual) v += to_f(residual[base + c]);
        row[c] = v;
        sum += v;
    }
    const float mean = block_sum(sum, scratch) / cols;
    float squares = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float d = row[c] - mean;
        squares += d * d;
    }
    const float inv = rsqrtf(block_sum(squares, scratch) / cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        out[base + c] = from_f<T>((row[c] - mean) * inv * to_f(gamma[c]) + to_f(beta[c]));
}

// RMSNorm, one block per row: out = x / sqrt(mean(x²) + eps) · weight.
template <typename T>
__device__ void rms_norm(const T *x, const T *weight, T *out, int cols, float eps) {
    __shared__ float scratch[32];
    const int64_t base = (int64_t)blockIdx.x * cols;
    float squares = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = to_f(x[base + c]);
        squares += v * v;
    }
    const float inv = rsqrtf(block_sum(squares, scratch) / cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) out[base + c] = from_f<T>(to_f(x[base + c]) * inv * to_f(weight[c]));
}

// Rotary embeddings (rotate-half) in place on the query and key heads at the start of each
// QKV row, each head RMS-normalized first when norm_weights is not null (Qwen3: head_dim
// query weights, then head_dim key weights). One warp per (token, head); cos and sin are
// tokens×half float tables.
template <typename T>
__device__ void rotary(T *qkv, const float *cos_table, const float *sin_table, const float *norm_weights, int tokens,
                       int width, int num_heads, int num_kv_heads, int head_dim, float eps) {
    const int lane = threadIdx.x & 31;
    const int warps = blockDim.x >> 5;
    const int heads = num_heads + num_kv_heads;
    const int half = head_dim / 2;
    const int64_t jobs = (int64_t)tokens * heads;
    for (int64_t job = (int64_t)blockIdx.x * warps + (threadIdx.x >> 5); job < jobs; job += (int64_t)gridDim.x * warps) {
        const int64_t token = job / heads;
        const int head = (int)(job % heads);
        T *x = qkv + token * width + (int64_t)head * head_dim;
        const float *cos_row = cos_table + token * half, *sin_row = sin_table + token * half;
        float inv = 1.f;
        const float *w = nullptr;
        if (norm_weights) {
            float squares = 0.f;
            for (int k = lane; k < head_dim; k += 32) {
                const float v = to_f(x[k]);
                squares += v * v;
            }
            inv = rsqrtf(warp_sum(squares) / head_dim + eps);
            w = norm_weights + (head < num_heads ? 0 : head_dim);
        }
        for (int k = lane; k < half; k += 32) {
            float x1 = to_f(x[k]) * inv, x2 = to_f(x[k + half]) * inv;
            if (w) {
                x1 *= w[k];
                x2 *= w[k + half];
            }
            const float c = cos_row[k], s = sin_row[k];
            x[k] = from_f<T>(x1 * c - x2 * s);
            x[k + half] = from_f<T>(x2 * c + x1 * s);
        }
    }
}

// Variable-length multi-head / grouped-query attention over fused QKV rows (queries, then
// keys, then values; bias of qkv's width or null), sequences delimited by cu_seqlens, no
// padding anywhere. A block takes ATT_QUERIES consecutive queries of one sequence (its tile,
// from `tiles`: sequence index, first query) and one head; each warp owns ATT_QUERIES_PER_WARP
// of them and walks the keys ATT_KEYS at a time with an online softmax, so memory is linear in
// the sequence length. A lane scores the key with its index, then the warp accumulates P·V
// with each lane owning head dimensions lane, lane+32, … (DIMS_PER_LANE of them: 4 for heads
// up to 128, 8 up to 256, 16 up to 512, one instantiation each so narrow heads keep their
// registers). The Q, K and V tiles live in dynamic shared memory sized for the head
// (attention_shared_bytes in mod.rs): 40 KiB at 128 dims, 160 KiB at 512, which the host
// opts the kernel into past the default 48 KiB.
#define ATT_KEYS 32
#define ATT_WARPS 4
#define ATT_QUERIES_PER_WARP 4
#define ATT_QUERIES (ATT_WARPS * ATT_QUERIES_PER_WARP)

#define MASK_BIDIRECTIONAL 0
#define MASK_CAUSAL 1
#define MASK_WINDOW 2
#define MASK_CAUSAL_WINDOW 3

__device__ __forceinline__ void key_range(int mask, int window, int i, int len, int *lo, int *hi) {
    switch (mask) {
    case MASK_CAUSAL: *lo = 0; *hi = i + 1; break;
    case MASK_WINDOW: *lo = max(0, i - window); *hi = min(len, i + window + 1); break;
    case MASK_CAUSAL_WINDOW: *lo = max(0, i + 1 - window); *hi = i + 1; break;
    default: *lo = 0; *hi = len;
    }
}

template <typename T, int DIMS_PER_LANE>
__device__ void attention(const T *qkv, const T *bias, T *out, const int *cu_seqlens, const int *tiles,
                          const float *position_bias, int position_max_len, int num_heads, int num_kv_heads,
                          int head_dim, int mask, int window, float scale) {
    extern __shared__ float tiles_s[];
    float *q_s = tiles_s;                                  // [ATT_QUERIES][head_dim]
    float *k_s = q_s + ATT_QUERIES * head_dim;             // [ATT_KEYS][head_dim + 1]: +1, lanes read a column without bank conflicts
    float *v_s = k_s + ATT_KEYS * (head_dim + 1);          // [ATT_KEYS][head_dim]
    const int k_stride = head_dim + 1;

    const int seq = tiles[2 * blockIdx.x], q0 = tiles[2 * blockIdx.x + 1];
    const int head = blockIdx.y;
    const int start = cu_seqlens[seq], len = cu_seqlens[seq + 1] - start;
    const int nq = min(ATT_QUERIES, len - q0);
    const int kv_head = head / (num_heads / num_kv_heads);
    const int qw = num_heads * head_dim, kvw = num_kv_heads * head_dim, width = qw + 2 * kvw;
    const int qc = head * head_dim, kc = qw + kv_head * head_dim, vc = qw + kvw + kv_head * head_dim;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float *relative = position_bias ? position_bias + (int64_t)head * (2 * position_max_len - 1) + position_max_len - 1 : nullptr;

    for (int i = tid; i < ATT_QUERIES * head_dim; i += blockDim.x) {
        const int r = i / head_dim, d = i % head_dim;
        float v = 0.f;
        if (r < nq) {
            v = to_f(qkv[(int64_t)(start + q0 + r) * width + qc + d]);
            if (bias) v += to_f(bias[qc + d]);
            v *= scale;
        }
        q_s[r * head_dim + d] = v;
    }
    // Keys any query of the tile may see.
    int lo_first, hi_first, lo_last, hi_last;
    key_range(mask, window, q0, len, &lo_first, &hi_first);
    key_range(mask, window, q0 + nq - 1, len, &lo_last, &hi_last);
    const int key_lo = min(lo_first, lo_last), key_hi = max(hi_first, hi_last);

    float m[ATT_QUERIES_PER_WARP], l[ATT_QUERIES_PER_WARP], acc[ATT_QUERIES_PER_WARP][DIMS_PER_LANE];
#pragma unroll
    for (int qi = 0; qi < ATT_QUERIES_PER_WARP; ++qi) {
        m[qi] = -INFINITY;
        l[qi] = 0.f;
#pragma unroll
        for (int c = 0; c < DIMS_PER_LANE; ++c) acc[qi][c] = 0.f;
    }

    for (int k0 = key_lo; k0 < key_hi; k0 += ATT_KEYS) {
        __syncthreads();  // Q is loaded, and every warp is done with the previous K/V tile
        for (int i = tid; i < ATT_KEYS * head_dim; i += blockDim.x) {
            const int j = i / head_dim, d = i % head_dim;
            float kv = 0.f, vv = 0.f;
            if (k0 + j < key_hi) {
                const int64_t row = (int64_t)(start + k0 + j) * width;
                kv = to_f(qkv[row + kc + d]);
                vv = to_f(qkv[row + vc + d]);
                if (bias) {
                    kv += to_f(bias[kc + d]);
                    vv += to_f(bias[vc + d]);
                }
            }
            k_s[j * k_stride + d] = kv;
            v_s[j * head_dim + d] = vv;
        }
        __syncthreads();
#pragma unroll
        for (int qi = 0; qi < ATT_QUERIES_PER_WARP; ++qi) {
            const int r = warp * ATT_QUERIES_PER_WARP + qi;
            if (r >= nq) break;  // uniform across the warp
            const int i = q0 + r;
            int lo, hi;
            key_range(mask, window, i, len, &lo, &hi);
            const int j = k0 + lane;
            float s = -INFINITY;
            if (j >= lo && j < hi) {
                float dot = 0.f;
                const float *q_row = q_s + r * head_dim, *k_row = k_s + lane * k_stride;
                for (int d = 0; d < head_dim; ++d) dot = fmaf(q_row[d], k_row[d], dot);
                if (relative) dot += relative[j - i];
                s = dot;
            }
            const float tile_max = warp_max(s);
            if (tile_max == -INFINITY) continue;  // no key of this tile is visible to query i
            const float m_new = fmaxf(m[qi], tile_max);
            const float p = s == -INFINITY ? 0.f : expf(s - m_new);
            const float correction = expf(m[qi] - m_new);  // 0 on the first visible tile
            l[qi] = l[qi] * correction + warp_sum(p);
            m[qi] = m_new;
#pragma unroll
            for (int c = 0; c < DIMS_PER_LANE; ++c) acc[qi][c] *= correction;
            for (int jj = 0; jj < ATT_KEYS; ++jj) {
                const float pj = __shfl_sync(FULL_MASK, p, jj);
#pragma unroll
                for (int c = 0; c < DIMS_PER_LANE; ++c) {
                    const int d = lane + 32 * c;
                    if (d < head_dim) acc[qi][c] = fmaf(pj, v_s[jj * head_dim + d], acc[qi][c]);
                }
            }
        }
    }
#pragma unroll
    for (int qi = 0; qi < ATT_QUERIES_PER_WARP; ++qi) {
        const int r = warp * ATT_QUERIES_PER_WARP + qi;
        if (r >= nq) break;
        const float inv = l[qi] > 0.f ? 1.f / l[qi] : 0.f;
        T *dst = out + (int64_t)(start + q0 + r) * qw + qc;
#pragma unroll
        for (int c = 0; c < DIMS_PER_LANE; ++c) {
            const int d = lane + 32 * c;
            if (d < head_dim) dst[d] = from_f<T>(acc[qi][c] * inv);
        }
    }
}

// attention_d{HEAD}_{SUFFIX}: heads up to HEAD dims.
#define ATTENTION(T, SUFFIX, HEAD, DIMS_PER_LANE)                                                                       \
    extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32)                                                         \
        attention_d##HEAD##_##SUFFIX(const T *qkv, const T *bias, T *out, const int *cu_seqlens, const int *tiles,      \
                                     const float *position_bias, int position_max_len, int num_heads,                  \
                                     int num_kv_heads, int head_dim, int mask, int window, float scale) {              \
        attention<T, DIMS_PER_LANE>(qkv, bias, out, cu_seqlens, tiles, position_bias, position_max_len, num_heads,     \
                                    num_kv_heads, head_dim, mask, window, scale);                                      \
    }

#define INSTANTIATE(T, SUFFIX)                                                                                          \
    extern "C" __global__ void bias_activation_##SUFFIX(const T *x, const T *bias, T *out, int64_t n, int cols,         \
                                                        int act) {                                                      \
        bias_activation<T>(x, bias, out, n, cols, act);                                                                 \
    }                                                                                                                   \
    extern "C" __global__ void bias_residual_##SUFFIX(const T *x, const T *bias, const T *residual, T *out, int64_t n, \
                                                      int cols) {                                                       \
        bias_residual<T>(x, bias, residual, out, n, cols);                                                              \
    }                                                                                                                   \
    extern "C" __global__ void gated_##SUFFIX(const T *x, T *out, int64_t n, int cols, int act, int act_on_first) {     \
        gated<T>(x, out, n, cols, act, act_on_first);                                                                   \
    }                                                                                                                   \
    extern "C" __global__ void layer_norm_##SUFFIX(const T *x, const T *bias, const T *residual, const T *gamma,        \
                                                   const T *beta, T *out, int cols, float eps) {                        \
        layer_norm<T>(x, bias, residual, gamma, beta, out, cols, eps);                                                  \
    }                                                                                                                   \
    extern "C" __global__ void rms_norm_##SUFFIX(const T *x, const T *weight, T *out, int cols, float eps) {            \
        rms_norm<T>(x, weight, out, cols, eps);                                                                         \
    }                                                                                                                   \
    extern "C" __global__ void rotary_##SUFFIX(T *qkv, const float *cos_table, const float *sin_table,                  \
                                               const float *norm_weights, int tokens, int width, int num_heads,           \
                                               int num_kv_heads, int head_dim, float eps) {                             \
        rotary<T>(qkv, cos_table, sin_table, norm_weights, tokens, width, num_heads, num_kv_heads, head_dim, eps);      \
    }                                                                                                                   \
    ATTENTION(T, SUFFIX, 128, 4)                                                                                        \
    ATTENTION(T, SUFFIX, 256, 8)                                                                                        \
    ATTENTION(T, SUFFIX, 512, 16)

INSTANTIATE(float, f32)
INSTANTIATE(__half, f16)
INSTANTIATE(__nv_bfloat16, bf16)
