//! vLLM's CORS flags (`--allowed-origins`, `--allowed-methods`, `--allowed-headers`,
//! `--allow-credentials`), checked at start: each list is JSON (vLLM's form) or
//! comma-separated, `*` meaning any; an origin must be `scheme://host[:port]`, a method an
//! HTTP token, a header a header name. Off unless `--allowed-origins` is given.

use super::ConfigError;

/// A CORS list: anything, or these values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CorsList {
    Any,
    Only(Vec<String>),
}

/// The validated flags (the server turns them into its CORS layer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorsOptions {
    pub origins: CorsList,
    pub methods: CorsList,
    pub headers: CorsList,
    pub credentials: bool,
}

/// `None` when `--allowed-origins` is not given.
pub(super) fn cors_options(
    origins: Option<&str>,
    methods: Option<&str>,
    headers: Option<&str>,
    credentials: bool,
) -> Result<Option<CorsOptions>, ConfigError> {
    let Some(origins) = origins else { return Ok(None) };
    let origins = list("--allowed-origins", origins, check_origin)?;
    let methods = list("--allowed-methods", methods.unwrap_or("*"), check_method)?;
    let headers = list("--allowed-headers", headers.unwrap_or("*"), check_header)?;
    Ok(Some(CorsOptions { origins, methods, headers, credentials }))
}

fn list(flag: &str, value: &str, check: fn(&str) -> Result<String, String>) -> Result<CorsList, ConfigError> {
    let items: Vec<String> = if value.trim_start().starts_with('[') {
        serde_json::from_str(value)
            .map_err(|e| ConfigError(format!("{flag} must be a JSON list of strings or a comma-separated list: {e}")))?
    } else {
        value.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect()
    };
    if items.is_empty() {
        return Err(ConfigError(format!("{flag} must name at least one value (or `*`)")));
    }
    if items.iter().any(|i| i.trim() == "*") {
        return Ok(CorsList::Any);
    }
    items.iter().map(|i| check(i.trim()).map_err(|e| ConfigError(format!("{flag}: {e}")))).collect::<Result<_, _>>().map(CorsList::Only)
}

/// `scheme://host[:port]`, as browsers send `Origin` (no path, no trailing slash).
fn check_origin(origin: &str) -> Result<String, String> {
    let bad = || Err(format!("`{origin}` is not an origin: write scheme://host[:port], e.g. https://app.example.com"));
    let Some((scheme, rest)) = origin.split_once("://") else { return bad() };
    let scheme_ok = scheme.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    let (host, port) = match rest.rsplit_once(':') {
        Some((host, port)) if !port.contains(']') => (host, Some(port)),
        _ => (rest, None),
    };
    let host_ok = !host.is_empty() && host.chars().all(|c| c.is_ascii_alphanumeric() || "-.[]:_".contains(c));
    let port_ok = port.is_none_or(|p| p.parse::<u16>().is_ok());
    if !scheme_ok || !host_ok || !port_ok {
        return bad();
    }
    Ok(origin.to_ascii_lowercase())
}

/// An HTTP token (RFC 9110's `tchar`s): what methods and header names are made of.
fn is_token(text: &str) -> bool {
    !text.is_empty() && text.chars().all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c))
}

fn check_method(method: &str) -> Result<String, String> {
    match is_token(method) {
        true => Ok(method.to_ascii_uppercase()),
        false => Err(format!("`{method}` is not an HTTP method")),
    }
}

fn check_header(header: &str) -> Result<String, String> {
    match is_token(header) {
        true => Ok(header.to_ascii_lowercase()),
        false => Err(format!("`{header}` is not a header name")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_in_vllms_json_form_and_comma_separated() {
        let cors =
            cors_options(Some(r#"["https://a.example.com", "http://localhost:3000"]"#), None, Some("content-type, Authorization"), true)
                .unwrap()
                .unwrap();
        assert_eq!(cors.origins, CorsList::Only(vec!["https://a.example.com".into(), "http://localhost:3000".into()]));
        assert_eq!(cors.methods, CorsList::Any);
        assert_eq!(cors.headers, CorsList::Only(vec!["content-type".into(), "authorization".into()]));
        assert!(cors.credentials);
        assert_eq!(
            cors_options(Some("*"), Some("get,post"), None, false).unwrap().unwrap().methods,
            CorsList::Only(vec!["GET".into(), "POST".into()])
        );
        assert_eq!(cors_options(None, None, None, false).unwrap(), None);
    }

    #[test]
    fn bad_values_name_the_flag() {
        for (origins, part) in [
            ("app.example.com", "--allowed-origins: `app.example.com` is not an origin"),
            ("https://app.example.com/path", "is not an origin"),
            ("https://a.com:99999", "is not an origin"),
            ("[1, 2]", "--allowed-origins must be a JSON list"),
            ("", "--allowed-origins must name at least one value"),
        ] {
            let err = cors_options(Some(origins), None, None, false).unwrap_err().to_string();
            assert!(err.contains(part), "{origins}: {err}");
        }
        let err = cors_options(Some("*"), Some("GET,PO ST"), None, false).unwrap_err().to_string();
        assert!(err.contains("--allowed-methods: `PO ST` is not an HTTP method"), "{err}");
        let err = cors_options(Some("*"), None, Some("x:y"), false).unwrap_err().to_string();
        assert!(err.contains("--allowed-headers: `x:y` is not a header name"), "{err}");
    }
}
