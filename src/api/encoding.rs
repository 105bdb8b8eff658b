//! How an embedding leaves the server besides a list of floats: Cohere's `embedding_types`
//! (int8, uint8, binary, ubinary, base64) and vLLM's `encoding_format` (`float`, `base64`,
//! `bytes`, `bytes_only`) with `embed_dtype` / `endianness` on `/v1/embeddings` and `/pooling`.
//!
//! - **bytes / bytes_only** (vLLM) answer `application/octet-stream`: every output's elements
//!   in `embed_dtype` and `endianness`, one after another in input order. `bytes` adds a
//!   `metadata` header, the JSON `{"id", "created", "model", "data": [{"index", "embed_dtype",
//!   "endianness", "start", "end", "shape"}], "usage"}` locating each output in the body
//!   (`start`/`end` in bytes); `bytes_only` sends the body alone (a client that knows the
//!   shapes slices it itself).
//!
//! - **binary / ubinary** are sentence-transformers' `quantize_embeddings`: `ubinary` =
//!   `numpy.packbits(x > 0)` (8 dimensions a byte, the first one in the high bit; a width that
//!   is not a multiple of 8 is padded with zero bits), `binary` = that minus 128 as int8.
//! - **int8 / uint8 [decision]** are a per-vector scalar quantization that tracks the float
//!   vector: `int8 = round(127 · x / max|x|)`, `uint8 = round(127.5 · x / max|x| + 127.5)`.
//!   The scale uses the whole int8 range whatever the vector's magnitude, so the cosine of the
//!   quantized vector to the float one stays above 0.999 (sentence-transformers' int8 instead
//!   calibrates per dimension on a corpus, which a server answering one request cannot do).
//!   Compare such vectors by cosine, not by raw dot product.
//! - **base64** is the float32 little-endian bytes, base64-encoded (Cohere's and OpenAI's).

use crate::engine::params::optional;
use base64::Engine as _;
use half::{bf16, f16};
use serde::{Deserialize, Serialize};

/// ubinary: the sign bits of `x > 0`, packed 8 to a byte, most significant bit first.
pub fn ubinary(v: &[f32]) -> Vec<u8> {
    v.chunks(8).map(|chunk| chunk.iter().enumerate().fold(0u8, |byte, (i, &x)| if x > 0.0 { byte | (0x80 >> i) } else { byte })).collect()
}

/// binary: ubinary shifted into int8 (`ubinary − 128`).
pub fn binary(v: &[f32]) -> Vec<i8> {
    ubinary(v).into_iter().map(|b| (b as i16 - 128) as i8).collect()
}

fn scale(v: &[f32]) -> f32 {
    let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    if max > 0.0 && max.is_finite() {
        1.0 / max
    } else {
        0.0
    }
}

/// int8: `round(127 · x / max|x|)`.
pub fn int8(v: &[f32]) -> Vec<i8> {
    let s = 127.0 * scale(v);
    v.iter().map(|&x| (x * s).round().clamp(-127.0, 127.0) as i8).collect()
}

/// uint8: `round(127.5 · x / max|x| + 127.5)`.
pub fn uint8(v: &[f32]) -> Vec<u8> {
    let s = 127.5 * scale(v);
    v.iter().map(|&x| (x * s + 127.5).round().clamp(0.0, 255.0) as u8).collect()
}

/// The float32 little-endian bytes, base64-encoded (what the OpenAI SDK decodes with numpy).
pub fn base64_f32(v: &[f32]) -> String {
    base64_bytes(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
}

fn base64_bytes(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// vLLM's `encoding_format`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EncodingFormat {
    #[default]
    Float,
    Base64,
    Bytes,
    BytesOnly,
}

/// vLLM's `embed_dtype`: the element type of base64 and bytes outputs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EmbedDtype {
    #[default]
    Float32,
    Float16,
    Bfloat16,
    /// float8 e4m3 "fn" (no infinities; torch.float8_e4m3fn), as vLLM encodes it.
    Fp8E4m3,
    /// float8 e5m2 (torch.float8_e5m2).
    Fp8E5m2,
}

