//! resolv.conf, read as host-local reads `ipam.resolvConf` into a CNI `dns` object.

use serde_json::Value;

/// resolv.conf as host-local reads it into a CNI `dns` object.
pub(crate) fn parse_resolv_conf(text: &str) -> Value {
    let (mut nameservers, mut search, mut options) = (Vec::new(), Vec::new(), Vec::new());
    let mut domain = None;
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or("");
        let mut words = line.split_whitespace();
        match (words.next(), words.clone().next()) {
            (Some("nameserver"), Some(ns)) => nameservers.push(ns.to_string()),
            (Some("domain"), Some(d)) => domain = Some(d.to_string()),
            (Some("search"), Some(_)) => search.extend(words.map(str::to_string)),
            (Some("options"), Some(_)) => options.extend(words.map(str::to_string)),
            _ => {}
        }
    }
    let mut dns = serde_json::Map::new();
    if !nameservers.is_empty() {
        dns.insert("nameservers".into(), nameservers.into());
    }
    if let Some(d) = domain {
        dns.insert("domain".into(), d.into());
    }
    if !search.is_empty() {
        dns.insert("search".into(), search.into());
    }
    if !options.is_empty() {
        dns.insert("options".into(), options.into());
    }
    if dns.is_empty() {
        Value::Null
    } else {
        Value::Object(dns)
    }
}
