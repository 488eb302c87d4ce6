//! What is wrong with `weir proxy`'s flags and KubeProxyConfiguration file, every problem at
//! once ([`Invalid`]), and `--validate`'s report: the effective settings as a short list (or
//! JSON for CI), the notices, the problems. The agent refuses to start on any problem, so
//! `--validate` passing means the agent would run with what it printed.

use std::time::Duration;

use clap::ValueEnum;
use serde_json::Value;

use super::config::{ProxyMode, Settings};
pub use super::problems::{go_duration, problems_of, Invalid, Problem};

/// The problems only `--validate` looks for, because the agent meets them itself at start:
/// a kubeconfig that cannot be read.
pub fn check_environment(s: &Settings) -> Vec<Problem> {
    let Some(path) = s.api.as_ref().and_then(|a| a.kubeconfig.as_ref()) else {
        return Vec::new();
    };
    match weir_source::api::check_kubeconfig(path) {
        Ok(()) => Vec::new(),
        Err(e) => vec![Problem {
            field: Some("--kubeconfig".into()),
            ..Problem::msg(e)
        }],
    }
}

/// `--validate`'s output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// What `--validate` found.
pub struct Report {
    pub settings: Option<Settings>,
    pub notices: Vec<String>,
    pub problems: Vec<Problem>,
}

/// The effective settings as (key, value) rows: the text list and the JSON object alike.
fn rows(s: &Settings) -> Vec<(&'static str, String)> {
    let list = |v: &[ipnet::IpNet]| match v {
        [] => "-".to_string(),
        v => v
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(","),
    };
    let addr = |a: Option<std::net::SocketAddr>| a.map_or("off".into(), |a| a.to_string());
    let source = match &s.api {
        Some(api) => match (&api.kubeconfig, &api.master) {
            (None, None) => "API, in-cluster service account".to_string(),
            (k, m) => format!(
                "API, kubeconfig {}, master {}",
                k.as_ref().map_or("-".into(), |k| k.display().to_string()),
                m.as_deref().unwrap_or("-")
            ),
        },
        None => format!("manifests {}", s.manifests.display()),
    };
    let mut rows = vec![
        ("mode", s.mode.as_str().to_string()),
        ("node_name", s.node_name.clone()),
        ("source", source),
        ("cluster_cidrs", list(&s.cluster_cidrs)),
        ("nodeport_addresses", nodeports(s)),
        ("masquerade_all", s.masquerade_all.to_string()),
        ("masquerade_mark", format!("{:#x}", s.masquerade_mark)),
        ("sync_period", go_duration(s.sync_period)),
        ("min_sync_period", go_duration(s.min_sync_period)),
        ("full_sync_period", go_duration(s.full_sync_period)),
        ("healthz", addr(s.healthz_bind_address)),
        ("metrics", addr(s.metrics_bind_address)),
    ];
    rows.extend(mode_rows(s));
    rows.push(("conntrack", conntrack(s)));
    let log = format!(
        "{}, verbosity {}",
        s.log.format.map_or("as --log-format", |f| match f {
            crate::LogFormat::Text => "text",
            crate::LogFormat::Json => "json",
        }),
        s.log.verbosity.map_or("-".into(), |v| v.to_string())
    );
    rows.push(("log", log));
    rows
}

fn nodeports(s: &Settings) -> String {
    if !s.nodeport_addresses.is_empty() {
        let v: Vec<String> = s.nodeport_addresses.iter().map(|n| n.to_string()).collect();
        return v.join(",");
    }
    match s.nodeport_default {
        weir_model::NodePortDefault::Primary => "the node's primary IPs".into(),
        weir_model::NodePortDefault::AllLocal => "every local address".into(),
    }
}

/// The rows only the mode reads.
fn mode_rows(s: &Settings) -> Vec<(&'static str, String)> {
    match s.mode {
        ProxyMode::Ipvs => vec![
            ("ipvs_scheduler", s.ipvs.scheduler.clone()),
            (
                "ipvs_timeouts",
                format!(
                    "tcp {}, tcpfin {}, udp {} (0s: the kernel's)",
                    go_duration(s.ipvs.tcp_timeout),
                    go_duration(s.ipvs.tcp_fin_timeout),
                    go_duration(s.ipvs.udp_timeout)
                ),
            ),
            ("ipvs_strict_arp", s.ipvs.strict_arp.to_string()),
        ],
        ProxyMode::Iptables => vec![(
            "iptables_backend",
            format!("{:?}", s.iptables_backend).to_lowercase(),
        )],
        _ => Vec::new(),
    }
}