const DTYPES: [(&str, EmbedDtype); 5] = [
    ("float32", EmbedDtype::Float32),
    ("float16", EmbedDtype::Float16),
    ("bfloat16", EmbedDtype::Bfloat16),
    ("fp8_e4m3", EmbedDtype::Fp8E4m3),
    ("fp8_e5m2", EmbedDtype::Fp8E5m2),
];

/// vLLM's `endianness` of base64 and bytes outputs; `native` is this server's (little on
/// x86-64 and arm64).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Endianness {
    #[default]
    Native,
    Little,
    Big,
}

const ENDIANNESS: [(&str, Endianness); 3] = [("native", Endianness::Native), ("little", Endianness::Little), ("big", Endianness::Big)];

/// The encoding fields of a request (`/v1/embeddings`, `/pooling`), each a vLLM literal.
#[derive(Debug, Clone, Copy, Default, Deserialize, utoipa::ToSchema)]
pub struct EncodingParams {
    /// `float` (default), `base64`, `bytes` or `bytes_only`.
    #[serde(default, deserialize_with = "encoding_format")]
    #[schema(value_type = Option<String>)]
    pub encoding_format: Option<EncodingFormat>,
    /// vLLM: element type of base64 and bytes outputs (float32, float16, bfloat16, fp8_e4m3, fp8_e5m2).
    #[serde(default, deserialize_with = "embed_dtype")]
    #[schema(value_type = Option<String>)]
    pub embed_dtype: Option<EmbedDtype>,
    /// vLLM: byte order of base64 and bytes outputs (native, little, big).
    #[serde(default, deserialize_with = "endianness")]
    #[schema(value_type = Option<String>)]
    pub endianness: Option<Endianness>,
}

fn encoding_format<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<EncodingFormat>, D::Error> {
    let formats = [
        ("float", EncodingFormat::Float),
        ("base64", EncodingFormat::Base64),
        ("bytes", EncodingFormat::Bytes),
        ("bytes_only", EncodingFormat::BytesOnly),
    ];
    optional(d, "encoding_format", &formats)
}

fn embed_dtype<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<EmbedDtype>, D::Error> {
    optional(d, "embed_dtype", &DTYPES)
}

fn endianness<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Endianness>, D::Error> {
    optional(d, "endianness", &ENDIANNESS)
}

/// One output as JSON: floats, or the bytes of [`bytes_as`] in base64.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum EncodedValue {
    Float(Vec<f32>),
    Tokens(Vec<Vec<f32>>),
    Base64(String),
}

impl EncodingParams {
    pub fn format(&self) -> EncodingFormat {
        self.encoding_format.unwrap_or_default()
    }

    /// Whether the response is a binary body ([`bytes_body`]) rather than JSON.
    pub fn is_bytes(&self) -> bool {
        matches!(self.format(), EncodingFormat::Bytes | EncodingFormat::BytesOnly)
    }

    /// A vector for a JSON response.
    pub fn vector(&self, v: Vec<f32>) -> EncodedValue {
        match self.format() {
            EncodingFormat::Base64 => EncodedValue::Base64(base64_bytes(&self.bytes(&v))),
            _ => EncodedValue::Float(v),
        }
    }

    /// A matrix (one row per token) for a JSON response; base64 holds its rows one after
    /// another, as vLLM encodes a 2-D tensor.
    pub fn matrix(&self, rows: Vec<Vec<f32>>) -> EncodedValue {
        match self.format() {
            EncodingFormat::Base64 => EncodedValue::Base64(base64_bytes(&rows.iter().flat_map(|r| self.bytes(r)).collect::<Vec<u8>>())),
            _ => EncodedValue::Tokens(rows),
        }
    }

    /// `v` as `embed_dtype` elements in `endianness` byte order.
    pub fn bytes(&self, v: &[f32]) -> Vec<u8> {
        bytes_as(v, self.embed_dtype.unwrap_or_default(), self.endianness.unwrap_or_default())
    }

    fn dtype_name(&self) -> &'static str {
        let dtype = self.embed_dtype.unwrap_or_default();
        DTYPES.iter().find(|(_, d)| *d == dtype).map_or("float32", |(n, _)| n)
    }

    fn endianness_name(&self) -> &'static str {
        let endianness = self.endianness.unwrap_or_default();
        ENDIANNESS.iter().find(|(_, e)| *e == endianness).map_or("native", |(n, _)| n)
    }
}

