//! A DeBERTa-v2/v3 tokenizer from its SentencePiece model (`spm.model`), for folders published
//! without `tokenizer.json` (microsoft/deberta-v3-*, and fine-tunes saved by the slow
//! tokenizer): the tokenizer transformers 5's `DebertaV2Tokenizer` builds from that file, written
//! as a `tokenizer.json` document and loaded by the `tokenizers` crate like any other.
//!
//! transformers 5 builds it as: a Unigram model over the file's pieces and scores (the unknown
//! token at `[UNK]`'s index); normalizer `[Lowercase if do_lower_case] → Replace(\s{2,} or a
//! newline, CR or tab → " ") → NFC → Strip(right)`; pre-tokenizer `[Punctuation if
//! split_by_punct] → Metaspace("▁", always, or first without add_prefix_space)`; post-processor
//! `[CLS] A [SEP]` / `[CLS] A [SEP] B [SEP]` with type ids 0 and 1; the special tokens named in
//! tokenizer_config.json as added tokens (ids past the vocabulary for those it lacks, as
//! `[MASK]` is at 128000 in deberta-v3). The file is a protobuf `ModelProto`; only its pieces
//! (field 1: `piece` 1, `score` 2) are read, by the few lines of wire-format decoding below
//! (a protobuf crate and its code generation would be the only other use of one here).

use serde_json::{json, Value};

/// A malformed `spm.model`.
#[derive(Debug, thiserror::Error)]
#[error("spm.model: {0}")]
pub struct SpmError(String);

/// One protobuf field: its number and its value (varints and fixed-width values as u64,
/// length-delimited ones as bytes).
enum Field<'a> {
    Number(u64),
    Bytes(&'a [u8]),
}

/// Reads a base-128 varint at `*at`.
fn varint(data: &[u8], at: &mut usize) -> Result<u64, SpmError> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *data.get(*at).ok_or_else(|| SpmError("truncated varint".into()))?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(SpmError("varint longer than 64 bits".into()))
}

/// The fields of one message, in order.
fn fields(data: &[u8]) -> Result<Vec<(u64, Field<'_>)>, SpmError> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let key = varint(data, &mut at)?;
        let (number, wire) = (key >> 3, key & 7);
        let fixed = |at: &mut usize, n: usize| -> Result<u64, SpmError> {
            let bytes = data.get(*at..*at + n).ok_or_else(|| SpmError("truncated fixed-width field".into()))?;
            *at += n;
            Ok(bytes.iter().rev().fold(0u64, |v, b| (v << 8) | u64::from(*b)))
        };
        let value = match wire {
            0 => Field::Number(varint(data, &mut at)?),
            1 => Field::Number(fixed(&mut at, 8)?),
            5 => Field::Number(fixed(&mut at, 4)?),
            2 => {
                let len = usize::try_from(varint(data, &mut at)?).map_err(|_| SpmError("field too long".into()))?;
                let bytes = data.get(at..at.saturating_add(len)).ok_or_else(|| SpmError("truncated field".into()))?;
                at += len;
                Field::Bytes(bytes)
            }
            other => return Err(SpmError(format!("unsupported wire type {other}"))),
        };
        out.push((number, value));
    }
    Ok(out)
}

/// The model's pieces and their scores, in id order.
pub fn pieces(spm: &[u8]) -> Result<Vec<(String, f32)>, SpmError> {
    let mut out = Vec::new();
    for (number, field) in fields(spm)? {
        let (1, Field::Bytes(message)) = (number, field) else { continue };
        let (mut piece, mut score) = (None, 0f32);
        for (number, field) in fields(message)? {
            match (number, field) {
                (1, Field::Bytes(text)) => {
                    piece = Some(String::from_utf8(text.to_vec()).map_err(|_| SpmError("a piece is not UTF-8".into()))?)
                }
                (2, Field::Number(bits)) => score = f32::from_bits(bits as u32),
                _ => {}
            }
        }
        out.push((piece.ok_or_else(|| SpmError("a piece without text".into()))?, score));
    }
    if out.is_empty() {
        return Err(SpmError("no pieces".into()));
    }
    Ok(out)
}

