//! Bridge ports' `hairpin_mode` from sysfs, as pasted: `cat /sys/devices/virtual/net/BR/brif/
//! PORT/hairpin_mode` (one value a line, the bridge and port from the command line when it
//! names them, a glob leaving the port unknown), `grep . /sys/class/net/*/brif/*/hairpin_mode`
//! (`path:value`), or `path value` lines from a loop. A port in hairpin mode sends a frame back
//! out the port it came in on, which a pod reaching itself through a Service needs.

use serde::Serialize;

use crate::{paste, Parsed, Skipped};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HairpinPort {
    /// 1-based line in the paste.
    pub line: usize,
    pub bridge: Option<String>,
    /// `None` when the command globbed the port (`veth*`).
    pub port: Option<String>,
    pub on: bool,
}

/// The bridge and port a sysfs path names: `/sys/devices/virtual/net/docker0/brif/veth1/hairpin_mode`,
/// `/sys/class/net/cni0/brif/veth1/hairpin_mode`.
fn names(path: &str) -> (Option<String>, Option<String>) {
    let parts: Vec<&str> = path.split('/').collect();
    let Some(i) = parts.iter().position(|p| *p == "brif") else {
        return (None, None);
    };
    let known = |s: &&&str| !s.contains(['*', '?', '[']) && !s.is_empty();
    let bridge = i.checked_sub(1).and_then(|b| parts.get(b)).filter(known);
    let port = parts.get(i + 1).filter(known);
    (bridge.map(|s| s.to_string()), port.map(|s| s.to_string()))
}

pub fn parse(text: &str) -> Parsed<Vec<HairpinPort>> {
    let pasted = paste::lines(text);
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    // A bare `cat /sys/…/hairpin_mode` line (a command echoed without a prompt).
    let mut bare: Option<(usize, String)> = None;
    for l in pasted.data() {
        let line = l.text.trim();
        if line.is_empty() {
            continue;
        }
        if line.ends_with("hairpin_mode") && line.contains("/brif/") {
            bare = line
                .split_whitespace()
                .find(|w| w.contains("/brif/"))
                .map(|w| (l.no, w.to_string()));
            continue;
        }
        // `path:value` or `path value`, else a bare value under a `cat PATH` command.
        let (path, value) = match line.rsplit_once([':', ' ']) {
            Some((p, v)) if p.contains("/brif/") => (Some(p.trim().to_string()), v.trim()),
            _ => {
                // The nearer of the prompt's command and a bare command line above.
                let prompt = pasted
                    .command_lines
                    .iter()
                    .rev()
                    .find(|(n, _)| *n < l.no)
                    .and_then(|(n, c)| {
                        c.split_whitespace()
                            .find(|w| w.contains("/brif/"))
                            .map(|w| (*n, w.to_string()))
                    });
                let path = match (&bare, prompt) {
                    (Some((b, p)), Some((n, _))) if *b > n => Some(p.clone()),
                    (_, Some((_, p))) => Some(p),
                    (Some((_, p)), None) => Some(p.clone()),
                    (None, None) => None,
                };
                (path, line)
            }
        };
        let on = match value {
            "0" => false,
            "1" => true,
            _ => {
                skipped.push(Skipped::new(
                    l.no,
                    l.text,
                    l.reason("not a hairpin_mode value (0 or 1)"),
                ));
                continue;
            }
        };
        let (bridge, port) = path.as_deref().map(names).unwrap_or((None, None));
        out.push(HairpinPort {
            line: l.no,
            bridge,
            port,
            on,
        });
    }
    Parsed {
        value: out,
        skipped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cat_with_a_glob_and_grep_with_paths() {
        let p = parse("cat /sys/devices/virtual/net/docker0/brif/veth*/hairpin_mode\n0\n0\n");
        assert!(p.skipped.is_empty(), "{:?}", p.skipped);
        assert_eq!(p.value.len(), 2);
        assert_eq!(p.value[0].bridge.as_deref(), Some("docker0"));
        assert_eq!(p.value[0].port, None);
        assert!(!p.value[0].on);

        let p = parse("/sys/class/net/cni0/brif/veth1a2b/hairpin_mode:1\n/sys/class/net/cni0/brif/veth3c4d/hairpin_mode:0\n");
        assert!(p.skipped.is_empty(), "{:?}", p.skipped);
        assert_eq!(p.value[0].port.as_deref(), Some("veth1a2b"));
        assert!(p.value[0].on && !p.value[1].on);
        assert_eq!(p.value[1].bridge.as_deref(), Some("cni0"));
    }
}
