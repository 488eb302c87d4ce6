//! Problems with `weir proxy`'s flags and KubeProxyConfiguration file, each with where it is
//! (file, line, field) and what: found while loading (config) and reported by `--validate`
//! (validate). Nothing here reads the settings themselves, so both can use it.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use super::kube_proxy::{self, Refused};

/// One problem: where (the file, its line, the field, or a flag as the field) and what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub file: Option<String>,
    pub line: Option<usize>,
    /// A field path (`ipvs.strictARP`) or a flag (`--sync-period`).
    pub field: Option<String>,
    pub message: String,
}

impl Problem {
    pub fn msg(message: impl Into<String>) -> Problem {
        Problem {
            file: None,
            line: None,
            field: None,
            message: message.into(),
        }
    }

    pub fn in_file(path: &Path, line: Option<usize>, field: Option<String>, m: String) -> Problem {
        Problem {
            file: Some(path.display().to_string()),
            line,
            field,
            message: m,
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{file}: ")?;
        }
        if let Some(n) = self.line {
            write!(f, "line {n}: ")?;
        }
        if let Some(field) = &self.field {
            write!(f, "{field}: ")?;
        }
        write!(f, "{}", self.message)
    }
}

/// Every problem of the flags and the file: the agent does not start (exit code 2, as a
/// usage error), `--validate` lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid(pub Vec<Problem>);

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lines: Vec<String> = self.0.iter().map(Problem::to_string).collect();
        write!(f, "{}", lines.join("\n"))
    }
}

impl std::error::Error for Invalid {}

/// The problems an error stands for: each of an [`Invalid`] or a [`Refused`], else one.
pub fn problems_of(e: &anyhow::Error) -> Vec<Problem> {
    if let Some(Invalid(p)) = e.downcast_ref::<Invalid>() {
        return p.clone();
    }
    if let Some(Refused(r)) = e.downcast_ref::<Refused>() {
        return r.iter().cloned().map(Problem::msg).collect();
    }
    vec![Problem::msg(format!("{e:#}"))]
}

/// The 1-based line of the block-style key at `path` (`ipvs.strictARP`): each segment the
/// first `key:` below its parent's line and indented deeper. `None` for flow style (`{…}`).
pub fn line_of(text: &str, path: &str) -> Option<usize> {
    let mut from = 0;
    let mut indent: Option<usize> = None;
    for key in path.split('.') {
        let (n, depth) = text.lines().enumerate().skip(from).find_map(|(n, l)| {
            let depth = l.len() - l.trim_start().len();
            let body = l.trim_start().trim_start_matches("- ");
            let named = [
                format!("{key}:"),
                format!("\"{key}\":"),
                format!("'{key}':"),
            ]
            .iter()
            .any(|k| body.starts_with(k.as_str()));
            (named && indent.is_none_or(|i| depth > i)).then_some((n, depth))
        })?;
        from = n + 1;
        indent = Some(depth);
    }
    Some(from)
}

/// The document-level problems of a KubeProxyConfiguration: empty, another apiVersion or kind.
pub fn check_document(path: &Path, text: &str, doc: &Value) -> Vec<Problem> {
    let at = |field: &str, m: String| {
        Problem::in_file(path, line_of(text, field), Some(field.to_string()), m)
    };
    let Some(map) = doc.as_object() else {
        // Another YAML value than a mapping: the typed decoding says what it reads as.
        let empty = "empty: a KubeProxyConfiguration needs at least `apiVersion: \
                     kubeproxy.config.k8s.io/v1alpha1` and `kind: KubeProxyConfiguration`";
        return match doc.is_null() {
            true => vec![Problem::in_file(path, None, None, empty.into())],
            false => Vec::new(),
        };
    };
    let mut out = Vec::new();
    let s = |k: &str| map.get(k).and_then(Value::as_str);
    if let Some(v) = map.get("apiVersion").filter(|v| !v.is_null()) {
        if s("apiVersion") != Some("kubeproxy.config.k8s.io/v1alpha1") {
            out.push(at(
                "apiVersion",
                format!(
                    "{v} is not kubeproxy.config.k8s.io/v1alpha1 (kube-proxy 1.37's only \
                     version)"
                ),
            ));
        }
    }
    if let Some(v) = map.get("kind").filter(|v| !v.is_null()) {
        if s("kind") != Some("KubeProxyConfiguration") {
            out.push(at("kind", format!("{v} is not KubeProxyConfiguration")));
        }
    }
    out
}