fn conntrack(s: &Settings) -> String {
    let c = &s.conntrack;
    let mut parts = Vec::new();
    let n = |name: &str, v: Option<u32>| v.map(|v| format!("{name} {v}"));
    let d = |name: &str, v: Option<Duration>| v.map(|v| format!("{name} {}", go_duration(v)));
    parts.extend(n("max-per-core", c.max_per_core));
    parts.extend(n("min", c.min));
    parts.extend(d("tcp-established", c.tcp_established_timeout));
    parts.extend(d("tcp-close-wait", c.tcp_close_wait_timeout));
    parts.extend(c.tcp_be_liberal.map(|b| format!("tcp-be-liberal {b}")));
    parts.extend(d("udp", c.udp_timeout));
    parts.extend(d("udp-stream", c.udp_stream_timeout));
    match parts.is_empty() {
        true => "left as the kernel has it".into(),
        false => parts.join(", "),
    }
}

impl Report {
    pub fn valid(&self) -> bool {
        self.problems.is_empty()
    }

    pub fn render(&self, format: Output) -> String {
        match format {
            Output::Text => self.text(),
            Output::Json => {
                let settings = self.settings.as_ref().map(|s| {
                    let map: serde_json::Map<String, Value> = rows(s)
                        .into_iter()
                        .map(|(k, v)| (k.to_string(), Value::String(v)))
                        .collect();
                    Value::Object(map)
                });
                let doc = serde_json::json!({
                    "valid": self.valid(),
                    "settings": settings,
                    "notices": self.notices,
                    "problems": self.problems,
                });
                format!(
                    "{}\n",
                    serde_json::to_string_pretty(&doc).expect("JSON values")
                )
            }
        }
    }

    fn text(&self) -> String {
        let mut out = String::new();
        if let Some(s) = self.settings.as_ref().filter(|_| self.valid()) {
            out.push_str("settings:\n");
            for (k, v) in rows(s) {
                out.push_str(&format!("  {:<20} {v}\n", k.replace('_', " ")));
            }
        }
        for n in &self.notices {
            out.push_str(&format!("notice: {n}\n"));
        }
        for p in &self.problems {
            out.push_str(&format!("problem: {p}\n"));
        }
        out.push_str(&match self.problems.len() {
            0 => format!("valid ({} notice(s))\n", self.notices.len()),
            n => format!("invalid: {n} problem(s); the agent would not start\n"),
        });
        out
    }
}

/// `weir proxy --validate` on bad input, through the real command line: each configuration
/// fails, and its problems hold the message it must (pure: a temporary file, no root).
#[cfg(test)]
mod bad_configs {
    use super::*;

    /// `--validate`'s report for `args` and, when given, `yaml` as --config.
    fn report(args: &[&str], yaml: Option<&str>) -> Report {
        use clap::Parser;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kp.yaml");
        let mut argv: Vec<String> = ["weir", "proxy", "--validate", "--hostname-override=n1"]
            .map(String::from)
            .to_vec();
        if let Some(yaml) = yaml {
            std::fs::write(&path, yaml).unwrap();
            argv.push(format!("--config={}", path.display()));
        }
        argv.extend(args.iter().map(|a| a.to_string()));
        let argv = argv.into_iter().map(Into::into).collect();
        let cli = crate::Cli::try_parse_from(super::super::kube_proxy_spelling(argv))
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        match cli.command {
            crate::Command::Proxy(a) => super::super::validate_report(&a.flags),
            #[allow(unreachable_patterns)]
            _ => unreachable!(),
        }
    }

    /// A configuration with its two header lines (so its own lines count from 3).
    macro_rules! h {
        ($body:literal) => {
            concat!(
                "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n",
                $body
            )
        };
    }