/// What a `bytes` response says of one output: where its elements lie in the body.
#[derive(Debug, Serialize)]
struct BytesItem {
    index: usize,
    embed_dtype: &'static str,
    endianness: &'static str,
    start: usize,
    end: usize,
    shape: Vec<usize>,
}

/// The body and (for `bytes`, not `bytes_only`) the `metadata` header of a binary response:
/// `outputs` are `(shape, elements)` in input order; `envelope` holds the response's `id`,
/// `created`, `model` and `usage`, to which the items are added as `data`.
pub fn bytes_body(
    encoding: &EncodingParams,
    outputs: &[(Vec<usize>, &[f32])],
    mut envelope: serde_json::Map<String, serde_json::Value>,
) -> (Vec<u8>, Option<String>) {
    let mut body = Vec::new();
    let mut items = Vec::with_capacity(outputs.len());
    for (index, (shape, values)) in outputs.iter().enumerate() {
        let start = body.len();
        body.extend(encoding.bytes(values));
        items.push(BytesItem {
            index,
            embed_dtype: encoding.dtype_name(),
            endianness: encoding.endianness_name(),
            start,
            end: body.len(),
            shape: shape.clone(),
        });
    }
    let metadata = (encoding.format() == EncodingFormat::Bytes).then(|| {
        envelope.insert("data".into(), serde_json::to_value(&items).unwrap_or_default());
        serde_json::Value::Object(envelope).to_string()
    });
    (body, metadata)
}

impl Endianness {
    fn big(self) -> bool {
        match self {
            Endianness::Native => cfg!(target_endian = "big"),
            Endianness::Little => false,
            Endianness::Big => true,
        }
    }
}

/// The embedding as `dtype` elements in `endianness` byte order, base64-encoded.
pub fn base64_as(v: &[f32], dtype: EmbedDtype, endianness: Endianness) -> String {
    base64_bytes(&bytes_as(v, dtype, endianness))
}

/// The embedding as `dtype` elements in `endianness` byte order.
pub fn bytes_as(v: &[f32], dtype: EmbedDtype, endianness: Endianness) -> Vec<u8> {
    let big = endianness.big();
    match dtype {
        EmbedDtype::Float32 => v.iter().flat_map(|x| if big { x.to_be_bytes() } else { x.to_le_bytes() }).collect(),
        EmbedDtype::Float16 => v
            .iter()
            .flat_map(|&x| {
                let h = f16::from_f32(x);
                if big {
                    h.to_be_bytes()
                } else {
                    h.to_le_bytes()
                }
            })
            .collect(),
        EmbedDtype::Bfloat16 => v
            .iter()
            .flat_map(|&x| {
                let h = bf16::from_f32(x);
                if big {
                    h.to_be_bytes()
                } else {
                    h.to_le_bytes()
                }
            })
            .collect(),
        EmbedDtype::Fp8E4m3 => v.iter().map(|&x| fp8(x, Fp8::E4m3)).collect(),
        EmbedDtype::Fp8E5m2 => v.iter().map(|&x| fp8(x, Fp8::E5m2)).collect(),
    }
}

#[derive(Clone, Copy)]
enum Fp8 {
    E4m3,
    E5m2,
}

