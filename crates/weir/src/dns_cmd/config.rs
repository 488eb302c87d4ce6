//! `weir dns` settings: command-line flags over a `DnsConfiguration` file over defaults (as
//! `weir proxy` takes flags over its KubeProxyConfiguration). The file is what a Corefile is to
//! CoreDNS; docs/dns.md has the table of Corefile directives and their fields here.
//!
//! Validation is strict: an unknown field at any depth, or a value out of range, is an error
//! naming the file, the field's path and what is accepted — a typo must not silently leave a
//! default in place.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde::Deserialize;
use weir_dns::{parse_name, Name, NameMatch, Rewrite};
use weir_source::yaml::excerpt;

use super::{DnsArgs, PodsArg};
use crate::proxy_cmd::parse_duration;

pub const API_VERSION: &str = "weir.dev/v1alpha1";
pub const KIND: &str = "DnsConfiguration";
/// Where names outside the zone go by default: the node's resolvers, as CoreDNS's
/// `forward . /etc/resolv.conf`.
pub const DEFAULT_RESOLV_CONF: &str = "/etc/resolv.conf";

/// The file, as written (every field optional; unknown fields refused at any depth).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DnsConfiguration {
    api_version: Option<String>,
    kind: Option<String>,
    listen: Option<String>,
    zone: Option<String>,
    ttl: Option<u32>,
    pods: Option<PodsArg>,
    autopath: Option<bool>,
    upstreams: Option<Vec<String>>,
    #[serde(rename = "upstreamTCP")]
    upstream_tcp: Option<bool>,
    stub_domains: Option<BTreeMap<String, Vec<String>>>,
    hosts: Option<Vec<HostEntry>>,
    rewrites: Option<Vec<RewriteRule>>,
    cache: Option<CacheSection>,
    threads: Option<usize>,
    healthz_bind_address: Option<String>,
    metrics_bind_address: Option<String>,
    node_local: Option<bool>,
    keep_node_local: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostEntry {
    ip: String,
    names: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RewriteRule {
    exact: Option<String>,
    suffix: Option<String>,
    to: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CacheSection {
    size: Option<usize>,
    #[serde(rename = "maxTTL")]
    max_ttl: Option<String>,
    #[serde(rename = "denialTTL")]
    denial_ttl: Option<String>,
    prefetch: Option<bool>,
    serve_stale: Option<String>,
}

/// Where one forwarder's upstreams come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upstream {
    /// The `nameserver` lines of a resolv.conf-style file, read at start.
    ResolvConf(PathBuf),
    Addr(SocketAddr),
}

#[derive(Debug, Clone, PartialEq)]
pub struct CacheSettings {
    pub size: usize,
    pub max_ttl: Duration,
    pub denial_ttl: Duration,
    pub prefetch: bool,
    pub serve_stale: Option<Duration>,
}

/// What `weir dns` runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub listen: SocketAddr,
    pub zone: String,
    pub ttl: u32,
    pub pods: PodsArg,
    pub autopath: bool,
    /// Empty: names outside the zone (and the stub domains) are REFUSED.
    pub upstreams: Vec<Upstream>,
    pub upstream_tcp: bool,
    pub stub_domains: Vec<(Name, Vec<Upstream>)>,
    pub hosts: Vec<(IpAddr, Vec<Name>)>,
    pub rewrites: Vec<Rewrite>,
    pub cache: CacheSettings,
    pub threads: usize,
    pub healthz_bind_address: Option<SocketAddr>,
    pub metrics_bind_address: Option<SocketAddr>,
    pub node_local: bool,
    pub keep_node_local: bool,
}

/// A bad value: the field's path, what is wrong, and what is accepted.
fn bad(field: &str, problem: impl std::fmt::Display, accepted: &str) -> anyhow::Error {
    anyhow::anyhow!("{field}: {problem} (accepted: {accepted})")
}

const ADDR: &str = "IP:port, e.g. 0.0.0.0:53 or [::]:53";
const UPSTREAM: &str = "an absolute path of a resolv.conf-style file, or IP, IP:port, [IPv6]:port";
const DURATION: &str = "a duration such as 30s, 5m, 1h";

fn socket_addr(field: &str, s: &str) -> anyhow::Result<SocketAddr> {
    s.trim().parse().map_err(|_| {
        bad(
            field,
            format!("{:?} is not an address", excerpt(s, 60)),
            ADDR,
        )
    })
}