/// An unknown field as a problem: its line and the known field it most likely meant.
pub fn unknown_field(path: &Path, text: &str, field: &str) -> Problem {
    let (prefix, name) = field.rsplit_once('.').unwrap_or(("", field));
    let known = kube_proxy::known_fields(prefix);
    let hint = match kube_proxy::did_you_mean(name, &known) {
        Some(k) => format!(" (did you mean {k}?)"),
        None if prefix.is_empty() => String::new(),
        None => format!(" ({prefix} has {})", known.join(", ")),
    };
    Problem::in_file(
        path,
        line_of(text, field),
        None,
        format!("unknown field {field}{hint}"),
    )
}

/// Whether a field's value is its zero value (what `kubeadm config print` writes for fields
/// left unset): said nothing about even where the mode does not read it.
fn is_zero(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => matches!(s.as_str(), "" | "0" | "0s"),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

/// The mode-section fields weir reads, by mode (as kube-proxy converts v1alpha1): the periods
/// from the mode's own section (`iptables:` for userspace), masquerading from `nftables:` in
/// nftables mode and `iptables:` in the others, the rest of `ipvs:` in ipvs mode only.
fn reads(mode: &str, section: &str, key: &str) -> bool {
    let periods = match mode {
        "nftables" | "ipvs" => mode,
        _ => "iptables",
    };
    let masquerade = if mode == "nftables" {
        "nftables"
    } else {
        "iptables"
    };
    match key {
        "syncPeriod" | "minSyncPeriod" => section == periods,
        "masqueradeBit" | "masqueradeAll" => section == masquerade,
        _ => section == "ipvs" && mode == "ipvs",
    }
}

/// A notice for each field of a mode section this mode does not read, set to something
/// other than its zero value (`ipvs.strictARP: true` in nftables mode); `mode` as
/// `--proxy-mode` names it.
pub fn unread_mode_fields(doc: &Value, mode: &str) -> Vec<String> {
    let mut out = Vec::new();
    for section in ["iptables", "ipvs", "nftables"] {
        let Some(map) = doc.get(section).and_then(Value::as_object) else {
            continue;
        };
        let known = kube_proxy::known_fields(section);
        for (key, v) in map {
            // iptables.localhostNodePorts has a row of its own; unknown fields are errors.
            let own_row = key == "localhostNodePorts" || !known.contains(&key.as_str());
            if own_row || is_zero(v) || reads(mode, section, key) {
                continue;
            }
            out.push(format!(
                "{section}.{key}={v}: ignored: {} mode does not read it (kube-proxy ignores it \
                 in that mode too); {}",
                mode,
                where_read(section, key)
            ));
        }
    }
    out
}

/// The modes that read `section.key`.
fn where_read(section: &str, key: &str) -> String {
    let modes: Vec<&str> = ["nftables", "iptables", "ipvs", "userspace"]
        .into_iter()
        .filter(|m| reads(m, section, key))
        .collect();
    match modes.as_slice() {
        [] => "no mode reads it".into(),
        [m] => format!("read in {m} mode"),
        [first @ .., last] => format!("read in {} and {last} modes", first.join(", ")),
    }
}

/// A duration as Go writes it (`30s`, `1m30s`, `250ms`, `0s`).
pub fn go_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return if d.is_zero() {
            "0s".into()
        } else {
            format!("{}µs", d.as_micros())
        };
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (h, m, s, rest) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if h > 0 || m > 0 {
        out.push_str(&format!("{m}m"));
    }
    match rest {
        0 => out.push_str(&format!("{s}s")),
        r => out.push_str(&format!("{s}.{}s", format!("{r:03}").trim_end_matches('0'))),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_of_block_keys_and_go_durations() {
        let text =
            "kind: K\nipvs:\n  scheduler: rr\n  strictARP: true\niptables:\n  strictARP: x\n";
        assert_eq!(line_of(text, "ipvs.strictARP"), Some(4));
        assert_eq!(line_of(text, "iptables.strictARP"), Some(6));
        assert_eq!(line_of(text, "kind"), Some(1));
        assert_eq!(line_of("ipvs: {strictARP: true}\n", "ipvs.strictARP"), None);
        for (d, s) in [
            (Duration::ZERO, "0s"),
            (Duration::from_millis(250), "250ms"),
            (Duration::from_secs(30), "30s"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_secs(3600), "1h0m0s"),
            (Duration::from_millis(1500), "1.5s"),
        ] {
            assert_eq!(go_duration(d), s);
        }
    }
}
