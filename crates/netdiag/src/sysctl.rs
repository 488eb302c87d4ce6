//! `sysctl -a` style lines (`net.ipv4.ip_forward = 1`), and the rules the kernel combines them by.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{Parsed, Skipped};

/// Sysctl values by key as `sysctl` prints them: an interface name's dots become slashes
/// (`net.ipv4.conf.flannel/1.rp_filter`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Sysctls(pub BTreeMap<String, String>);

/// Parses `key = value` and `key=value` lines; `#` comments and blank lines are ignored.
pub fn parse(text: &str) -> Parsed<Sysctls> {
    let mut map = BTreeMap::new();
    let mut skipped = Vec::new();
    let pasted = crate::paste::lines(text);
    for l in pasted.data() {
        let line = l.text.trim();
        if line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        // `/proc/sys/net/ipv4/conf/eth0/rp_filter = 2` (a `for f in /proc/sys/…` loop) and
        // `/proc/sys/net/ipv4/conf/eth0/rp_filter:2` (`grep . /proc/sys/…`): the key as
        // sysctl spells it, a dot inside a component (an interface name) becoming `/`.
        let proc_line;
        let line = match line.strip_prefix("/proc/sys/") {
            Some(path) => {
                let (k, v) = path
                    .split_once('=')
                    .or_else(|| path.split_once(':'))
                    .unwrap_or((path, ""));
                let key: Vec<String> = k.trim().split('/').map(|c| c.replace('.', "/")).collect();
                proc_line = format!("{} = {}", key.join("."), v.trim());
                proc_line.as_str()
            }
            None => line,
        };
        match line.split_once('=') {
            // A cut-off last line `net.ipv4.conf.eth0.rp_filter =` has no value: not read.
            Some((k, v))
                if !k.trim().is_empty() && !k.trim().contains(' ') && !v.trim().is_empty() =>
            {
                map.insert(k.trim().to_string(), v.trim().to_string());
            }
            _ => skipped.push(Skipped::new(l.no, line, l.reason("not `key = value`"))),
        }
    }
    Parsed {
        value: Sysctls(map),
        skipped,
    }
}

impl Sysctls {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    pub fn int(&self, key: &str) -> Option<i64> {
        self.get(key)?.parse().ok()
    }

    /// The key of a per-interface setting: `conf_key("ipv4", "flannel.1", "rp_filter")`.
    pub fn conf_key(family: &str, iface: &str, name: &str) -> String {
        format!("net.{family}.conf.{}.{name}", iface.replace('.', "/"))
    }

    pub fn conf(&self, family: &str, iface: &str, name: &str) -> Option<i64> {
        self.int(&Self::conf_key(family, iface, name))
    }

    /// The reverse-path filter mode the kernel applies on `iface`: the larger of `conf/all` and
    /// `conf/<iface>` (0 off, 1 strict, 2 loose). `None` when neither is known.
    pub fn effective_rp_filter(&self, iface: &str) -> Option<i64> {
        match (
            self.conf("ipv4", "all", "rp_filter"),
            self.conf("ipv4", iface, "rp_filter"),
        ) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0).max(b.unwrap_or(0))),
        }
    }

    /// `src_valid_mark` as the kernel reads it: `all` OR `<iface>`.
    pub fn effective_src_valid_mark(&self, iface: &str) -> Option<bool> {
        match (
            self.conf("ipv4", "all", "src_valid_mark"),
            self.conf("ipv4", iface, "src_valid_mark"),
        ) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0) != 0 || b.unwrap_or(0) != 0),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_spellings_dotted_ifnames_and_max_rule() {
        let p = parse("net.ipv4.ip_forward = 1\nnet.ipv4.conf.all.rp_filter=2\nnet.ipv4.conf.flannel/1.rp_filter = 1\nbogus line\n# c\n");
        assert_eq!(p.skipped.len(), 1);
        let s = p.value;
        assert_eq!(s.int("net.ipv4.ip_forward"), Some(1));
        assert_eq!(s.conf("ipv4", "flannel.1", "rp_filter"), Some(1));
        assert_eq!(s.effective_rp_filter("flannel.1"), Some(2));
        assert_eq!(s.effective_rp_filter("eth9"), Some(2));
        assert_eq!(Sysctls::default().effective_rp_filter("eth0"), None);
        let p = parse("/proc/sys/net/ipv4/conf/all/rp_filter = 1\n/proc/sys/net/ipv4/conf/flannel.1/rp_filter:2\n");
        assert!(p.skipped.is_empty(), "{:?}", p.skipped);
        assert_eq!(p.value.conf("ipv4", "all", "rp_filter"), Some(1));
        assert_eq!(p.value.conf("ipv4", "flannel.1", "rp_filter"), Some(2));
    }
}