fn name(field: &str, s: &str) -> anyhow::Result<Name> {
    parse_name(s).map_err(|e| bad(field, e, "a DNS name such as example.com"))
}

fn duration(field: &str, s: &str) -> anyhow::Result<Duration> {
    parse_duration(s).map_err(|e| bad(field, e, DURATION))
}

/// One upstream entry: a resolv.conf path, or a server's address (port 53 unless given).
pub fn upstream(field: &str, s: &str) -> anyhow::Result<Upstream> {
    let s = s.trim();
    if s.starts_with('/') {
        return Ok(Upstream::ResolvConf(PathBuf::from(s)));
    }
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(Upstream::Addr(a));
    }
    match s.parse::<IpAddr>() {
        Ok(ip) => Ok(Upstream::Addr(SocketAddr::new(ip, 53))),
        Err(_) => Err(bad(
            field,
            format!("{:?} is neither a path nor an address", excerpt(s, 60)),
            UPSTREAM,
        )),
    }
}

fn upstream_list(field: &str, items: &[String]) -> anyhow::Result<Vec<Upstream>> {
    items
        .iter()
        .enumerate()
        .map(|(i, s)| upstream(&format!("{field}[{i}]"), s))
        .collect()
}

/// Whether `name` is `zone` or under it.
fn within(zone: &Name, name: &Name) -> bool {
    zone.zone_of(name)
}

/// `--upstream-resolv-conf`: a file, or `none` (names outside the zone REFUSED).
fn upstream_flag(s: &str) -> Vec<Upstream> {
    match s {
        "none" => vec![],
        path => vec![Upstream::ResolvConf(PathBuf::from(path))],
    }
}

/// Reads and decodes a `--config` file, checking apiVersion and kind.
pub fn load(path: &Path) -> anyhow::Result<DnsConfiguration> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let cfg: DnsConfiguration = weir_source::yaml::decode(&text).map_err(|e| {
        let at = e
            .line
            .as_ref()
            .map(|(n, start)| format!("line {n} ({start:?}): "))
            .unwrap_or_default();
        match (&e.field, e.not_a_mapping) {
            (Some(field), _) => anyhow::anyhow!("{}: {at}{field}: {}", path.display(), e.message),
            (None, what) => anyhow::anyhow!(
                "{}: {at}not a {KIND} (a YAML mapping of fields): {}",
                path.display(),
                what.unwrap_or(&e.message)
            ),
        }
    })?;
    let at = |e: anyhow::Error| anyhow::anyhow!("{}: {e}", path.display());
    if let Some(k) = cfg.kind.as_deref().filter(|k| *k != KIND) {
        return Err(at(bad("kind", format!("{:?}", excerpt(k, 40)), KIND)));
    }
    if let Some(v) = cfg.api_version.as_deref().filter(|v| *v != API_VERSION) {
        return Err(at(bad(
            "apiVersion",
            format!("{:?}", excerpt(v, 40)),
            API_VERSION,
        )));
    }
    Ok(cfg)
}

/// Flags over the file (`path` names it in errors) over the defaults.
pub fn settings(
    args: &DnsArgs,
    file: &DnsConfiguration,
    path: Option<&Path>,
) -> anyhow::Result<Settings> {
    merge(args, file).map_err(|e| match path {
        Some(p) => anyhow::anyhow!("{}: {e}", p.display()),
        None => e,
    })
}

