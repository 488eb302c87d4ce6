//! YAML in and out, on serde-saphyr: the YAML stack kube-rs already brings (serde_yaml is
//! deprecated upstream). Documents are read as `serde_json::Value` trees, which every
//! Kubernetes object fits (string keys only), then typed with `serde_path_to_error`.

use std::io::Read;

pub use serde_json::Value;

/// Parser limits for manifest files. serde-saphyr's defaults (250,000 nodes and a million
/// events a document) are for configuration files; `kubectl get … -o yaml` of a big cluster is
/// one List document above them. The manifest source already bounds a file's size (4 MiB)
/// and nesting before parsing, which bounds these too.
pub fn options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_nodes = 1 << 26;
    budget.max_events = 1 << 27;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options
}

/// Each document of a YAML stream in turn (empty documents are skipped), so that only one
/// document's tree is held at a time. After a syntax error the iterator ends.
pub fn documents<'a, R: Read + 'a>(
    reader: &'a mut R,
) -> impl Iterator<Item = Result<Value, serde_saphyr::Error>> + 'a {
    serde_saphyr::read_with_options(reader, options())
}

/// One YAML document as `T`.
pub fn from_str<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, serde_saphyr::Error> {
    serde_saphyr::from_str_with_options(text, options())
}

/// `value` as a YAML document.
pub fn to_string<T: serde::Serialize>(value: &T) -> Result<String, serde_saphyr::ser::Error> {
    serde_saphyr::to_string(value)
}

/// Why a YAML document did not decode, in parts a one-line message is made of. Nothing in it
/// holds more than a cut piece of the input: a file given by mistake (/etc/passwd reads as one
/// long YAML string) must not be echoed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// The field at fault (`iptables.masqueradeAll`), when inside the document.
    pub field: Option<String>,
    /// The 1-based line of the fault, and that line's start (at most 60 characters).
    pub line: Option<(usize, String)>,
    /// What is wrong, serde's quoted values cut at 40 characters, without the location.
    pub message: String,
    /// When the document is not a mapping: what it reads as (`a YAML string`, …).
    pub not_a_mapping: Option<&'static str>,
}

/// `text` (one document) as `T`, or the parts of a one-line message saying why not.
pub fn decode<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, DecodeError> {
    let mut field = None;
    let mut options = options();
    // The error's Display would otherwise quote the input around the fault (a snippet).
    options.with_snippet = false;
    serde_saphyr::with_deserializer_from_str_with_options(text, options, |de| {
        serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            field = (path != "." && !path.is_empty()).then_some(path);
            e.into_inner()
        })
    })
    .map_err(|e| {
        let location = e.location();
        let mut message = e.to_string();
        if let Some(l) = &location {
            let suffix = format!(" at line {}, column {}", l.line(), l.column());
            if let Some(m) = message.strip_suffix(&suffix) {
                message = m.to_string();
            }
        }
        let line = location.map(|l| {
            let n = l.line() as usize;
            let start = text.lines().nth(n.saturating_sub(1)).unwrap_or_default();
            (n, excerpt(start.trim_end(), 60))
        });
        let not_a_mapping = match field {
            Some(_) => None,
            None => match from_str::<Value>(text) {
                Ok(Value::String(_)) => Some("a YAML string"),
                Ok(Value::Array(_)) => Some("a YAML sequence"),
                Ok(Value::Number(_) | Value::Bool(_)) => Some("a YAML scalar"),
                _ => None,
            },
        };
        DecodeError {
            field,
            line,
            message: cut_quoted(&message, 40),
            not_a_mapping,
        }
    })
}

/// At most `max` characters of `text`, with `…` when cut.
pub fn excerpt(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_string(),
    }
}

/// `message` with every quoted string longer than `max` characters cut (serde quotes the
/// values it could not take with `{:?}`, and a value can be a whole file; names in
/// backticks).
pub fn cut_quoted(message: &str, max: usize) -> String {
    let mut out = String::with_capacity(message.len().min(512));
    let mut rest = message;
    while let Some(open) = rest.find(['"', '`']) {
        let quote = rest[open..].chars().next().unwrap_or('"');
        out.push_str(&rest[..=open]);
        rest = &rest[open + 1..];
        // The closing quote: `"` may be escaped inside (`{:?}`), a backtick may not.
        let mut escaped = false;
        let close = rest.char_indices().find(|&(_, c)| {
            let end = c == quote && !escaped;
            escaped = quote == '"' && c == '\\' && !escaped;
            end
        });
        let Some((close, _)) = close else {
            out.push_str(&excerpt(rest, max));
            return out;
        };
        out.push_str(&excerpt(&rest[..close], max));
        out.push(quote);
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_values_are_cut_at_a_character_boundary() {
        assert_eq!(cut_quoted("a \"short\" b", 10), "a \"short\" b");
        assert_eq!(cut_quoted("x \"ééééé\\\"ééé\" y", 4), "x \"éééé…\" y");
        assert_eq!(cut_quoted("open \"abcdef", 3), "open \"abc…");
        assert_eq!(
            cut_quoted("unknown variant `abcdef`, expected `ab`", 3),
            "unknown variant `abc…`, expected `ab`"
        );
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Conf {
        name: String,
        nested: Option<Nested>,
    }
    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Nested {
        on: bool,
    }

    #[test]
    fn a_decode_error_names_field_and_line_and_never_holds_the_input() {
        let e = decode::<Conf>("name: a\nnested:\n  on: maybe\n").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("nested.on"));
        assert_eq!(e.line, Some((3, "  on: maybe".to_string())));
        assert!(e.message.contains("bool"), "{e:?}");
        assert_eq!(e.not_a_mapping, None);

        let passwd = "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1::/:/bin/sh\n".repeat(20);
        let e = decode::<Conf>(&passwd).unwrap_err();
        assert_eq!(e.field, None);
        assert_eq!(e.not_a_mapping, Some("a YAML string"));
        let all = format!("{e:?}");
        assert!(!all.contains("daemon") && all.len() < 400, "{all}");
    }
}
