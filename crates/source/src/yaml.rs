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