fn merge(args: &DnsArgs, f: &DnsConfiguration) -> anyhow::Result<Settings> {
    let listen = match (args.listen, &f.listen) {
        (Some(a), _) => a,
        (None, Some(s)) => socket_addr("listen", s)?,
        (None, None) => SocketAddr::from(([0, 0, 0, 0], 53)),
    };
    let zone = args
        .zone
        .clone()
        .or(f.zone.clone())
        .unwrap_or_else(|| "cluster.local".into());
    let zone_name = name("zone", &zone)?;
    let upstreams = match (&args.upstream_resolv_conf, &f.upstreams) {
        (Some(flag), _) => upstream_flag(flag),
        (None, Some(list)) => upstream_list("upstreams", list)?,
        (None, None) => vec![Upstream::ResolvConf(DEFAULT_RESOLV_CONF.into())],
    };
    let threads = args.threads.or(f.threads).unwrap_or(2);
    if threads == 0 {
        return Err(bad("threads", "0", "1 or more"));
    }
    let bind = |flag: Option<SocketAddr>, file: &Option<String>, field: &str| match (flag, file) {
        (Some(a), _) => Ok(Some(a)),
        (None, Some(s)) if s.trim().is_empty() => Ok(None),
        (None, Some(s)) => socket_addr(field, s).map(Some),
        (None, None) => Ok(None),
    };
    let node_local = args.node_local || f.node_local.unwrap_or(false);
    if node_local && !matches!(listen.ip(), IpAddr::V4(ip) if !ip.is_unspecified()) {
        return Err(bad(
            "listen",
            format!("{listen}: nodeLocal (--node-local) needs the cache's own address"),
            "an IPv4 address such as 169.254.20.10:53",
        ));
    }
    Ok(Settings {
        listen,
        ttl: args.ttl.or(f.ttl).unwrap_or(5),
        pods: args.pods.or(f.pods).unwrap_or(PodsArg::Disabled),
        autopath: args.autopath || f.autopath.unwrap_or(false),
        upstreams,
        upstream_tcp: args.upstream_tcp || f.upstream_tcp.unwrap_or(false),
        stub_domains: stub_domains(f, &zone_name)?,
        hosts: hosts(f, &zone_name)?,
        rewrites: rewrites(f)?,
        cache: cache(args, f.cache.as_ref().unwrap_or(&CacheSection::default()))?,
        threads,
        healthz_bind_address: bind(
            args.healthz_bind_address,
            &f.healthz_bind_address,
            "healthzBindAddress",
        )?,
        metrics_bind_address: metrics_address(args, f, node_local)?,
        node_local,
        keep_node_local: args.keep_node_local || f.keep_node_local.unwrap_or(false),
        zone,
    })
}

/// `--metrics-bind-address` over `metricsBindAddress` (`""` or `0` in either: off) over the
/// default: CoreDNS's port, or NodeLocal DNSCache's for a node-local cache, on loopback.
fn metrics_address(
    args: &DnsArgs,
    f: &DnsConfiguration,
    node_local: bool,
) -> anyhow::Result<Option<SocketAddr>> {
    use crate::runtime::flags::metrics_default::{DNS, NODE_LOCAL_DNS};
    match (args.metrics_bind_address, f.metrics_bind_address.as_deref()) {
        (Some(flag), _) => Ok(flag.0),
        (None, Some(s)) if matches!(s.trim(), "" | "0") => Ok(None),
        (None, Some(s)) => socket_addr("metricsBindAddress", s).map(Some),
        (None, None) => {
            let default = if node_local { NODE_LOCAL_DNS } else { DNS };
            Ok(Some(default.parse().expect("a valid default")))
        }
    }
}

/// `stubDomains`: zone → its upstreams; a zone inside the cluster zone is refused (the
/// cluster zone is answered first, so it would never be asked).
fn stub_domains(
    f: &DnsConfiguration,
    cluster: &Name,
) -> anyhow::Result<Vec<(Name, Vec<Upstream>)>> {
    let mut out = Vec::new();
    for (zone, list) in f.stub_domains.iter().flatten() {
        let field = format!("stubDomains[{zone:?}]");
        let z = name(&field, zone)?;
        if within(cluster, &z) {
            return Err(bad(
                &field,
                "inside the cluster zone",
                "a zone outside the cluster zone",
            ));
        }
        if list.is_empty() {
            return Err(bad(&field, "no upstream", UPSTREAM));
        }
        out.push((z, upstream_list(&field, list)?));
    }
    Ok(out)
}

/// `hosts`: `{ip, names}` entries for names outside the cluster zone.
fn hosts(f: &DnsConfiguration, cluster: &Name) -> anyhow::Result<Vec<(IpAddr, Vec<Name>)>> {
    let mut out = Vec::new();
    for (i, h) in f.hosts.iter().flatten().enumerate() {
        let ip = h.ip.trim().parse::<IpAddr>().map_err(|_| {
            bad(
                &format!("hosts[{i}].ip"),
                format!("{:?} is not an IP address", excerpt(&h.ip, 60)),
                "an IPv4 or IPv6 address",
            )
        })?;
        if h.names.is_empty() {
            return Err(bad(
                &format!("hosts[{i}].names"),
                "empty",
                "one name or more",
            ));
        }
        let mut names = Vec::new();
        for (j, n) in h.names.iter().enumerate() {
            let field = format!("hosts[{i}].names[{j}]");
            let n = name(&field, n)?;
            if within(cluster, &n) {
                return Err(bad(
                    &field,
                    "inside the cluster zone",
                    "a name outside the cluster zone",
                ));
            }
            names.push(n);
        }
        out.push((ip, names));
    }
    Ok(out)
}