/// float32 → float8 with round-to-nearest-even, as torch converts: e4m3fn has no infinities
/// (overflow and infinity saturate to ±448; NaN is 0x7f), e5m2 overflows to infinity.
fn fp8(x: f32, format: Fp8) -> u8 {
    let (mantissa_bits, bias) = match format {
        Fp8::E4m3 => (3i32, 7i32),
        Fp8::E5m2 => (2, 15),
    };
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    if x.is_nan() {
        return sign | 0x7f;
    }
    let a = x.abs();
    let overflow = match format {
        Fp8::E4m3 => sign | 0x7e,
        Fp8::E5m2 => sign | 0x7c,
    };
    if a.is_infinite() {
        return overflow;
    }
    if a == 0.0 {
        return sign;
    }
    // The binade of `a`, never below the smallest normal one (subnormals share its quantum).
    let exponent = (((a.to_bits() >> 23) & 0xff) as i32 - 127).max(1 - bias);
    // `a` in units of the format's spacing in that binade (a power of two: exact).
    let units = (a * 2f32.powi(mantissa_bits - exponent)).round_ties_even() as u32;
    let (exponent, units) = if units >= 2 << mantissa_bits { (exponent + 1, units >> 1) } else { (exponent, units) };
    let implicit = 1u32 << mantissa_bits;
    let (field, mantissa) = if units < implicit { (0, units) } else { ((exponent + bias) as u32, units - implicit) };
    let code = (field << mantissa_bits) | mantissa;
    let max_code = match format {
        Fp8::E4m3 => 0x7e,
        Fp8::E5m2 => 0x7b,
    };
    if code > max_code {
        return overflow;
    }
    sign | code as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_packs_sign_bits_high_bit_first() {
        // numpy.packbits([1,0,0,0,0,0,0,1, 1]) == [129, 128]
        let v = [0.5, -0.1, 0.0, -2.0, -1.0, -1.0, -1.0, 0.3, 0.1];
        assert_eq!(ubinary(&v), vec![129, 128]);
        assert_eq!(binary(&v), vec![1, 0]);
        assert_eq!(ubinary(&[-1.0; 8]), vec![0]);
        assert_eq!(binary(&[-1.0; 8]), vec![-128]);
    }

    #[test]
    fn scalar_quantization_tracks_the_vector() {
        let v = [0.5, -0.25, 0.0, 0.125];
        assert_eq!(int8(&v), vec![127, -64, 0, 32]);
        assert_eq!(uint8(&v), vec![255, 64, 128, 159]);
        assert_eq!(int8(&[0.0, 0.0]), vec![0, 0]);
        assert_eq!(uint8(&[0.0]), vec![128]);
    }

    #[test]
    fn base64_dtypes_and_byte_order() {
        assert_eq!(base64_f32(&[1.0]), "AACAPw==");
        assert_eq!(base64_as(&[1.0], EmbedDtype::Float32, Endianness::Little), "AACAPw==");
        assert_eq!(base64_as(&[1.0], EmbedDtype::Float32, Endianness::Big), "P4AAAA==");
        // 1.0 in float16 is 0x3c00, in bfloat16 0x3f80.
        assert_eq!(base64_as(&[1.0], EmbedDtype::Float16, Endianness::Little), base64_bytes(&[0x00, 0x3c]));
        assert_eq!(base64_as(&[1.0], EmbedDtype::Bfloat16, Endianness::Big), base64_bytes(&[0x3f, 0x80]));
    }

    #[test]
    fn fp8_matches_torch_conversions() {
        // Values and codes from torch.tensor(x).to(torch.float8_e4m3fn / float8_e5m2).view(torch.uint8).
        let e4m3 = [
            (1.0, 0x38),
            (-1.0, 0xb8),
            (0.1, 0x1d),
            (448.0, 0x7e),
            (500.0, 0x7e),
            (f32::INFINITY, 0x7e),
            (-1e6, 0xfe),
            (0.3, 0x2a),
            (-0.007, 0x84),
            (0.001953125, 0x01),
            (0.0009765625, 0x00),
            (0.0, 0x00),
            (1.0625, 0x38),
            (1.1875, 0x3a),
            (f32::NAN, 0x7f),
        ];
        for (x, code) in e4m3 {
            assert_eq!(fp8(x, Fp8::E4m3), code, "e4m3 {x}");
        }
        let e5m2 = [
            (1.0, 0x3c),
            (-1.0, 0xbc),
            (0.1, 0x2e),
            (57344.0, 0x7b),
            (70000.0, 0x7c),
            (61440.0, 0x7c),
            (0.3, 0x35),
            (-0.007, 0x9f),
            (1e-6, 0x00),
            (1.125, 0x3c),
            (1.375, 0x3e),
            (f32::INFINITY, 0x7c),
        ];
        for (x, code) in e5m2 {
            assert_eq!(fp8(x, Fp8::E5m2), code, "e5m2 {x}");
        }
    }
}
