//! Texts, pairs and token ids through three real tokenizer kinds (BERT's WordPiece, Qwen2's
//! byte-level BPE, XLM-R's Unigram), with truncation and offsets: the first byte picks the
//! options, the rest is split at the first NUL into a query and a document. Never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use poolserve::input::tokenizer::{EncodeOptions, TextInput, TextTokenizer, TruncationSide};
use std::sync::LazyLock;

static TOKENIZERS: LazyLock<Vec<TextTokenizer>> = LazyLock::new(|| {
    ["bert-embed-mean", "qwen2-embed-chat", "xlmr-embed-cls"]
        .iter()
        .map(|name| {
            let path = format!("{}/../tests/fixtures/models/{name}/tokenizer.json", env!("CARGO_MANIFEST_DIR"));
            TextTokenizer::from_file(std::path::Path::new(&path), name.starts_with("bert"), true).expect("the fixture's tokenizer")
        })
        .collect()
});

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else { return };
    let text = String::from_utf8_lossy(rest);
    let (query, document) = text.split_once('\0').unwrap_or((&text, ""));
    let tokenizer = &TOKENIZERS[pick as usize % 3];
    let options = EncodeOptions {
        add_special_tokens: pick & 4 != 0,
        truncate_to: (pick & 8 != 0).then_some((pick >> 4) as usize),
        side: if pick & 0x80 != 0 { TruncationSide::Left } else { TruncationSide::Right },
        pair_limits: Default::default(),
    };
    let _ = tokenizer.encode(query, options);
    let _ = tokenizer.encode_input(&TextInput::Pair(query.into(), document.into()), options);
    let _ = tokenizer.char_offsets(query, options.add_special_tokens);
    let _ = tokenizer.tokens(query, options.add_special_tokens);
    let ids: Vec<u32> = rest.chunks(4).map(|c| c.iter().fold(0u32, |v, &b| v << 8 | u32::from(b)) % 300_000).collect();
    let _ = tokenizer.decode(&ids, pick & 2 != 0);
    let _ = tokenizer.token_strings(&ids);
});
