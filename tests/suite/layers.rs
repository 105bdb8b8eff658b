//! The layers point one way (docs/ARCHITECTURE.md): each top-level module of `src/` may import
//! only the modules listed for it here. Read from the source files, every production line of
//! them (test-only items, `#[cfg(test)]`, are cut out whole wherever they stand), so a new
//! `use crate::…` that crosses a layer upwards fails this test.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module → the modules of ours it may import (besides itself).
const ALLOWED: &[(&str, &[&str])] = &[
    ("metrics", &[]),
    ("telemetry", &["metrics"]),
    ("kernels", &[]),
    ("models", &["kernels"]),
    ("pooling", &["kernels", "models"]),
    ("input", &["models", "metrics"]),
    ("loader", &["kernels", "models", "pooling", "input"]),
    ("engine", &["kernels", "models", "pooling", "input", "loader", "metrics"]),
    ("plugin", &["pooling", "input", "loader", "engine", "metrics"]),
    ("api", &["models", "pooling", "input", "loader", "engine", "plugin", "metrics", "telemetry"]),
    ("library", &["models", "pooling", "input", "loader", "engine", "plugin"]),
    ("config", &["pooling", "input", "loader", "engine", "plugin", "telemetry"]),
    ("server", &["pooling", "input", "loader", "engine", "plugin", "metrics", "api", "config", "telemetry"]),
    ("commands", &["pooling", "input", "loader", "engine", "config", "library"]),
];

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Where the literal, comment or block starting at `i` ends (exclusive), or `None` when none
/// starts there: the lexing that brace matching needs (a `{` inside a string or a char
/// literal is not a block).
fn skip_token(b: &[u8], i: usize) -> Option<usize> {
    match b[i] {
        b'/' if b.get(i + 1) == Some(&b'/') => Some(b[i..].iter().position(|&c| c == b'\n').map_or(b.len(), |n| i + n)),
        b'/' if b.get(i + 1) == Some(&b'*') => Some(find(b, i + 2, b"*/").map_or(b.len(), |n| n + 2)),
        b'r' if matches!(b.get(i + 1), Some(b'"' | b'#')) && (i == 0 || !b[i - 1].is_ascii_alphanumeric() && b[i - 1] != b'_') => {
            let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
            if b.get(i + 1 + hashes) != Some(&b'"') {
                return None;
            }
            let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
            Some(find(b, i + 2 + hashes, &close).map_or(b.len(), |n| n + close.len()))
        }
        b'"' => {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            Some(j + 1)
        }
        // A char literal ('x', '\n', '\u{7b}'), not a lifetime ('a).
        b'\'' if b.get(i + 1) == Some(&b'\\') => Some(find(b, i + 2, b"'").map_or(b.len(), |n| n + 1)),
        b'\'' if b.get(i + 2) == Some(&b'\'') => Some(i + 3),
        b'\'' => std::str::from_utf8(&b[i + 1..(i + 6).min(b.len())])
            .ok()
            .or_else(|| std::str::from_utf8(&b[i + 1..(i + 5).min(b.len())]).ok())
            .and_then(|s| s.chars().next().map(|c| i + 1 + c.len_utf8()))
            .filter(|&j| b.get(j) == Some(&b'\''))
            .map(|j| j + 1),
        _ => None,
    }
}

fn find(b: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    b.get(from..)?.windows(needle.len()).position(|w| w == needle).map(|n| from + n)
}

/// The end (exclusive) of the item that starts at `i`: through its `{ … }` block, or through
/// its `;` when a `;` comes before any block (`#[cfg(test)] use …;`).
fn item_end(b: &[u8], mut i: usize) -> usize {
    let mut depth = 0usize;
    while i < b.len() {
        if let Some(end) = skip_token(b, i) {
            i = end;
            continue;
        }
        match b[i] {
            b'{' => depth += 1,
            b'}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            b';' if depth == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    b.len()
}

/// The file's production code: every `#[cfg(test)]` item removed, wherever it stands.
fn production_code(text: &str) -> String {
    const MARK: &str = "#[cfg(test)]";
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while let Some(n) = text[i..].find(MARK) {
        let start = i + n;
        out.push_str(&text[i..start]);
        i = item_end(b, start + MARK.len());
    }
    out.push_str(&text[i..]);
    out
}

/// The modules of ours a file's production code names through `crate::`.
fn imports(text: &str) -> BTreeSet<String> {
    let code = production_code(text);
    code.match_indices("crate::")
        .filter_map(|(i, _)| {
            let rest = &code[i + "crate::".len()..];
            let name: String = rest.chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

#[test]
fn test_items_are_cut_out_whole_and_nothing_else() {
    let text = r##"use crate::a::X;
#[cfg(test)]
mod tests {
    use crate::t::Y;
    fn f() { let s = "}"; let c = '{'; let r = r#"}"#; /* } */ }
}
fn g<'a>(x: &'a str) { crate::b::z(); }
#[cfg(test)]
use crate::u::W;
#[cfg(test)]
pub fn for_tests() -> Self { crate::v::new() }
pub fn after() { crate::c::w(); }
"##;
    let found: Vec<String> = imports(text).into_iter().collect();
    assert_eq!(found, ["a", "b", "c"]);
}

#[test]
fn layers_point_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).expect("under src/");
        let module = relative.components().next().and_then(|c| c.as_os_str().to_str()).unwrap_or("").trim_end_matches(".rs");
        if module == "lib" || module == "main" {
            continue;
        }
        let Some(may) = allowed.get(module) else {
            violations.push(format!("{}: module `{module}` has no row in ALLOWED", relative.display()));
            continue;
        };
        let text = std::fs::read_to_string(file).expect("readable");
        for import in imports(&text) {
            if import != module && !may.contains(&import.as_str()) {
                violations.push(format!("{}: `{module}` imports `{import}`", relative.display()));
            }
        }
    }
    assert!(files.len() > 40, "found only {} files under {}", files.len(), src.display());
    assert!(violations.is_empty(), "imports against the layers:\n{}", violations.join("\n"));
}
