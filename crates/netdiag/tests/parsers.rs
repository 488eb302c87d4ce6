//! The parsers on real outputs captured from a scratch network namespace (tests/data/README.md
//! says how), plus the hand-made shapes operators paste (1.4-era saves, grep-cut files).

use std::path::PathBuf;

use weir_netdiag::iproute::{
    parse_addrs, parse_links, parse_neighbours, parse_routes, parse_rules,
};
use weir_netdiag::iptables::{self, Backend};
use weir_netdiag::state::{NodeState, Output};
use weir_netdiag::{nft, sysctl};

fn data(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn iptables_nft_save_kube_layout() {
    let p = iptables::parse(&data("eni-node/iptables-save.txt"));
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    let d = p.value;
    assert_eq!(d.backend, Some(Backend::Nft));
    assert_eq!(d.version.as_deref(), Some("v1.8.9"));
    assert!(d.assumptions.is_empty());
    assert_eq!(
        d.chain("filter", "FORWARD").unwrap().policy.as_deref(),
        Some("DROP")
    );
    assert_eq!(d.chain("nat", "KUBE-SERVICES").unwrap().policy, None);
    let svc = d.chain("nat", "KUBE-SVC-LBEDGE7777777777").unwrap();
    assert_eq!(svc.rules.len(), 4);
    let first_ep = &svc.rules[1];
    assert_eq!(
        first_ep
            .module_arg("statistic", "--probability")
            .unwrap()
            .values,
        ["0.33333333349"]
    );
    assert_eq!(first_ep.target_name(), Some("KUBE-SEP-AAAAAAAAAAAAAAAA"));
    assert_eq!(
        first_ep.comment(),
        Some("default/edge:https -> 10.12.200.5:8443")
    );
    let sep = d.chain("nat", "KUBE-SEP-AAAAAAAAAAAAAAAA").unwrap();
    assert_eq!(
        sep.rules[1].target_arg("--to-destination"),
        Some("10.12.200.5:8443")
    );
    // The rule's text is kept as written, so a trace can quote it.
    assert!(sep.rules[1]
        .text
        .starts_with("-A KUBE-SEP-AAAAAAAAAAAAAAAA -p tcp"));
    let masq = &d.chain("nat", "KUBE-POSTROUTING").unwrap().rules[2];
    assert_eq!(masq.target_name(), Some("MASQUERADE"));
    assert_eq!(masq.target.as_ref().unwrap().args[0].name, "--random-fully");
    let not_marked = &d.chain("nat", "KUBE-POSTROUTING").unwrap().rules[0];
    let mark = not_marked.module_arg("mark", "--mark").unwrap();
    assert!(mark.negated);
    assert_eq!(mark.values, ["0x4000/0x4000"]);
    assert_eq!(d.rules().count(), 31);
}

#[test]
fn iptables_legacy_save_and_1_4_style() {
    let legacy = iptables::parse(&data("iptables-legacy-save.txt"));
    assert!(legacy.skipped.is_empty(), "{:?}", legacy.skipped);
    // iptables-legacy-save 1.8 writes "iptables-save v1.8.9" with no back end mark.
    assert_eq!(legacy.value.backend, Some(Backend::Unknown));
    assert_eq!(legacy.value.rules().count(), 31);

    let old = iptables::parse(&data("iptables-1.4-save.txt"));
    assert!(old.skipped.is_empty(), "{:?}", old.skipped);
    let d = old.value;
    assert_eq!(d.version.as_deref(), Some("v1.4.21"));
    let input = &d.chain("filter", "INPUT").unwrap().rules[0];
    let s = input.arg("-s").unwrap();
    assert!(s.negated, "1.4's `-s ! net` negation");
    assert_eq!(s.values, ["192.168.0.0/16"]);
    assert_eq!(input.arg("--dport").unwrap().values, ["22"]);
    let svc = d.chain("nat", "KUBE-SVC-OLDSVC0000000000").unwrap();
    assert_eq!(svc.rules.len(), 2);
    assert_eq!(
        d.chain("filter", "FORWARD").unwrap().policy.as_deref(),
        Some("DROP")
    );
}

#[test]
fn grep_cut_and_dash_s_outputs_get_inferred_tables() {
    let p = iptables::parse(&data("iptables-grep-cut.txt"));
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    let d = p.value;
    assert_eq!(
        d.chain("nat", "KUBE-SVC-LBEDGE7777777777")
            .unwrap()
            .rules
            .len(),
        4
    );
    assert_eq!(
        d.chain("nat", "KUBE-SEP-AAAAAAAAAAAAAAAA")
            .unwrap()
            .rules
            .len(),
        2
    );
    assert!(!d.assumptions.is_empty());
    assert!(
        d.assumptions.iter().all(|a| a.contains("nat")),
        "{:?}",
        d.assumptions
    );

    let s = iptables::parse(&data("iptables-S-filter.txt"));
    assert!(s.skipped.is_empty(), "{:?}", s.skipped);
    let fwd = s.value.chain("filter", "FORWARD").unwrap().clone();
    assert_eq!(fwd.policy.as_deref(), Some("DROP"));
    assert_eq!(fwd.rules.len(), 2);
}

#[test]
fn nft_json_ruleset() {
    let p = nft::parse(&data("eni-node/nft-ruleset.json"));
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    let rs = p.value;
    assert_eq!(rs.version.as_deref(), Some("1.0.6"));
    // iptables-nft's tables are listed, their rules marked as xt.
    assert!(rs
        .rules
        .iter()
        .filter(|r| r.table == "nat" && r.family == "ip")
        .all(|r| r.uses_xt || r.expr.iter().all(|e| e.get("xt").is_none())));
    assert!(rs.rules.iter().any(|r| r.uses_xt));
    let pre = rs.base_chains("prerouting", &["ip", "inet"]);
    let order: Vec<(&str, i64)> = pre
        .iter()
        .map(|c| (c.name.as_str(), c.hook.as_ref().unwrap().priority))
        .collect();
    // mangle (-150) before dstnat (-100), each of ip and inet.
    assert!(order.windows(2).all(|w| w[0].1 <= w[1].1), "{order:?}");
    assert!(order.contains(&("net-eni-eth1", -150)));
    assert!(order.contains(&("nat-prerouting", -100)));
    let fwd = rs
        .chains
        .iter()
        .find(|c| c.table == "kube-proxy" && c.name == "filter-forward")
        .unwrap();
    assert_eq!(fwd.hook.as_ref().unwrap().policy, "drop");
    let texts: Vec<&str> = rs
        .rules
        .iter()
        .filter(|r| r.table == "kube-proxy")
        .map(|r| r.text.as_str())
        .collect();
    assert!(
        texts.contains(&"ip daddr 10.96.0.11 tcp dport 80 dnat to 10.244.1.6:8080"),
        "{texts:#?}"
    );
    assert!(
        texts
            .iter()
            .any(|t| t.starts_with("ip daddr . meta l4proto . th dport vmap @service-ips")),
        "{texts:#?}"
    );
    assert!(
        texts
            .iter()
            .any(|t| t.contains("ct state established,related accept")),
        "{texts:#?}"
    );
    let map = rs.set("ip", "kube-proxy", "service-ips").unwrap();
    assert!(map.is_map);
    assert_eq!(map.elements.len(), 1);
    let eni = rs.set("inet", "weir-eni", "enis").unwrap();
    assert_eq!(eni.elements, [serde_json::json!("eth1")]);
}

#[test]
fn ip_rule_json_and_text_agree() {
    let j = parse_rules(&data("eni-node/ip-rule.json"));
    let t = parse_rules(&data("eni-node/ip-rule.txt"));
    assert!(j.skipped.is_empty() && t.skipped.is_empty());
    assert_eq!(j.value.len(), 6);
    for (a, b) in j.value.iter().zip(&t.value) {
        assert_eq!(
            (a.priority, a.src, a.dst, a.fwmark, &a.table),
            (b.priority, b.src, b.dst, b.fwmark, &b.table)
        );
        // The JSON form is rendered back to `ip rule`'s text.
        assert_eq!(a.text, b.text);
    }
    let from_pod = j.value.iter().find(|r| r.priority == 2000).unwrap();
    assert_eq!(from_pod.src, Some("10.12.192.44/32".parse().unwrap()));
    assert_eq!(from_pod.table.as_deref(), Some("1003"));
    assert_eq!(j.value[2].fwmark, Some((0x80, 0x80)));
}

#[test]
fn ip_route_json_and_text_agree() {
    let j = parse_routes(&data("eni-node/ip-route.json"));
    let t = parse_routes(&data("eni-node/ip-route.txt"));
    assert!(j.skipped.is_empty(), "{:?}", j.skipped);
    assert!(t.skipped.is_empty(), "{:?}", t.skipped);
    assert_eq!(j.value.len(), t.value.len());
    for (a, b) in j.value.iter().zip(&t.value) {
        assert_eq!(
            (&a.table, &a.kind, a.dst, a.gateway, &a.dev, a.prefsrc, a.onlink),
            (&b.table, &b.kind, b.dst, b.gateway, &b.dev, b.prefsrc, b.onlink),
            "{} vs {}",
            a.text,
            b.text
        );
    }
    let eni = j.value.iter().find(|r| r.table == "1003").unwrap();
    assert_eq!(eni.dev.as_deref(), Some("eth1"));
    assert!(eni.onlink);
    assert!(j
        .value
        .iter()
        .any(|r| r.kind == "local" && r.table == "local" && r.dst.to_string() == "10.12.97.49/32"));
    assert!(j.value.iter().any(|r| r.dst.to_string() == "fd00::/64"));
}

#[test]
fn ip_link_and_addr_json_and_text_agree() {
    let j = parse_links(&data("eni-node/ip-link.json"));
    let t = parse_links(&data("eni-node/ip-link.txt"));
    assert!(
        j.skipped.is_empty() && t.skipped.is_empty(),
        "{:?} {:?}",
        j.skipped,
        t.skipped
    );
    assert_eq!(j.value, t.value);
    let vx = j.value.iter().find(|l| l.name == "flannel.1").unwrap();
    assert_eq!(vx.mtu, 1450);
    let info = vx.vxlan.as_ref().unwrap();
    assert_eq!(
        (info.id, info.dev.as_deref(), info.port),
        (Some(1), Some("eth0"), Some(8472))
    );
    let port = j.value.iter().find(|l| l.name == "vethab12").unwrap();
    assert_eq!(
        (port.kind.as_deref(), port.master.as_deref()),
        (Some("veth"), Some("cni0"))
    );
    assert_eq!(
        j.value
            .iter()
            .find(|l| l.name == "cni0")
            .unwrap()
            .kind
            .as_deref(),
        Some("bridge")
    );

    let ja = parse_addrs(&data("eni-node/ip-addr.json"));
    let ta = parse_addrs(&data("eni-node/ip-addr.txt"));
    assert!(
        ja.skipped.is_empty() && ta.skipped.is_empty(),
        "{:?} {:?}",
        ja.skipped,
        ta.skipped
    );
    let key = |v: &Vec<weir_netdiag::iproute::Address>| {
        v.iter()
            .map(|a| (a.ifname.clone(), a.addr, a.prefix_len, a.scope.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(key(&ja.value), key(&ta.value));
    assert!(
        ja.value
            .iter()
            .all(|a| !(a.ifname == "eth1" && a.addr.is_ipv4())),
        "the ENI has no IPv4 address"
    );
    assert!(ja
        .value
        .iter()
        .any(|a| a.ifname == "eth0" && a.addr.to_string() == "10.12.97.49" && a.prefix_len == 24));
}

#[test]
fn neighbours_and_sysctls() {
    let j = parse_neighbours(&data("eni-node/ip-neigh.json"));
    let t = parse_neighbours(&data("eni-node/ip-neigh.txt"));
    assert_eq!(j.value, t.value);
    assert_eq!(j.value[0].state, "FAILED");
    assert_eq!(j.value[1].state, "PERMANENT");

    let s = sysctl::parse(&data("eni-node/sysctl.txt"));
    assert!(s.skipped.is_empty(), "{:?}", s.skipped);
    let s = s.value;
    assert_eq!(s.effective_rp_filter("eth0"), Some(1));
    assert!(s.conf("ipv4", "flannel.1", "rp_filter").is_some());
    assert!(s.int("net.netfilter.nf_conntrack_max").is_some());
}

#[test]
fn a_collected_directory_reads_whole() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/eni-node");
    let (st, ignored) = NodeState::from_dir(&dir).unwrap();
    assert!(ignored.is_empty(), "{ignored:?}");
    // The directory holds both forms of some outputs; one of them wins, both parse.
    for o in [
        Output::IptablesSave,
        Output::NftRuleset,
        Output::IpRule,
        Output::IpRoute,
        Output::IpLink,
        Output::IpAddr,
        Output::IpNeigh,
        Output::Sysctl,
    ] {
        assert!(st.present.contains(&o), "{o:?} missing");
    }
    assert!(st.skipped.is_empty(), "{:?}", st.skipped);
    assert!(st.is_local_address("10.12.97.49".parse().unwrap()));
    let r = st.lookup("1003", "1.1.1.1".parse().unwrap()).unwrap();
    assert_eq!(r.dev.as_deref(), Some("eth1"));
}
