//! vLLM's spellings of our flags: a command line written for `vllm serve` read as ours.

use super::ConfigError;

/// A command line written for vLLM, as clap reads ours: flag names with underscores
/// (`--hf_overrides`) take dashes, and vLLM's dotted JSON flags (`--pooler-config.task
/// token_embed`, `--hf-overrides.a.b 1`) become one JSON object per flag, merged over the
/// flag's own JSON when it is given too. A dotted value is read as JSON, else as a string.
pub fn vllm_style_args(args: Vec<String>) -> Result<Vec<String>, ConfigError> {
    let mut out: Vec<String> = Vec::with_capacity(args.len());
    let mut dotted: Vec<(String, serde_json::Map<String, serde_json::Value>)> = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let Some(flag) = arg.strip_prefix("--").filter(|f| !f.is_empty()) else {
            out.push(arg);
            continue;
        };
        let (name, inline) = match flag.split_once('=') {
            Some((name, value)) => (name.replace('_', "-"), Some(value.to_string())),
            None => (flag.replace('_', "-"), None),
        };
        let Some((base, path)) = name.split_once('.') else {
            out.push(match inline {
                Some(value) => format!("--{name}={value}"),
                None => format!("--{name}"),
            });
            continue;
        };
        let value = match inline {
            Some(value) => value,
            None => args.next().ok_or_else(|| ConfigError(format!("--{name} needs a value")))?,
        };
        let value = serde_json::from_str(&value).unwrap_or(serde_json::Value::String(value));
        let object = match dotted.iter_mut().find(|(flag, _)| *flag == base) {
            Some((_, object)) => object,
            None => {
                dotted.push((base.to_string(), serde_json::Map::new()));
                &mut dotted.last_mut().expect("just pushed").1
            }
        };
        let keys: Vec<&str> = path.split('.').collect();
        insert_path(object, &keys, value);
    }
    for (flag, object) in dotted {
        // Merged over the flag's own JSON, which then leaves the command line.
        let long = format!("--{flag}");
        let position = out.iter().position(|a| *a == long || a.starts_with(&format!("{long}=")));
        let mut merged = match position {
            Some(i) => {
                let own = match out[i].split_once('=') {
                    Some((_, value)) => value.to_string(),
                    None => out.get(i + 1).cloned().ok_or_else(|| ConfigError(format!("{long} needs a value")))?,
                };
                let taken = if out[i].contains('=') { 1 } else { 2 };
                out.drain(i..i + taken);
                match serde_json::from_str(&own) {
                    Ok(serde_json::Value::Object(map)) => map,
                    _ => return Err(ConfigError(format!("{long} must be a JSON object to take {long}.KEY values"))),
                }
            }
            None => serde_json::Map::new(),
        };
        merge(&mut merged, object);
        out.push(long);
        out.push(serde_json::Value::Object(merged).to_string());
    }
    Ok(out)
}

fn insert_path(object: &mut serde_json::Map<String, serde_json::Value>, keys: &[&str], value: serde_json::Value) {
    match keys {
        [] => {}
        [last] => {
            object.insert(last.to_string(), value);
        }
        [first, rest @ ..] => {
            let entry = object.entry(first.to_string()).or_insert_with(|| serde_json::Value::Object(Default::default()));
            if !entry.is_object() {
                *entry = serde_json::Value::Object(Default::default());
            }
            if let serde_json::Value::Object(inner) = entry {
                insert_path(inner, rest, value);
            }
        }
    }
}

fn merge(base: &mut serde_json::Map<String, serde_json::Value>, over: serde_json::Map<String, serde_json::Value>) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(serde_json::Value::Object(inner)), serde_json::Value::Object(more)) => merge(inner, more),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vllm(args: &[&str]) -> Vec<String> {
        vllm_style_args(args.iter().map(|a| a.to_string()).collect()).unwrap()
    }

    #[test]
    fn vllm_command_lines_read_as_ours() {
        assert_eq!(
            vllm(&["serve", "m", "--hf_overrides", "{}", "--max_model_len=5"]),
            ["serve", "m", "--hf-overrides", "{}", "--max-model-len=5"]
        );
        assert_eq!(
            vllm(&["serve", "m", "--pooler-config.task", "token_embed"]),
            ["serve", "m", "--pooler-config", r#"{"task":"token_embed"}"#]
        );
        let merged = vllm(&[
            "serve",
            "m",
            "--pooler-config",
            r#"{"use_activation": false, "task": "embed"}"#,
            "--pooler-config.task=token_classify",
            "--hf-overrides.a.b",
            "2",
        ]);
        assert_eq!(
            merged,
            ["serve", "m", "--pooler-config", r#"{"task":"token_classify","use_activation":false}"#, "--hf-overrides", r#"{"a":{"b":2}}"#]
        );
        assert!(vllm_style_args(vec!["--pooler-config.task".into()]).is_err());
    }
}
