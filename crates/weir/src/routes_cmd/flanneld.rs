//! flanneld beside `weir routes`: each of flanneld's flags (v0.28, `main.go` with klog's `-v`,
//! `-vmodule` and `-log_backtrace_at`) with what weir does with it, in one list, [`ROWS`], on
//! the mechanism kube-proxy's flags use (`crate::foreign_flags`): the flags weir applies are
//! its own or aliases of them, the others are added hidden and noticed or refused by name
//! ([`FlanneldOnlyFlags`]). A test checks docs/routes.md's table against the list.
//!
//! Only `weir routes` takes them: `weir agent` speaks kube-proxy's flags, and two of
//! flanneld's (`--healthz-port`, `-v`) are kube-proxy's too.

use crate::foreign_flags::{differs, refused, same, OnlyFlags, Row, Table};

/// flanneld v0.28's flags and what `weir routes` does with each.
pub static ROWS: &[Row] = &[
    // The source of the nodes' subnets.
    refused(&["--kube-subnet-mgr"], "`=false` (etcd as the subnet store): weir reads the pod CIDRs from the Node objects only, as flanneld with --kube-subnet-mgr")
        .boolean()
        .harmless(&["true"])
        .tests(&["flanneld_flags_are_applied_noticed_or_refused_by_name"]),
    same(&["--kube-api-url"], "weir's --master: the API server's URL (overrides the kubeconfig's)")
        .tests(&["flanneld_flags_map_onto_weirs"]),
    same(&["--kubeconfig-file"], "weir's --kubeconfig; with neither it nor --master nor --manifests, in a pod, the in-cluster service account")
        .tests(&["flanneld_flags_map_onto_weirs"]),
    same(&["--kube-annotation-prefix"], "weir's --annotation-prefix, the prefix of the Node annotations read and published (weir's default `weir.dev`; `flannel.alpha.coreos.com` reads and writes flanneld's own)")
        .tests(&["flanneld_flags_map_onto_weirs"]),
    refused(&["--etcd-endpoints", "--etcd-prefix", "--etcd-keyfile", "--etcd-certfile", "--etcd-cafile", "--etcd-username", "--etcd-password"], "weir keeps nothing in etcd: pod CIDRs are the Nodes' `spec.podCIDRs` and each node's VTEP is published in its Node's annotations (flanneld's --kube-subnet-mgr); give --kubeconfig or --master, or run in a pod")
        .tests(&["flanneld_flags_are_applied_noticed_or_refused_by_name"]),
    differs(&["--subnet-lease-renew-margin"], "no effect: weir holds no subnet leases (flanneld renews them in etcd only)"),
    refused(&["--net-config-path"], "weir reads no net-conf.json: its `Backend` is --backend (`host-gw` or `vxlan`) with --vni and --port; `Network` and `EnableIPv6` follow from the Nodes' pod CIDRs"),
    // The underlay.
    differs(&["--iface"], "weir's --iface, an interface name given once: the VTEP's underlay device (default: the one holding this node's InternalIP); flanneld also takes an IP and tries several in order")
        .applied()
        .tests(&["flanneld_flags_map_onto_weirs"]),
    refused(&["--iface-regex", "--iface-can-reach"], "name the underlay device with --iface (default: the device holding this node's InternalIP)"),
    refused(&["--public-ip", "--public-ipv6"], "weir publishes the address of its underlay device as `public-ip`/`public-ipv6`: choose it with --iface, or through the Node's InternalIP (kubelet's --node-ip)")
        .harmless(&[""])
        .tests(&["flanneld_flags_are_applied_noticed_or_refused_by_name"]),
    // What flanneld writes besides routes.
    refused(&["--subnet-file"], "weir writes no subnet.env: weir-cni's conflist holds the pod CIDR (the install step writes the Node's) and weir-cni reads the MTU from --mtu-file; --status writes every node's state and the overlay MTU as JSON")
        .tests(&["flanneld_flags_are_applied_noticed_or_refused_by_name"]),
    refused(&["--ip-masq"], "`=true`: weir routes writes no masquerade rules; weir-cni masquerades pod traffic leaving the cluster (its conflist's `ipMasq` with `clusterCIDR`)")
        .boolean()
        .harmless(&["false"])
        .tests(&["flanneld_flags_are_applied_noticed_or_refused_by_name"]),
    differs(&["--ip-masq-fully-random-disable"], "no effect: weir routes writes no masquerade rules")
        .boolean()
        .harmless(&["false"]),
    differs(&["--iptables-resync"], "no effect: weir routes writes no iptables rules; its periodic repair of routes and VTEP entries is --sync-period (default 30s)")
        .harmless(&["5"])
        .tests(&["flanneld_flags_are_applied_noticed_or_refused_by_name"]),
    refused(&["--iptables-forward-rules"], "`=true` (flanneld's default: ACCEPT rules for the pod network in FORWARD): weir writes no FORWARD rules; with a FORWARD policy of DROP, allow the cluster's pod CIDRs yourself")
        .boolean()
        .harmless(&["false"]),
    refused(&["--ip-blackhole-route"], "`=true`: weir adds no blackhole route for this node's pod CIDR")
        .boolean()
        .harmless(&["false"]),
    refused(&["--set-node-network-unavailable"], "`=true` (flanneld's default): weir does not set the Node's NetworkUnavailable condition")
        .boolean()
        .harmless(&["false"]),
    // The process.
    refused(&["--healthz-port"], "weir routes serves no /healthz; `weir agent --parts=routes` serves it at --healthz-bind-address, naming the routes part's state")
        .harmless(&["0"]),
    differs(&["--healthz-ip"], "no effect: weir routes serves no /healthz (see --healthz-port)")
        .harmless(&["0.0.0.0"]),
    differs(&["-v", "--v"], "maps onto weir's log levels as `weir proxy -v` does: 0–1 info; 2–3 debug and 4–5 trace for weir's own crates; 6 and more also its libraries' debug; RUST_LOG, when set, wins")
        .applied()
        .tests(&["flanneld_flags_map_onto_weirs"]),
    differs(&["--vmodule", "--log_backtrace_at"], "no effect: klog's; RUST_LOG filters weir's log by module")
        .harmless(&["", ":0"]),
    differs(&["--version"], "prints weir's version line and exits")
        .boolean()
        .applied()
        .tests(&["flanneld_flags_map_onto_weirs"]),
    differs(&["--help", "-h"], "weir's help: weir's flags and the flanneld flags weir applies; those it only notices or refuses are not listed (this table lists them)")
        .applied(),
];

