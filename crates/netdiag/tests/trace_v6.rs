//! IPv6: the parsers on each IPv6 form (tests/data/pasted-v6, captured in the namespaces of
//! trace_kernel6.rs), and walks from the two collected nodes (`v6-ip6tables-node`,
//! `v6-nft-node`): a pod's packet to an IPv6 ClusterIP DNATed by ip6tables and by nft, dropped
//! by an rpfilter rule of each kind, with no route, and with the IPv6 outputs missing.

mod common;

use std::fs;
use std::net::IpAddr;

use common::{data_dir, has_hop, walk};
use weir_netdiag::iproute;
use weir_netdiag::state::{NodeState, Output};
use weir_netdiag::trace::Verdict;
use weir_netdiag::{iptables, nft};

fn pasted(name: &str) -> String {
    fs::read_to_string(data_dir("pasted-v6").join(name)).unwrap()
}

fn node(name: &str) -> NodeState {
    let (st, ignored) = NodeState::from_dir(&data_dir(name)).unwrap();
    assert!(ignored.is_empty(), "{ignored:?}");
    st
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

// The parsers.

#[test]
fn ip6_route_text_and_json_read_the_same_routes() {
    let text = iproute::parse_routes6(&pasted("ip-6-route-show-table-all.txt"));
    let json = iproute::parse_routes6(
        &fs::read_to_string(data_dir("v6-nft-node").join("ip6-route.json")).unwrap(),
    );
    assert!(text.skipped.is_empty(), "{:?}", text.skipped);
    assert!(json.skipped.is_empty(), "{:?}", json.skipped);
    assert_eq!(text.value.len(), 15);
    assert_eq!(json.value.len(), text.value.len());
    for (t, j) in text.value.iter().zip(&json.value) {
        assert_eq!(
            (&t.table, &t.kind, t.dst, &t.dev),
            (&j.table, &j.kind, j.dst, &j.dev)
        );
    }
    let r = &text.value[0];
    assert_eq!(r.dst.to_string(), "fd00:50::/64");
    assert_eq!(r.dev.as_deref(), Some("eth0"));
    assert!(text
        .value
        .iter()
        .any(|r| r.kind == "local" && r.table == "local" && r.dst.to_string() == "fd00:50::1/128"));
    assert!(text
        .value
        .iter()
        .any(|r| r.kind == "anycast" && r.dst.to_string() == "fd00:50::/128"));
    assert!(text
        .value
        .iter()
        .any(|r| r.kind == "multicast" && r.dst.to_string() == "ff00::/8"));
}

#[test]
fn ip6_route_defaults_are_ipv6_with_or_without_a_gateway() {
    let p = iproute::parse_routes6(&pasted("ip-6-route-hand.txt"));
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    let r = &p.value;
    assert_eq!(r.len(), 5);
    assert_eq!(r[0].dst.to_string(), "::/0");
    assert_eq!(r[0].gateway, Some(ip("fe80::1")));
    assert_eq!(r[0].proto.as_deref(), Some("ra"));
    // No gateway: `ip route`'s parser alone would take `default` as 0.0.0.0/0.
    assert_eq!(r[1].dst.to_string(), "::/0");
    assert_eq!(r[1].table, "100");
    assert_eq!(r[2].gateway, Some(ip("fd00:50::2")));
    assert_eq!(
        (r[3].kind.as_str(), r[3].dst.to_string()),
        ("unreachable", "fd00:99::/64".into())
    );
    assert_eq!(r[4].kind, "blackhole");
}

#[test]
fn ip6_rule_text_and_json() {
    let text = iproute::parse_rules(&pasted("ip-6-rule.txt"));
    let json = iproute::parse_rules(
        &fs::read_to_string(data_dir("v6-nft-node").join("ip6-rule.json")).unwrap(),
    );
    assert!(text.skipped.is_empty() && json.skipped.is_empty());
    let both: Vec<_> = [&text.value, &json.value]
        .iter()
        .map(|rs| {
            rs.iter()
                .map(|r| (r.priority, r.table.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        both[0],
        vec![(0, Some("local".into())), (32766, Some("main".into()))]
    );
    assert_eq!(both[0], both[1]);

    let hand = iproute::parse_rules(&pasted("ip-6-rule-hand.txt"));
    assert!(hand.skipped.is_empty(), "{:?}", hand.skipped);
    assert_eq!(hand.value[1].src.unwrap().to_string(), "fd00:10::/64");
    assert_eq!(hand.value[1].table.as_deref(), Some("100"));
    assert_eq!(hand.value[2].fwmark, Some((0x4000, 0x4000)));
}

#[test]
fn ip_addr_text_and_json_keep_inet6_addresses() {
    let text = iproute::parse_addrs(&pasted("ip-addr.txt"));
    let json = iproute::parse_addrs(
        &fs::read_to_string(data_dir("v6-nft-node").join("ip-addr.json")).unwrap(),
    );
    for p in [&text, &json] {
        assert!(p.skipped.is_empty(), "{:?}", p.skipped);
        let a = p
            .value
            .iter()
            .find(|a| a.addr == ip("fd00:50::1"))
            .expect("eth0's global address");
        assert_eq!((a.ifname.as_str(), a.prefix_len), ("eth0", 64));
        assert_eq!(a.scope, "global");
        assert!(p
            .value
            .iter()
            .any(|a| a.ifname == "eth1" && a.scope == "link" && a.addr.is_ipv6()));
        assert!(p.value.iter().any(|a| a.addr == ip("::1")));
    }
}

#[test]
fn ip6tables_save_reads_dnat_to_a_bracketed_address_and_rpfilter() {
    let p = iptables::parse(&pasted("ip6tables-save.txt"));
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    let d = p.value;
    let sep = d.chain("nat", "KUBE-SEP-WEB").unwrap();
    assert_eq!(
        sep.rules[0].target_arg("--to-destination"),
        Some("[fd00:60::2]:8080")
    );
    let svc = d.chain("nat", "KUBE-SERVICES").unwrap();
    assert_eq!(
        svc.rules[0].arg("-d").unwrap().values,
        vec!["fd00:96::10/128"]
    );
    let raw = d.chain("raw", "PREROUTING").unwrap();
    assert_eq!(raw.rules[0].modules, vec!["rpfilter"]);
    assert!(raw.rules[0].module_arg("rpfilter", "--invert").is_some());
    assert_eq!(raw.rules[0].target_name(), Some("DROP"));
}

#[test]
fn nft_inet_table_reads_fib_and_dnat_ip6() {
    let p =
        nft::parse(&fs::read_to_string(data_dir("v6-nft-node").join("nft-ruleset.json")).unwrap());
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    let rs = p.value;
    let texts: Vec<&str> = rs
        .rules
        .iter()
        .filter(|r| r.family == "inet" && r.table == "weir")
        .map(|r| r.text.as_str())
        .collect();
    assert!(
        texts
            .iter()
            .any(|t| t.contains("fib saddr . iif oif missing") && t.ends_with("drop")),
        "{texts:?}"
    );
    assert!(texts.iter().any(|t| t.contains("dnat")), "{texts:?}");
    assert!(rs.set("inet", "weir", "svc6").is_some());
}

#[test]
fn a_v6_collection_reads_whole() {
    for name in ["v6-ip6tables-node", "v6-nft-node"] {
        let st = node(name);
        for o in [
            Output::Ip6tablesSave,
            Output::NftRuleset,
            Output::Ip6Rule,
            Output::Ip6Route,
            Output::IpAddr,
            Output::Sysctl,
        ] {
            assert!(st.present.contains(&o), "{name}: {o:?} missing");
        }
        assert!(st.skipped.is_empty(), "{name}: {:?}", st.skipped);
        assert!(st.is_local_address(ip("fd00:50::1")));
        let r = st.lookup("main", ip("fd00:60::2")).unwrap();
        assert_eq!(r.dev.as_deref(), Some("eth1"));
        assert_eq!(st.routes6.as_ref().unwrap().len(), 15);
        assert_eq!(st.routes_of(true).unwrap().len(), 15);
        assert_eq!(st.rules6.as_ref().unwrap().len(), 2);
    }
}

#[test]
fn the_output_files_of_ipv6() {
    assert_eq!(
        Output::for_file_name("ip6-route.json"),
        Some(Output::Ip6Route)
    );
    assert_eq!(
        Output::for_file_name("ip-6-route-show-table-all.txt"),
        Some(Output::Ip6Route)
    );
    assert_eq!(
        Output::for_file_name("ip-6-rule.txt"),
        Some(Output::Ip6Rule)
    );
    assert_eq!(
        Output::for_file_name("ip6-rule.json"),
        Some(Output::Ip6Rule)
    );
    assert_eq!(
        weir_netdiag::live::command_for(Output::Ip6Route),
        &["ip", "-6", "-j", "route", "show", "table", "all"]
    );
}

// The walks.

fn assert_ndisc_said(t: &weir_netdiag::trace::Trace) {
    assert!(
        t.assumptions
            .iter()
            .any(|a| a.contains("neighbour discovery is not modelled")),
        "{:?}",
        t.assumptions
    );
}

#[test]
fn v6_pod_to_cluster_ip_dnat_by_ip6tables_is_delivered() {
    let st = node("v6-ip6tables-node");
    let t = walk(&st, "fd00:50::2", "fd00:96::10", 80, "eth0");
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
    assert_eq!(t.endpoints, vec!["[fd00:60::2]:8080"]);
    assert!(has_hop(
        &t,
        "PREROUTING",
        "--to-destination [fd00:60::2]:8080",
        "DNAT to [fd00:60::2]:8080"
    ));
    assert!(t.hops.iter().any(|h| h.place.starts_with("ip6tables nat ")));
    assert!(has_hop(&t, "reverse path", "fd00:50::/64", "passes"));
    let e = t.egress.as_ref().unwrap();
    assert_eq!(
        (e.src, e.dst, e.dport),
        (ip("fd00:60::1"), ip("fd00:60::2"), 8080)
    );
    assert_eq!(e.oif.as_deref(), Some("eth1"));
    assert_ndisc_said(&t);
    assert!(t.assumptions.iter().any(|a| a.contains("no rp_filter")));
}

#[test]
fn v6_pod_to_cluster_ip_dnat_by_nft_is_delivered() {
    let st = node("v6-nft-node");
    let t = walk(&st, "fd00:50::2", "fd00:96::10", 80, "eth0");
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
    assert_eq!(t.endpoints, vec!["[fd00:60::2]:8080"]);
    assert!(has_hop(
        &t,
        "PREROUTING",
        "dnat",
        "DNAT to [fd00:60::2]:8080"
    ));
    assert!(has_hop(
        &t,
        "POSTROUTING",
        "masquerade",
        "fd00:50::2 → fd00:60::1"
    ));
    assert!(has_hop(&t, "reverse path", "", "oif is eth0"));
    let e = t.egress.as_ref().unwrap();
    assert_eq!((e.src, e.dst), (ip("fd00:60::1"), ip("fd00:60::2")));
    assert_ndisc_said(&t);
}

#[test]
fn v6_dropped_by_ip6tables_rpfilter() {
    let st = node("v6-ip6tables-node");
    // fd00:70::/64 has no route back on the node.
    let t = walk(&st, "fd00:70::2", "fd00:96::10", 80, "eth0");
    assert_eq!(t.verdict, Verdict::Dropped);
    let cause = t.cause.as_deref().unwrap();
    assert!(cause.contains("ip6tables raw PREROUTING"), "{cause}");
    assert!(cause.contains("-m rpfilter --invert -j DROP"), "{cause}");
    assert!(has_hop(
        &t,
        "reverse path",
        "",
        "route back to fd00:70::2 does not exist"
    ));
    assert!(t.egress.is_none());
}

#[test]
fn v6_dropped_by_nft_fib_rpfilter() {
    let st = node("v6-nft-node");
    let t = walk(&st, "fd00:70::2", "fd00:96::10", 80, "eth0");
    assert_eq!(t.verdict, Verdict::Dropped);
    let cause = t.cause.as_deref().unwrap();
    assert!(cause.contains("nft inet weir raw-prerouting"), "{cause}");
    assert!(cause.contains("fib saddr . iif oif missing"), "{cause}");
    // Arriving on the wrong interface: the route back exists but leaves by eth0, not eth1.
    let t = walk(&st, "fd00:50::2", "fd00:96::10", 80, "eth1");
    assert_eq!(t.verdict, Verdict::Dropped);
    assert!(has_hop(&t, "reverse path", "", "leaves by eth0, not eth1"));
}

#[test]
fn v6_no_route_is_dropped_as_v4_is() {
    let st = node("v6-nft-node");
    let t = walk(&st, "fd00:50::2", "fd00:99::1", 80, "eth0");
    assert_eq!(t.verdict, Verdict::Dropped);
    assert_eq!(t.cause.as_deref(), Some("routing: no route to fd00:99::1"));
}

/// The node's outputs without those of `leave_out`.
fn without(name: &str, leave_out: &[Output]) -> NodeState {
    let outputs = fs::read_dir(data_dir(name)).unwrap().filter_map(|e| {
        let e = e.unwrap();
        let o = Output::for_file_name(&e.file_name().to_string_lossy())?;
        (!leave_out.contains(&o)).then(|| (o, fs::read_to_string(e.path()).unwrap()))
    });
    NodeState::from_outputs(outputs)
}

#[test]
fn v6_without_ip6_route_uses_ip_route_show_table_all() {
    // A collection from before `ip -6 route` was saved: `ip route show table all` (no `-4`)
    // lists IPv6's routes too, and they are used.
    let st = without("v6-nft-node", &[Output::Ip6Route]);
    assert!(st.routes6.is_none());
    assert_eq!(st.routes_of(true).unwrap().len(), 15);
    let t = walk(&st, "fd00:50::2", "fd00:96::10", 80, "eth0");
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
}

#[test]
fn v6_without_any_ipv6_routes_is_unknown() {
    let st = without("v6-nft-node", &[Output::Ip6Route, Output::IpRoute]);
    let t = walk(&st, "fd00:50::2", "fd00:96::10", 80, "eth0");
    assert_eq!(t.verdict, Verdict::Unknown, "{:?}", t.cause);
    assert!(t
        .assumptions
        .iter()
        .any(|a| a.contains("no ip -6 route output")));
    assert!(
        t.cause
            .as_deref()
            .unwrap()
            .contains("ip -6 route show table all"),
        "{:?}",
        t.cause
    );
}

#[test]
fn v6_forwarding_off_drops() {
    let dir = data_dir("v6-ip6tables-node");
    let outputs = fs::read_dir(&dir).unwrap().filter_map(|e| {
        let e = e.unwrap();
        let o = Output::for_file_name(&e.file_name().to_string_lossy())?;
        let mut text = fs::read_to_string(e.path()).unwrap();
        if o == Output::Sysctl {
            text = text.replace(
                "net.ipv6.conf.all.forwarding = 1",
                "net.ipv6.conf.all.forwarding = 0",
            );
        }
        Some((o, text))
    });
    let st = NodeState::from_outputs(outputs);
    let t = walk(&st, "fd00:50::2", "fd00:96::10", 80, "eth0");
    assert_eq!(t.verdict, Verdict::Dropped);
    assert_eq!(
        t.cause.as_deref(),
        Some("net.ipv6.conf.all.forwarding = 0: the node does not forward")
    );
}

/// Found by the dual-stack lab's differential matrix (crates/weir/tests/lab_trace.rs, FORWARD
/// DROP rows): a packet dropped by ip6tables' FORWARD policy was told to fix it with
/// `iptables -A FORWARD …`, which changes nothing for IPv6.
#[test]
fn v6_forward_policy_drop_fixes_name_ip6tables() {
    let dir = data_dir("v6-ip6tables-node");
    let outputs = fs::read_dir(&dir).unwrap().filter_map(|e| {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        let o = Output::for_file_name(&name)?;
        let mut text = fs::read_to_string(e.path()).unwrap();
        if name == "ip6tables-save.txt" {
            text.push_str(
                "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n",
            );
        }
        Some((o, text))
    });
    let st = NodeState::from_outputs(outputs);
    let t = walk(&st, "fd00:50::2", "fd00:96::10", 80, "eth0");
    assert_eq!(t.verdict, Verdict::Dropped);
    let cause = t.cause.as_deref().unwrap();
    assert!(cause.contains("ip6tables filter FORWARD"), "{cause}");
    let commands: Vec<&String> = t
        .fixes
        .iter()
        .filter(|f| f.contains(" -A FORWARD"))
        .collect();
    assert_eq!(commands.len(), 2, "{:?}", t.fixes);
    for f in commands {
        assert!(f.contains("ip6tables -A FORWARD"), "{f}");
        assert!(!f.contains("iptables -A"), "{f}");
    }
}

#[test]
fn v6_json_carries_addresses_as_v4_does() {
    let st = node("v6-ip6tables-node");
    let t = walk(&st, "fd00:50::2", "fd00:96::10", 80, "eth0");
    let v = serde_json::to_value(&t).unwrap();
    assert_eq!(v["packet"]["src"], "fd00:50::2");
    assert_eq!(v["packet"]["dst"], "fd00:96::10");
    assert_eq!(v["egress"]["src"], "fd00:60::1");
    assert_eq!(v["egress"]["dst"], "fd00:60::2");
    assert_eq!(v["egress"]["dport"], 8080);
    assert_eq!(v["endpoints"][0], "[fd00:60::2]:8080");
    assert_eq!(v["verdict"], "delivered");
}

#[test]
fn ipv4_walks_do_not_meet_ipv6_rules() {
    // The same nodes' IPv4 side: ip6tables and nft's ip6 tables are not on its path.
    let st = node("v6-ip6tables-node");
    let t = walk(&st, "10.0.0.2", "10.96.0.10", 80, "eth0");
    assert!(
        t.hops.iter().all(|h| !h.place.contains("ip6tables")),
        "{:?}",
        t.hops
    );
}