/// `rewrites`: `{exact: NAME, to: NAME}` or `{suffix: NAME, to: NAME}`, tried in order.
fn rewrites(f: &DnsConfiguration) -> anyhow::Result<Vec<Rewrite>> {
    let mut out = Vec::new();
    for (i, r) in f.rewrites.iter().flatten().enumerate() {
        let field = format!("rewrites[{i}]");
        let from = match (&r.exact, &r.suffix) {
            (Some(e), None) => NameMatch::Exact(name(&format!("{field}.exact"), e)?),
            (None, Some(s)) => NameMatch::Suffix(name(&format!("{field}.suffix"), s)?),
            _ => {
                return Err(bad(
                    &field,
                    "needs exactly one of exact and suffix",
                    "{exact: NAME, to: NAME} or {suffix: NAME, to: NAME}",
                ))
            }
        };
        out.push(Rewrite {
            from,
            to: name(&format!("{field}.to"), &r.to)?,
        });
    }
    Ok(out)
}

fn cache(args: &DnsArgs, c: &CacheSection) -> anyhow::Result<CacheSettings> {
    let size = c.size.unwrap_or(10_000);
    if size == 0 {
        return Err(bad("cache.size", "0", "1 or more entries"));
    }
    let ttl = |v: &Option<String>, field: &str, default: u64| -> anyhow::Result<Duration> {
        let d = match v {
            Some(s) => duration(field, s)?,
            None => Duration::from_secs(default),
        };
        if d < Duration::from_secs(1) {
            return Err(bad(field, format!("{d:?}"), "1s or more"));
        }
        Ok(d)
    };
    let serve_stale = match (args.serve_stale, &c.serve_stale) {
        (Some(d), _) => Some(d),
        (None, Some(s)) => Some(duration("cache.serveStale", s)?).filter(|d| !d.is_zero()),
        (None, None) => None,
    };
    Ok(CacheSettings {
        size,
        max_ttl: ttl(&c.max_ttl, "cache.maxTTL", 3600)?,
        denial_ttl: ttl(&c.denial_ttl, "cache.denialTTL", 30)?,
        prefetch: args.prefetch || c.prefetch.unwrap_or(false),
        serve_stale,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: DnsArgs,
    }

    fn with_flags(flags: &[&str], yaml: &str) -> anyhow::Result<Settings> {
        let cli = Cli::try_parse_from(std::iter::once("dns").chain(flags.iter().copied()))?;
        let file: DnsConfiguration = weir_source::yaml::decode(yaml)
            .map_err(|e| anyhow::anyhow!("{:?}: {}", e.field, e.message))?;
        settings(&cli.args, &file, None)
    }

    fn parse(yaml: &str) -> Settings {
        with_flags(&[], yaml).unwrap_or_else(|e| panic!("{yaml}: {e:#}"))
    }

    fn err(yaml: &str) -> String {
        match with_flags(&[], yaml) {
            Ok(s) => panic!("{yaml}: accepted as {s:?}"),
            Err(e) => format!("{e:#}"),
        }
    }

    fn n(s: &str) -> Name {
        parse_name(s).unwrap()
    }

    fn addr(s: &str) -> Upstream {
        Upstream::Addr(s.parse().unwrap())
    }

    #[test]
    fn defaults_forward_to_the_nodes_resolv_conf_as_coredns() {
        let s = parse("{}");
        assert_eq!(
            s.upstreams,
            [Upstream::ResolvConf("/etc/resolv.conf".into())]
        );
        assert_eq!(s.listen, "0.0.0.0:53".parse().unwrap());
        assert_eq!(
            (s.zone.as_str(), s.ttl, s.pods),
            ("cluster.local", 5, PodsArg::Disabled)
        );
        assert_eq!(s.cache.max_ttl, Duration::from_secs(3600));
        assert_eq!(s.cache.denial_ttl, Duration::from_secs(30));
        assert_eq!(s.cache.size, 10_000);
        assert!(s.stub_domains.is_empty() && s.hosts.is_empty() && s.rewrites.is_empty());
        assert_eq!(
            (s.healthz_bind_address, s.metrics_bind_address),
            (None, Some("127.0.0.1:9153".parse().unwrap()))
        );
        // Refusing outside names takes saying so.
        assert!(parse("upstreams: []").upstreams.is_empty());
        let none = with_flags(&["--upstream-resolv-conf", "none"], "").unwrap();
        assert!(none.upstreams.is_empty());
    }

    /// kubeadm's Corefile, directive by directive (docs/dns.md's table).
    #[test]
    fn each_corefile_directive_has_its_field() {
        // health :8080 and ready :8181 → /livez and /healthz on one address.
        let s = parse("healthzBindAddress: 0.0.0.0:8080");
        assert_eq!(
            s.healthz_bind_address,
            Some("0.0.0.0:8080".parse().unwrap())
        );
        // prometheus :9153
        let s = parse("metricsBindAddress: 0.0.0.0:9153");
        assert_eq!(
            s.metrics_bind_address,
            Some("0.0.0.0:9153".parse().unwrap())
        );
        // kubernetes cluster.local in-addr.arpa ip6.arpa { pods insecure; ttl 30 }
        let s = parse("zone: k8s.example\npods: insecure\nttl: 30");
        assert_eq!(
            (s.zone.as_str(), s.pods, s.ttl),
            ("k8s.example", PodsArg::Insecure, 30)
        );
        // forward . /etc/resolv.conf, forward . 8.8.8.8 [2001:db8::1]:5353 { force_tcp }
        let s = parse(
            "upstreams: [/etc/resolv.conf, 8.8.8.8, '[2001:db8::1]:5353']\nupstreamTCP: true",
        );
        assert_eq!(
            s.upstreams,
            [
                Upstream::ResolvConf("/etc/resolv.conf".into()),
                addr("8.8.8.8:53"),
                addr("[2001:db8::1]:5353")
            ]
        );
        assert!(s.upstream_tcp);
        // cache 30 { success 5000; denial 5000 10; prefetch; serve_stale 1h }
        let s = parse(
            "cache: {maxTTL: 30s, size: 5000, denialTTL: 10s, prefetch: true, serveStale: 1h}",
        );
        assert_eq!(
            s.cache,
            CacheSettings {
                size: 5000,
                max_ttl: Duration::from_secs(30),
                denial_ttl: Duration::from_secs(10),
                prefetch: true,
                serve_stale: Some(Duration::from_secs(3600)),
            }
        );
        // autopath @kubernetes
        assert!(parse("autopath: true").autopath);
        // A server block per stub domain: example.com:53 { forward . 10.0.0.53 }
        let s = parse("stubDomains: {example.com: [10.0.0.53, /etc/stub.conf]}");
        assert_eq!(
            s.stub_domains,
            [(
                n("example.com"),
                vec![
                    addr("10.0.0.53:53"),
                    Upstream::ResolvConf("/etc/stub.conf".into())
                ]
            )]
        );
        // hosts { 10.1.2.3 db.corp; fallthrough }
        let s = parse("hosts: [{ip: 10.1.2.3, names: [db.corp, pg.corp]}]");
        assert_eq!(
            s.hosts,
            [(
                "10.1.2.3".parse().unwrap(),
                vec![n("db.corp"), n("pg.corp")]
            )]
        );
        // rewrite name exact A B; rewrite name suffix .corp .default.svc.cluster.local
        let s = parse(
            "rewrites:\n- {exact: a.corp, to: b.default.svc.cluster.local}\n- {suffix: corp, to: default.svc.cluster.local}",
        );
        assert_eq!(
            s.rewrites,
            [
                Rewrite {
                    from: NameMatch::Exact(n("a.corp")),
                    to: n("b.default.svc.cluster.local")
                },
                Rewrite {
                    from: NameMatch::Suffix(n("corp")),
                    to: n("default.svc.cluster.local")
                },
            ]
        );
    }

    #[test]
    fn flags_win_over_the_file() {
        let yaml = "ttl: 30\nzone: a.example\nupstreams: [10.0.0.1]\ncache: {serveStale: 1h}";
        let s = with_flags(
            &[
                "--ttl",
                "7",
                "--zone",
                "b.example",
                "--upstream-resolv-conf",
                "/x.conf",
                "--serve-stale",
                "2h",
            ],
            yaml,
        )
        .unwrap();
        assert_eq!((s.ttl, s.zone.as_str()), (7, "b.example"));
        assert_eq!(s.upstreams, [Upstream::ResolvConf("/x.conf".into())]);
        assert_eq!(s.cache.serve_stale, Some(Duration::from_secs(7200)));
        // A switch given as a flag turns the field on; the field alone does too.
        assert!(
            with_flags(
                &["--node-local"],
                "{nodeLocal: false, listen: 169.254.20.10:53}"
            )
            .unwrap()
            .node_local
        );
        assert!(parse("keepNodeLocal: true").keep_node_local);
    }

    /// Unknown fields at any depth and bad values: the field's path and what is accepted.
    #[test]
    fn bad_fields_and_values_name_the_field_and_what_is_accepted() {
        for (yaml, want) in [
            ("zones: cluster.local", "unknown field `zones`"),
            ("cache: {sise: 3}", "unknown field `sise`, expected one of size, maxTTL"),
            ("hosts: [{ip: 1.2.3.4, names: [a.b], ttl: 3}]", "unknown field `ttl`, expected one of ip, names"),
            ("rewrites: [{exact: a.b, to: c.d, answer: auto}]", "unknown field `answer`"),
            ("pods: secure", "expected one of disabled, insecure, verified"),
            ("listen: 53", "listen: \"53\" is not an address (accepted: IP:port"),
            ("healthzBindAddress: x", "healthzBindAddress: \"x\" is not an address"),
            ("upstreams: [resolv.conf]", "upstreams[0]: \"resolv.conf\" is neither a path nor an address (accepted: an absolute path"),
            ("stubDomains: {corp: []}", "stubDomains[\"corp\"]: no upstream"),
            ("stubDomains: {x.cluster.local: [1.1.1.1]}", "inside the cluster zone"),
            ("stubDomains: {corp: [nope]}", "stubDomains[\"corp\"][0]: \"nope\" is neither"),
            ("hosts: [{ip: 10.0.0.300, names: [a.b]}]", "hosts[0].ip: \"10.0.0.300\" is not an IP address (accepted: an IPv4 or IPv6 address)"),
            ("hosts: [{ip: 10.0.0.3, names: []}]", "hosts[0].names: empty"),
            ("hosts: [{ip: 10.0.0.3, names: [web.default.svc.cluster.local]}]", "hosts[0].names[0]: inside the cluster zone"),
            ("hosts: [{ip: 10.0.0.3, names: ['a..b']}]", "hosts[0].names[0]"),
            ("rewrites: [{to: a.b}]", "rewrites[0]: needs exactly one of exact and suffix"),
            ("rewrites: [{exact: a.b, suffix: b, to: c}]", "needs exactly one"),
            ("cache: {maxTTL: 3x}", "cache.maxTTL: invalid duration"),
            ("cache: {denialTTL: 0s}", "cache.denialTTL: 0ns (accepted: 1s or more)"),
            ("cache: {size: 0}", "cache.size: 0 (accepted: 1 or more entries)"),
            ("threads: 0", "threads: 0 (accepted: 1 or more)"),
            ("nodeLocal: true", "listen: 0.0.0.0:53: nodeLocal (--node-local) needs the cache's own address"),
            ("{nodeLocal: true, listen: '[fd00::10]:53'}", "accepted: an IPv4 address"),
        ] {
            let e = err(yaml);
            assert!(e.contains(want), "{yaml}: {e}");
        }
    }

    #[test]
    fn the_file_names_itself_and_its_kind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dns.yaml");
        for (text, want) in [
            (
                "kind: KubeProxyConfiguration\n",
                "kind: \"KubeProxyConfiguration\" (accepted: DnsConfiguration)",
            ),
            (
                "apiVersion: v1\n",
                "apiVersion: \"v1\" (accepted: weir.dev/v1alpha1)",
            ),
            (
                "cache:\n  size: 1\n  sise: 2\n",
                "line 3 (\"  sise: 2\"): cache.sise: unknown field",
            ),
            ("just text\n", "not a DnsConfiguration"),
        ] {
            std::fs::write(&path, text).unwrap();
            let e = format!("{:#}", load(&path).unwrap_err());
            assert!(e.starts_with(&path.display().to_string()), "{e}");
            assert!(e.contains(want), "{text}: {e}");
        }
        std::fs::write(
            &path,
            "apiVersion: weir.dev/v1alpha1\nkind: DnsConfiguration\nttl: 9\n",
        )
        .unwrap();
        assert_eq!(load(&path).unwrap().ttl, Some(9));
    }
}
