//! The layers point one way (docs/ARCHITECTURE.md): each top-level module of `src/` may import
//! only the modules listed for it here. Read from the source files, so a new `use crate::…`
//! that crosses a layer upwards fails this test.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module → the modules of ours it may import (besides itself).
const ALLOWED: &[(&str, &[&str])] = &[
    ("metrics", &[]),
    ("models", &[]),
    ("pooling", &["models"]),
    ("loader", &["models", "pooling"]),
    ("engine", &["models", "pooling", "loader", "metrics"]),
    ("api", &["models", "pooling", "loader", "engine", "metrics"]),
    ("pooler", &["models", "pooling", "loader", "engine"]),
    ("config", &["pooling", "loader", "engine"]),
    ("server", &["pooling", "loader", "engine", "metrics", "api", "config"]),
    ("batch", &["pooling", "loader", "engine", "config", "pooler"]),
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

/// The modules of ours a file's code (not its tests) names through `crate::`.
fn imports(text: &str) -> BTreeSet<String> {
    let code = text.split("#[cfg(test)]").next().unwrap_or(text);
    code.match_indices("crate::")
        .filter_map(|(i, _)| {
            let rest = &code[i + "crate::".len()..];
            let name: String = rest.chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
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