/// flanneld's list, for [`OnlyFlags`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flanneld;

impl Table for Flanneld {
    fn rows() -> &'static [Row] {
        ROWS
    }
}

/// flanneld's flags that weir has no flag of its own for, as given: noticed or refused by name
/// (hidden from `--help`).
pub type FlanneldOnlyFlags = OnlyFlags<Flanneld>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::foreign_flags::{arg_id, doc_table, Findings};
    use clap::{CommandFactory, Parser};

    fn parse(args: &[&str]) -> Result<super::super::RoutesArgs, clap::Error> {
        let mut argv = vec!["weir", "routes"];
        argv.extend_from_slice(args);
        match crate::Cli::try_parse_from(argv)?.command {
            crate::Command::Routes(a) => Ok(a),
            _ => unreachable!("not routes"),
        }
    }

    /// A valid value for each of flanneld's flags.
    fn sample(flag: &str) -> &'static str {
        match flag {
            "--kube-api-url" => "https://10.0.0.1:6443",
            "--iface" => "eth0",
            "--public-ip" => "10.0.0.1",
            "--public-ipv6" => "fd00::1",
            "--healthz-ip" => "0.0.0.0",
            "--log_backtrace_at" => ":0",
            "--etcd-endpoints" => "http://127.0.0.1:2379",
            f if f.ends_with("file") || f.ends_with("path") => "/tmp/x",
            _ => "1",
        }
    }

    /// flanneld v0.28's flags (`main.go`'s `flannelFlags`, the three klog flags it copies,
    /// Go flag's help).
    const FLANNELD: &[&str] = &[
        "etcd-endpoints",
        "etcd-prefix",
        "etcd-keyfile",
        "etcd-certfile",
        "etcd-cafile",
        "etcd-username",
        "etcd-password",
        "iface",
        "iface-regex",
        "iface-can-reach",
        "subnet-file",
        "public-ip",
        "public-ipv6",
        "subnet-lease-renew-margin",
        "ip-masq",
        "ip-masq-fully-random-disable",
        "kube-subnet-mgr",
        "kube-api-url",
        "kube-annotation-prefix",
        "kubeconfig-file",
        "version",
        "healthz-ip",
        "healthz-port",
        "iptables-resync",
        "iptables-forward-rules",
        "ip-blackhole-route",
        "net-config-path",
        "set-node-network-unavailable",
        "v",
        "vmodule",
        "log_backtrace_at",
        "help",
    ];

    #[test]
    fn every_flanneld_flag_has_a_row_and_parses_through_the_real_command() {
        let in_rows: std::collections::BTreeSet<&str> = ROWS
            .iter()
            .flat_map(|r| r.flags())
            .filter(|f| f.starts_with("--"))
            .map(|f| &f[2..])
            .collect();
        let flanneld: std::collections::BTreeSet<&str> = FLANNELD.iter().copied().collect();
        assert_eq!(in_rows, flanneld);
        for row in ROWS {
            for flag in row.flags().filter(|f| !matches!(*f, "-h" | "--help")) {
                let forms: Vec<String> = match (flag, row.boolean) {
                    (_, true) => vec![flag.to_string(), format!("{flag}=false")],
                    ("-v", _) => vec!["-v=2".into(), "-v2".into()],
                    _ => vec![format!("{flag}={}", sample(flag))],
                };
                for form in forms {
                    if let Err(e) = parse(&[&form]) {
                        panic!("{form}: {e}");
                    }
                }
            }
        }
        // A value flag also takes its value as the next argument.
        assert!(parse(&["--iptables-resync", "10"]).is_ok());
        assert!(parse(&["--no-such-flag"]).is_err());
    }

    #[test]
    fn the_flags_weir_lacks_come_from_the_list_and_the_rest_are_typed() {
        let cli = crate::Cli::command();
        let routes = cli.find_subcommand("routes").unwrap();
        for row in ROWS {
            for flag in row.flags().filter(|f| !matches!(*f, "-h" | "--help")) {
                let id = arg_id(flag);
                let arg = routes
                    .get_arguments()
                    .find(|a| {
                        a.get_long() == Some(id)
                            || a.get_all_aliases().is_some_and(|v| v.contains(&id))
                            || (flag.len() == 2 && a.get_short() == flag.chars().nth(1))
                    })
                    .unwrap_or_else(|| panic!("{flag} is not an argument"));
                // One weir applies is weir's own flag or its alias; the others are hidden.
                let own = arg.get_long() != Some(id) || !arg.is_hide_set();
                assert_eq!(own, row.applied, "{flag}");
            }
        }
    }

    #[test]
    fn rows_are_well_formed() {
        doc_table::well_formed(ROWS);
    }

    /// docs/routes.md's section "flanneld beside weir routes" holds exactly these rows.
    #[test]
    fn the_docs_table_is_this_list() {
        doc_table::check(
            "routes.md",
            "flanneld beside weir routes",
            "| kind | flanneld v0.28 | weir | what weir does |",
            ROWS,
        );
    }

    #[test]
    fn flanneld_flags_map_onto_weirs() {
        let a = parse(&[
            "--kube-api-url=https://10.0.0.1:6443",
            "--kubeconfig-file",
            "/etc/kube.conf",
            "--kube-annotation-prefix=flannel.alpha.coreos.com",
            "--iface=eth1",
            "-v=4",
        ])
        .unwrap();
        let f = &a.flags;
        assert_eq!(f.source.master.as_deref(), Some("https://10.0.0.1:6443"));
        assert_eq!(
            f.source.kubeconfig.as_deref(),
            Some(std::path::Path::new("/etc/kube.conf"))
        );
        assert_eq!(f.options.annotation_prefix, "flannel.alpha.coreos.com");
        assert_eq!(f.options.iface.as_deref(), Some("eth1"));
        assert_eq!(f.log_filter().as_deref(), Some("info,weir=trace"));
        assert!(f.flanneld.given.is_empty(), "{:?}", f.flanneld.given);
        assert!(parse(&["--version"]).unwrap().flags.version);
        assert!(!parse(&["--version=false"]).unwrap().flags.version);
    }

    #[test]
    fn flanneld_flags_are_applied_noticed_or_refused_by_name() {
        let a = parse(&[
            "--kube-subnet-mgr",
            "--ip-masq=false",
            "--iptables-resync=5",
            "--public-ip=",
            "--iptables-resync",
            "10",
            "--subnet-file=/run/flannel/subnet.env",
            "--ip-masq",
            "--etcd-endpoints=http://127.0.0.1:2379",
            "--public-ip=10.0.0.1",
            "--kube-subnet-mgr=false",
        ])
        .unwrap();
        let mut f = Findings::default();
        a.flags.flanneld.check(&mut f);
        // flanneld's defaults and what weir does anyway pass silently; the rest is named.
        assert_eq!(f.notices.len(), 1, "{:?}", f.notices);
        assert!(f.notices[0].starts_with("--iptables-resync=10: accepted; no effect"));
        let refused: Vec<&str> = f
            .refused
            .iter()
            .map(|r| r.split(": refused").next().unwrap())
            .collect();
        assert_eq!(
            refused,
            [
                "--subnet-file=/run/flannel/subnet.env",
                "--ip-masq=true",
                "--etcd-endpoints=http://127.0.0.1:2379",
                "--public-ip=10.0.0.1",
                "--kube-subnet-mgr=false",
            ]
        );
        assert!(f.refused[0].contains("--mtu-file"), "{}", f.refused[0]);
    }
}