/// The `tokenizer.json` document transformers 5's `DebertaV2Tokenizer` makes of `spm` with
/// the options of `tokenizer_config` (`do_lower_case`, `split_by_punct`, `add_prefix_space`,
/// the special tokens).
pub fn deberta_v2_tokenizer_json(spm: &[u8], tokenizer_config: &Value) -> Result<String, SpmError> {
    let vocab = pieces(spm)?;
    let flag = |name: &str, default: bool| tokenizer_config.get(name).and_then(Value::as_bool).unwrap_or(default);
    let token = |name: &str, default: &str| super::tokenizer::special_token(tokenizer_config, name).unwrap_or_else(|| default.to_string());
    let index = |text: &str| vocab.iter().position(|(piece, _)| piece == text);
    let (cls, sep, unk) = (token("cls_token", "[CLS]"), token("sep_token", "[SEP]"), token("unk_token", "[UNK]"));

    // The special tokens, at their vocabulary index, else where tokenizer_config.json's
    // added_tokens_decoder puts them, else after the vocabulary.
    let decoder_id = |text: &str| {
        tokenizer_config.get("added_tokens_decoder").and_then(Value::as_object).and_then(|m| {
            m.iter().find(|(_, v)| v.get("content").and_then(Value::as_str) == Some(text)).and_then(|(id, _)| id.parse::<usize>().ok())
        })
    };
    let mut specials: Vec<(usize, String)> = Vec::new();
    for (name, default) in [
        ("pad_token", "[PAD]"),
        ("cls_token", "[CLS]"),
        ("sep_token", "[SEP]"),
        ("unk_token", "[UNK]"),
        ("mask_token", "[MASK]"),
        ("bos_token", "[CLS]"),
        ("eos_token", "[SEP]"),
    ] {
        let text = token(name, default);
        if specials.iter().any(|(_, t)| *t == text) {
            continue;
        }
        let next = vocab.len() + specials.iter().filter(|(id, _)| *id >= vocab.len()).count();
        let id = index(&text).or_else(|| decoder_id(&text)).unwrap_or(next);
        specials.push((id, text));
    }
    specials.sort();
    let id_of = |text: &str| specials.iter().find(|(_, t)| t == text).map(|(id, _)| *id).unwrap_or(0);

    let mut normalizers = Vec::new();
    if flag("do_lower_case", false) {
        normalizers.push(json!({"type": "Lowercase"}));
    }
    normalizers.push(json!({"type": "Replace", "pattern": {"Regex": "\\s{2,}|[\\n\\r\\t]"}, "content": " "}));
    normalizers.push(json!({"type": "NFC"}));
    normalizers.push(json!({"type": "Strip", "strip_left": false, "strip_right": true}));
    let prepend = if flag("add_prefix_space", true) { "always" } else { "first" };
    let metaspace = json!({"type": "Metaspace", "replacement": "▁", "prepend_scheme": prepend, "split": true});
    let mut pre_tokenizers = Vec::new();
    if flag("split_by_punct", false) {
        pre_tokenizers.push(json!({"type": "Punctuation", "behavior": "Isolated"}));
    }
    pre_tokenizers.push(metaspace.clone());
    let special = |text: &str, type_id: u32| json!({"SpecialToken": {"id": text, "type_id": type_id}});
    let sequence = |id: &str, type_id: u32| json!({"Sequence": {"id": id, "type_id": type_id}});
    let document = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": specials.iter().map(|(id, text)| json!({
            "id": id, "content": text, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true
        })).collect::<Vec<_>>(),
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": pre_tokenizers},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [special(&cls, 0), sequence("A", 0), special(&sep, 0)],
            "pair": [special(&cls, 0), sequence("A", 0), special(&sep, 0), sequence("B", 1), special(&sep, 1)],
            "special_tokens": {
                cls.clone(): {"id": cls, "ids": [id_of(&cls)], "tokens": [cls]},
                sep.clone(): {"id": sep, "ids": [id_of(&sep)], "tokens": [sep]},
            },
        },
        "decoder": metaspace,
        "model": {
            "type": "Unigram",
            "unk_id": index(&unk).unwrap_or(1),
            "vocab": vocab.iter().map(|(piece, score)| json!([piece, score])).collect::<Vec<_>>(),
            "byte_fallback": false,
        },
    });
    Ok(document.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-built ModelProto: two pieces (one with a score), and a trainer spec to skip.
    fn proto() -> Vec<u8> {
        let piece = |text: &str, score: Option<f32>| {
            let mut m = vec![0x0a, text.len() as u8];
            m.extend(text.as_bytes());
            if let Some(s) = score {
                m.push(0x15);
                m.extend(s.to_le_bytes());
            }
            m.extend([0x18, 0x01]); // type NORMAL
            m
        };
        let mut out = Vec::new();
        for p in [piece("[UNK]", None), piece("▁hi", Some(-1.5))] {
            out.push(0x0a);
            out.push(p.len() as u8);
            out.extend(p);
        }
        out.extend([0x12, 0x02, 0x18, 0x01]); // trainer_spec { model_type: UNIGRAM }
        out
    }

    #[test]
    fn reads_pieces_and_scores() {
        assert_eq!(pieces(&proto()).unwrap(), vec![("[UNK]".to_string(), 0.0), ("▁hi".to_string(), -1.5)]);
        assert!(pieces(&proto()[..5]).is_err(), "a truncated file is an error, not a panic");
        assert!(pieces(&[]).is_err());
    }

    #[test]
    fn the_document_loads_and_adds_missing_specials_after_the_vocabulary() {
        let document = deberta_v2_tokenizer_json(&proto(), &json!({})).unwrap();
        let tokenizer: tokenizers::Tokenizer = document.parse().unwrap();
        assert_eq!(tokenizer.token_to_id("[UNK]"), Some(0));
        assert_eq!(tokenizer.token_to_id("[PAD]"), Some(2));
        let ids = tokenizer.encode("hi", true).unwrap().get_ids().to_vec();
        let (cls, sep) = (tokenizer.token_to_id("[CLS]").unwrap(), tokenizer.token_to_id("[SEP]").unwrap());
        assert_eq!(ids, vec![cls, 1, sep]);
    }
}