    #[test]
    fn each_bad_configuration_fails_naming_its_problem() {
        let ipvs_off = h!("featureGates:\n  KubeProxyIPVS: false\nmode: ipvs\n");
        let passwd =
            "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n";
        #[rustfmt::skip]
        let cases: &[(&[&str], Option<&str>, &str)] = &[
            (&[], Some(""), "kp.yaml: empty: a KubeProxyConfiguration needs"),
            (&[], Some("# nothing yet\n\n"), "kp.yaml: empty:"),
            (&["--config=/nonexistent/kp.yaml"], None, "/nonexistent/kp.yaml: cannot read it"),
            (&[], Some(passwd), "not a KubeProxyConfiguration (a YAML mapping of fields): the file reads as a YAML string"),
            (&[], Some("- mode: ipvs\n"), "the file reads as a YAML sequence"),
            (&[], Some(h!("mode: [ipvs\n")), "kp.yaml: line 3: mode: unclosed bracket '['"),
            (&[], Some(h!("root:x:0:0:root:/root:/bin/bash\nbin:x:1:1::/:/sbin/nologin\n")), "not YAML: simple key expected ':'"),
            (&[], Some("apiVersion: kubeproxy.config.k8s.io/v1beta9\n"), "line 1: apiVersion: \"kubeproxy.config.k8s.io/v1beta9\" is not kubeproxy.config.k8s.io/v1alpha1"),
            (&[], Some("kind: KubeProxyConfiguration\napiVersion: v1\n"), "line 2: apiVersion: \"v1\" is not"),
            (&[], Some("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n"), "line 2: kind: \"KubeletConfiguration\" is not KubeProxyConfiguration"),
            (&[], Some("kind: KubeProxyConfiguration\nclusterCidr: 10.0.0.0/8\n"), "line 2: unknown field clusterCidr (did you mean clusterCIDR?)"),
            (&[], Some(h!("iptables:\n  masqueradBit: 3\n")), "line 4: unknown field iptables.masqueradBit (did you mean masqueradeBit?)"),
            (&[], Some(h!("mode: ipvs\nipvs:\n  strictArp: true\n")), "line 5: unknown field ipvs.strictArp (did you mean strictARP?)"),
            (&[], Some(h!("conntrack:\n  tcpBeLiberl: true\n")), "unknown field conntrack.tcpBeLiberl (did you mean tcpBeLiberal?)"),
            (&[], Some(h!("logging:\n  options:\n    text:\n      colour: true\n")), "line 6: unknown field logging.options.text.colour (logging.options.text has infoBufferSize, splitStream)"),
            (&[], Some(h!("proxyMode: ipvs\n")), "line 3: unknown field proxyMode"),
            (&[], Some(h!("initOnly: true\n")), "unknown field initOnly"),
            (&[], Some(h!("mode: kernelspace\n")), "config mode \"kernelspace\": weir supports nftables, iptables, ipvs and userspace"),
            (&[], Some(ipvs_off), "the feature gate KubeProxyIPVS is false"),
            (&[], Some(h!("clusterCIDR: banana\n")), "config clusterCIDR: \"banana\" is not a CIDR"),
            (&[], Some(h!("mode: iptables\niptables:\n  syncPeriod: soon\n")), "config iptables.syncPeriod: invalid duration \"soon\""),
            (&[], Some(h!("mode: iptables\niptables:\n  masqueradeBit: 40\n")), "config masqueradeBit 40: must be within 0..31"),
            (&[], Some(h!("iptables:\n  masqueradeAll: maybe\n")), "line 4: iptables.masqueradeAll: invalid boolean"),
            (&[], Some(h!("oomScoreAdj: 5000\n")), "config oomScoreAdj 5000: must be within -1000..1000"),
            (&[], Some(h!("bindAddress: nope\n")), "config bindAddress: \"nope\" is not an IP"),
            (&[], Some(h!("healthzBindAddress: here\n")), "config healthzBindAddress: \"here\" is not IP:port or IP"),
            (&[], Some(h!("detectLocalMode: NodeCIDR\n")), "detectLocalMode=NodeCIDR: refused"),
            (&[], Some(h!("featureGates:\n  AllowServiceExternalIPs: false\n")), "featureGates AllowServiceExternalIPs=false: refused"),
            (&[], Some(h!("featureGates:\n  NFTablesNetlink: maybe\n")), "featureGates.NFTablesNetlink: \"maybe\" is not true or false"),
            (&[], Some(h!("logging:\n  format: xml\n")), "config logging.format \"xml\": weir writes text or json"),
            (&[], Some(h!("conntrack:\n  min: -1\n")), "config conntrack.min: -1 is not 0 or more"),
            (&[], Some(h!("nodePortAddresses: [primary, 10.0.0.0/8]\n")), "\"primary\" cannot be combined with CIDRs"),
            (&[], Some(h!("mode: ipvs\nipvs:\n  scheduler: fastest\n")), "fastest"),
            (&[], Some(h!("mode: iptables\niptables:\n  syncPeriod: 1s\n  minSyncPeriod: 10s\n")), "min-sync-period: 10s is longer than the sync period 1s"),
            (&["--min-sync-period=10s", "--sync-period=1s"], None, "min-sync-period: 10s is longer than the sync period 1s"),
            (&["--full-sync-period=0s"], None, "--sync-period and --full-sync-period must be greater than 0"),
            (&["--kubeconfig=/nonexistent"], None, "--kubeconfig: failed to read kubeconfig from '\"/nonexistent\"'"),
            (&[], Some(h!("clientConnection:\n  kubeconfig: /nonexistent/kc\n")), "--kubeconfig: failed to read kubeconfig from '\"/nonexistent/kc\"'"),
            (&["--manifests=/m", "--master=https://10.0.0.1:6443"], None, "are two sources: choose one"),
            (&["--detect-local-mode=BridgeInterface"], None, "--detect-local-mode=BridgeInterface: refused"),
            (&["--feature-gates=KubeProxyIPVS=false", "--proxy-mode=ipvs"], None, "KubeProxyIPVS is false"),
            (&["--feature-gates=NoEquals"], None, "--feature-gates: \"NoEquals\": expected Name=true or Name=false"),
            (&["--ipvs-scheduler=fastest", "--proxy-mode=ipvs"], None, "--ipvs-scheduler"),
        ];
        assert!(cases.len() >= 30, "{} cases", cases.len());
        let mut wrong = Vec::new();
        for (args, yaml, want) in cases {
            let r = report(args, *yaml);
            let problems: Vec<String> = r.problems.iter().map(Problem::to_string).collect();
            if r.valid() || !problems.iter().any(|p| p.contains(want)) {
                wrong.push(format!(
                    "{args:?} {yaml:?}\n  want {want:?}\n  got  {problems:#?}"
                ));
            }
            let text = r.render(Output::Text);
            assert!(text.ends_with("; the agent would not start\n"), "{text}");
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn every_problem_is_listed_at_once_and_a_valid_file_lists_its_settings() {
        let yaml = h!("clusterCidr: 10.0.0.0/8\nmode: kernelspace\nconntrack:\n  min: -1\n");
        let r = report(&["--min-sync-period=1m"], Some(yaml));
        let problems: Vec<String> = r.problems.iter().map(Problem::to_string).collect();
        assert_eq!(r.problems.len(), 4, "{problems:#?}");
        for want in [
            "clusterCidr",
            "kernelspace",
            "conntrack.min",
            "min-sync-period",
        ] {
            assert!(
                problems.iter().any(|p| p.contains(want)),
                "{want}: {problems:#?}"
            );
        }
        let json: Value = serde_json::from_str(&r.render(Output::Json)).unwrap();
        assert_eq!(json["valid"], false);
        assert_eq!(json["problems"][0]["line"], 3);
        assert!(json["problems"][0]["file"]
            .as_str()
            .unwrap()
            .ends_with("kp.yaml"));

        // ipvs.strictARP and iptables.masqueradeBit are kube-proxy's: read in their modes,
        // named as ignored in the others (kubeadm's zero values pass silently).
        let yaml = h!("ipvs:\n  strictARP: true\n  scheduler: \"\"\niptables:\n  masqueradeBit: 12\n  syncPeriod: 0s\n");
        let r = report(&[], Some(yaml));
        assert!(r.valid(), "{:?}", r.problems);
        let notices = r.notices.join("\n");
        assert_eq!(r.notices.len(), 2, "{notices}");
        assert!(notices.contains("ipvs.strictARP=true: ignored: nftables mode does not read it"));
        assert!(notices.contains("iptables.masqueradeBit=12: ignored: nftables mode"));
        let r = report(&["--proxy-mode=ipvs"], Some(yaml));
        let s = r.settings.as_ref().unwrap();
        assert!(s.ipvs.strict_arp && s.masquerade_mark == 1 << 12 && r.notices.is_empty());
        let text = r.render(Output::Text);
        for want in [
            "  mode                 ipvs\n",
            "  masquerade mark      0x1000\n",
            "  ipvs strict arp      true\n",
            "valid (0 notice(s))\n",
        ] {
            assert!(text.contains(want), "{want:?} in\n{text}");
        }
        assert!(!text.contains("Settings {"), "{text}");
        let json: Value = serde_json::from_str(&r.render(Output::Json)).unwrap();
        assert_eq!(json["settings"]["sync_period"], "30s");
        assert_eq!(json["valid"], true);
    }
}
