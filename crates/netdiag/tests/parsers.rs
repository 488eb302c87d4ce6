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

// What people paste: grep cuts, old and new iptables-save, `ip -s`/`-d`, prompts, CRLF and
// cut-off last lines (tests/data/pasted/, README.md there says where each file comes from).

fn pasted(name: &str) -> String {
    data(&format!("pasted/{name}"))
}

#[test]
fn ipvsadm_grep_a_cut_keeps_real_servers_with_their_own_virtual_server() {
    let p = weir_netdiag::ipvs::parse(&pasted("ipvsadm-Ln-grep-A3.txt"));
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    let v = p.value;
    let keys: Vec<String> = v.iter().map(|s| s.text.clone()).collect();
    assert_eq!(
        keys,
        [
            "TCP  10.12.115.101:443 rr",
            "TCP  10.12.115.102:80 rr",
            "TCP  10.96.140.12:80 rr persistent 10800",
            "UDP  10.96.0.10:53 rr"
        ]
    );
    // The first list ends at a `--`: grep may have cut real servers (it did: 3 of 4).
    assert_eq!(v[0].real_servers.len(), 3);
    assert!(v[0].cut);
    // Followed by another virtual server in the same group: complete, and empty.
    assert!(v[1].real_servers.is_empty());
    assert!(!v[1].cut);
    assert_eq!(v[2].persistent, Some(10800));
    assert_eq!(v[2].real_servers.len(), 1);
    assert!(!v[2].cut);
    // The file's last group ends the cut too.
    assert!(v[3].real_servers.is_empty());
    assert!(v[3].cut);

    // grep for a real server: each group starts with a real server whose virtual server was
    // cut away. It must not be given to the virtual server of the group before.
    let p = weir_netdiag::ipvs::parse(&pasted("ipvsadm-Ln-grep-A1-real-server.txt"));
    assert_eq!(p.value.len(), 2);
    assert!(
        p.value.iter().all(|v| v.real_servers.is_empty() && v.cut),
        "{:?}",
        p.value
    );
    assert_eq!(p.skipped.len(), 2, "{:?}", p.skipped);
    assert!(p.skipped.iter().all(|s| s.reason.contains("grep cut away")));
}

#[test]
fn ipvsadm_cut_off_last_line_is_not_read_as_a_real_server() {
    let p = weir_netdiag::ipvs::parse(&pasted("ipvsadm-Ln-cut.txt"));
    assert_eq!(p.skipped.len(), 1, "{:?}", p.skipped);
    assert!(p.skipped[0].reason.contains("cut off"), "{:?}", p.skipped);
    let udp = p.value.last().unwrap();
    assert_eq!(udp.text, "UDP  10.96.0.10:53 rr");
    assert_eq!(udp.real_servers.len(), 1);
    assert!(udp.cut);
}

#[test]
fn iptables_save_1_4_1_6_and_1_8_with_and_without_counters() {
    // 1.4.21 `iptables-save -c` (CentOS 7): `[packets:bytes]` before every rule.
    let p = iptables::parse(&pasted("iptables-1.4.21-save-c.txt"));
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    let d = p.value;
    assert_eq!(d.version.as_deref(), Some("v1.4.21"));
    assert_eq!(d.backend, Some(Backend::Unknown));
    assert_eq!(d.rules().count(), 14);
    let sep = &d.chain("nat", "KUBE-SEP-6QRBCJZ3WLAYCLRH").unwrap().rules[1];
    assert_eq!(sep.target_arg("--to-destination"), Some("10.12.97.21:6443"));
    assert!(sep.text.starts_with("-A KUBE-SEP-6QRBCJZ3WLAYCLRH -p tcp"));
    assert_eq!(
        d.chain("filter", "FORWARD").unwrap().policy.as_deref(),
        Some("DROP")
    );

    // 1.6.1 (Ubuntu 18.04), legacy, no counters.
    let p = iptables::parse(&pasted("iptables-1.6.1-save.txt"));
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    assert_eq!(p.value.version.as_deref(), Some("v1.6.1"));
    assert_eq!(p.value.chain("filter", "FORWARD").unwrap().rules.len(), 6);
    assert_eq!(p.value.chain("nat", "POSTROUTING").unwrap().rules.len(), 1);

    // 1.8.0–1.8.2's nf_tables back end calls itself xtables-save (Debian 10).
    let p = iptables::parse(&pasted("xtables-save-1.8.2.txt"));
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    assert_eq!(p.value.backend, Some(Backend::Nft));
    assert_eq!(p.value.version.as_deref(), Some("v1.8.2"));

    // 1.8.9, both back ends, `-c` (captured here).
    for (file, backend, rules) in [
        ("iptables-nft-save-c.txt", Backend::Nft, 3),
        ("iptables-legacy-save-c.txt", Backend::Unknown, 1),
    ] {
        let p = iptables::parse(&pasted(file));
        assert!(p.skipped.is_empty(), "{file}: {:?}", p.skipped);
        assert_eq!(p.value.backend, Some(backend), "{file}");
        assert_eq!(p.value.rules().count(), rules, "{file}");
    }
}

#[test]
fn iptables_grep_separators_prompts_and_the_legacy_tables_warning() {
    let p = iptables::parse(&pasted("iptables-save-grep-A1.txt"));
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    for svc in [
        "KUBE-SVC-EFAVJPJYEOP7DL27",
        "KUBE-SVC-SHGWCLVQCYJ7H4SR",
        "KUBE-SVC-XFW3ZTDNSF72EH34",
    ] {
        assert_eq!(p.value.chain("nat", svc).unwrap().rules.len(), 2, "{svc}");
    }

    // `iptables-save 2>&1` on an nft node that also has legacy tables.
    let p = iptables::parse(&pasted("iptables-nft-save-2to1.txt"));
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    assert!(
        p.value
            .assumptions
            .iter()
            .any(|a| a.contains("iptables-legacy tables exist")),
        "{:?}",
        p.value.assumptions
    );
}

#[test]
fn iptables_cut_off_inside_a_table_keeps_no_half_rule() {
    let p = iptables::parse(&pasted("iptables-nft-save-c-cut.txt"));
    assert_eq!(p.skipped.len(), 1, "{:?}", p.skipped);
    assert!(p.skipped[0].text.ends_with("--dport 44"));
    assert!(p.skipped[0].reason.contains("cut off"));
    let d = p.value;
    assert_eq!(d.chain("nat", "KUBE-SERVICES").unwrap().rules.len(), 0);
    assert!(
        d.assumptions.iter().any(|a| a.contains("no COMMIT")),
        "{:?}",
        d.assumptions
    );
}

#[test]
fn ip_s_and_ip_d_outputs() {
    let p = parse_links(&pasted("ip-s-link.txt"));
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    let names: Vec<&str> = p.value.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "lo",
            "eth0p",
            "eth0",
            "eth1p",
            "eth1",
            "eni3f9c1a2b4d5",
            "kipvsp",
            "kube-ipvs0"
        ]
    );
    let d = parse_links(&pasted("ip-d-link.txt"));
    assert!(d.skipped.is_empty(), "{:?}", d.skipped);
    assert_eq!(
        d.value
            .iter()
            .find(|l| l.name == "eth1")
            .unwrap()
            .kind
            .as_deref(),
        Some("veth")
    );
    let a = parse_addrs(&pasted("ip-s-d-addr.txt"));
    assert!(a.skipped.is_empty(), "{:?}", a.skipped);
    let v4: Vec<(String, String)> = a
        .value
        .iter()
        .filter(|x| x.addr.is_ipv4())
        .map(|x| (x.ifname.clone(), format!("{}/{}", x.addr, x.prefix_len)))
        .collect();
    assert_eq!(
        v4,
        [
            ("lo".to_string(), "127.0.0.1/8".to_string()),
            ("eth0".into(), "10.12.97.49/24".into()),
            ("kube-ipvs0".into(), "10.12.115.101/32".into()),
            ("kube-ipvs0".into(), "10.96.0.1/32".into()),
        ]
    );
}

#[test]
fn ip_addr_cut_with_grep_reads_each_address_on_its_own_interface() {
    let want = [
        ("eth0".to_string(), "10.12.97.49".to_string()),
        ("kube-ipvs0".into(), "10.12.115.101".into()),
        ("kube-ipvs0".into(), "10.96.0.1".into()),
    ];
    // `ip addr | grep -B2 -A1 "inet 1[0-9]\."`: blocks with their interface lines.
    let a = parse_addrs(&pasted("ip-addr-grep.txt"));
    assert!(a.skipped.is_empty(), "{:?}", a.skipped);
    let got: Vec<(String, String)> = a
        .value
        .iter()
        .map(|x| (x.ifname.clone(), x.addr.to_string()))
        .collect();
    assert_eq!(got, want);
    // `ip addr | grep -A1 "inet "`: no interface lines at all; the label names the interface.
    let a = parse_addrs(&pasted("ip-addr-grep-inet.txt"));
    assert!(a.skipped.is_empty(), "{:?}", a.skipped);
    let got: Vec<(String, String)> = a
        .value
        .iter()
        .filter(|x| x.ifname != "lo")
        .map(|x| (x.ifname.clone(), x.addr.to_string()))
        .collect();
    assert_eq!(got, want);
    assert_eq!(a.value[0].scope, "host");
}

#[test]
fn ip_route_list_ip_rule_behind_a_prompt_in_crlf_and_a_cut_route() {
    let r = parse_routes(&pasted("ip-route-list.txt"));
    assert!(r.skipped.is_empty(), "{:?}", r.skipped);
    assert_eq!(r.value.len(), 3);
    assert!(r.value.iter().all(|x| x.table == "main"));

    // PuTTY → Notepad: CRLF, the prompt and command above, an empty prompt below.
    let p = parse_rules(&pasted("ip-rule-prompt-crlf.txt"));
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    let prios: Vec<u32> = p.value.iter().map(|r| r.priority).collect();
    assert_eq!(prios, [0, 512, 1536, 32766, 32767]);
    assert_eq!(p.value[2].table.as_deref(), Some("1003"));
    assert_eq!(p.value[2].src, Some("10.12.192.44/32".parse().unwrap()));

    let c = parse_routes(&pasted("ip-route-cut.txt"));
    assert_eq!(c.skipped.len(), 1, "{:?}", c.skipped);
    assert!(c.skipped[0].reason.contains("cut off"), "{:?}", c.skipped);
    assert!(c.value.iter().any(|x| x.kind == "local"));
}

#[test]
fn a_dump_cut_with_grep_says_so() {
    let st = NodeState::from_outputs([
        (Output::IpvsadmLn, pasted("ipvsadm-Ln-grep-A3.txt")),
        (Output::IpRoute, pasted("ip-route-cut.txt")),
    ]);
    assert!(
        st.assumptions
            .iter()
            .any(|a| a.starts_with("ipvsadm-Ln.txt: cut with grep")),
        "{:?}",
        st.assumptions
    );
    assert!(
        st.assumptions
            .iter()
            .any(|a| a.starts_with("ip-route.json: line") && a.contains("no line end")),
        "{:?}",
        st.assumptions
    );
}

#[test]
fn ipset_list_cut_by_grep_answers_unknown_for_members_it_does_not_show() {
    use std::net::IpAddr;
    use weir_netdiag::ipset::{self, Fields};
    let p = ipset::parse(&pasted("ipset-list-grep-A9.txt"));
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    let set = &p.value[0];
    assert_eq!(set.name, "KUBE-CLUSTER-IP");
    assert_eq!(set.members, ["10.96.0.10,udp:53", "10.96.0.1,tcp:443"]);
    assert!(set.cut);
    let f = |dst: &str, dport| Fields {
        src: "10.12.192.44".parse::<IpAddr>().unwrap(),
        dst: dst.parse().unwrap(),
        proto: "tcp",
        sport: 40000,
        dport,
    };
    assert_eq!(set.contains("dst,dst", &f("10.96.0.1", 443)), Some(true));
    // 10.96.140.12,tcp:80 is in the set, below the cut: not "absent".
    assert_eq!(set.contains("dst,dst", &f("10.96.140.12", 80)), None);
}

#[test]
fn the_command_above_a_paste_names_the_route_table_it_showed() {
    // `ip route show table local` prints no `table local`; the echoed command says it.
    for text in [
        "ip route show table local\nlocal 10.0.0.5 dev ens4 proto kernel scope host src 10.0.0.5 \nbroadcast 10.0.0.255 dev ens4 proto kernel scope link src 10.0.0.5 \n",
        "[root@node ~]# ip route show table 1003\ndefault via 10.12.192.1 dev eth1 onlink \n",
    ] {
        let r = parse_routes(text);
        assert!(r.skipped.is_empty(), "{:?}", r.skipped);
        assert!(r.value.iter().all(|x| x.table != "main"), "{:?}", r.value);
    }
    let st = NodeState::from_outputs([(
        Output::IpRoute,
        "ip route show table local\nlocal 10.0.0.5 dev ens4 proto kernel scope host src 10.0.0.5 \n".to_string(),
    )]);
    assert!(st.is_local_address("10.0.0.5".parse().unwrap()));
}

#[test]
fn ip_brief_addr() {
    let a = parse_addrs(&pasted("ip-br-addr.txt"));
    assert!(a.skipped.is_empty(), "{:?}", a.skipped);
    let v4: Vec<(String, String)> = a
        .value
        .iter()
        .filter(|x| x.addr.is_ipv4() && x.scope == "global")
        .map(|x| (x.ifname.clone(), format!("{}/{}", x.addr, x.prefix_len)))
        .collect();
    assert_eq!(v4[0], ("eth0".to_string(), "10.12.97.49/24".to_string()));
    assert_eq!(v4.len(), 6);
    assert!(v4[1..].iter().all(|(i, _)| i == "kube-ipvs0"));
    assert!(a
        .value
        .iter()
        .all(|x| x.ifname != "eth1" || !x.addr.is_ipv4()));
}

/// No line of a real output is taken for a shell prompt or a grep separator: every captured
/// fixture reads with no command and no cut.
#[test]
fn no_captured_output_line_is_taken_for_a_prompt() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let mut files = Vec::new();
    for d in [
        "eni-node",
        "ipvs-node",
        "ipvs-node/save",
        "lab-eni-a-fix-off",
        "lab-eni-a-fix-on",
        "lab-bridge-iptables-a",
        "lab-bridge-nftables-a",
        "lab-bridge-userspace-a",
        ".",
    ] {
        for e in std::fs::read_dir(root.join(d)).unwrap().flatten() {
            let p = e.path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if p.is_file() && !name.ends_with(".md") && !name.ends_with(".sh") {
                files.push(p);
            }
        }
    }
    assert!(files.len() > 60, "{}", files.len());
    for p in files {
        let text = std::fs::read_to_string(&p).unwrap();
        let pasted = weir_netdiag::paste::lines(&text);
        assert!(
            pasted.commands.is_empty() && !pasted.grep_cut,
            "{}: {:?}",
            p.display(),
            pasted.commands
        );
        assert_eq!(
            pasted.lines.len(),
            text.lines().count(),
            "{}: a line was dropped",
            p.display()
        );
    }
}

/// `iptables -L -n -v --line-numbers` (iptables 1.8.9 here, from the rules in
/// `pasted/iptables-listing-source.rules`): chains with policy lines, rule numbers, counters,
/// protocol numbers (`-n` prints `0`, `6`), in/out columns and the matches in iptables' own
/// words, read back into iptables-save options.
#[test]
fn iptables_listing_with_counters_interfaces_and_matches() {
    let p = iptables::parse(&pasted("iptables-L-n-v-line-numbers.txt"));
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    let d = p.value;
    assert!(d.listing && !d.ifaces_hidden);
    assert!(
        d.assumptions
            .iter()
            .any(|a| a.contains("`iptables -L` listing")),
        "{:?}",
        d.assumptions
    );
    assert!(!d.assumptions.iter().any(|a| a.contains("not read back")));
    let fwd = d.chain("filter", "FORWARD").unwrap();
    assert_eq!(fwd.policy.as_deref(), Some("DROP"));
    assert_eq!(fwd.rules.len(), 5);
    assert_eq!(fwd.rules[0].target_name(), Some("KUBE-FORWARD"));
    assert_eq!(fwd.rules[0].comment(), Some("kubernetes forwarding rules"));
    let ct = fwd.rules[1].module_arg("conntrack", "--ctstate").unwrap();
    assert_eq!(ct.values, ["NEW"]);
    let ifaces = &fwd.rules[2];
    assert_eq!(ifaces.arg("-i").unwrap().values, ["cni0"]);
    assert_eq!(ifaces.arg("-o").unwrap().values, ["eth0"]);
    let mp = &fwd.rules[3];
    let src = mp.arg("-s").unwrap();
    assert!(src.negated);
    assert_eq!(src.values, ["10.244.0.0/16"]);
    assert_eq!(mp.arg("-p").unwrap().values, ["6"]);
    assert_eq!(
        mp.module_arg("multiport", "--dports").unwrap().values,
        ["80,443"]
    );
    assert_eq!(fwd.rules[4].target_name(), Some("REJECT"));
    assert!(fwd.rules[4].args.is_empty(), "{:?}", fwd.rules[4].args);
    let kf = d.chain("filter", "KUBE-FORWARD").unwrap();
    assert_eq!(kf.policy, None);
    let marked = &kf.rules[1];
    assert_eq!(
        marked.module_arg("mark", "--mark").unwrap().values,
        ["0x4000/0x4000"]
    );
    assert!(marked.text.starts_with("2        0     0 ACCEPT"));
    let est = kf.rules[2].module_arg("conntrack", "--ctstate").unwrap();
    assert_eq!(est.values, ["RELATED,ESTABLISHED"]);
    let rej = &d.chain("filter", "KUBE-SERVICES").unwrap().rules[0];
    assert_eq!(rej.arg("-d").unwrap().values, ["10.96.0.99"]);
    assert_eq!(rej.module_arg("tcp", "--dport").unwrap().values, ["80"]);
}

/// `iptables -t nat -L -n`: the table from the command line above it; DNAT's `to:`, MARK's `or`
/// and `xor`, `mark match !`, ADDRTYPE and statistic read back.
#[test]
fn iptables_nat_listing_reads_dnat_marks_and_statistic() {
    let p = iptables::parse(&pasted("iptables-t-nat-L-n.txt"));
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    let d = p.value;
    assert!(d.listing && d.ifaces_hidden);
    assert!(d.tables.contains_key("nat") && !d.tables.contains_key("filter"));
    assert!(
        !d.assumptions.iter().any(|a| a.contains("not read back")),
        "{:?}",
        d.assumptions
    );
    let sep = d.chain("nat", "KUBE-SEP-A").unwrap();
    assert_eq!(sep.rules[0].arg("-s").unwrap().values, ["10.244.1.5"]);
    assert_eq!(
        sep.rules[1].target_arg("--to-destination"),
        Some("10.244.1.5:80")
    );
    let svc = d.chain("nat", "KUBE-SVC-WEB").unwrap();
    assert_eq!(
        svc.rules[1]
            .module_arg("statistic", "--probability")
            .unwrap()
            .values,
        ["0.50000000000"]
    );
    let post = d.chain("nat", "KUBE-POSTROUTING").unwrap();
    let ret = post.rules[0].module_arg("mark", "--mark").unwrap();
    assert!(ret.negated);
    assert_eq!(post.rules[1].target_arg("--xor-mark"), Some("0x4000"));
    assert_eq!(post.rules[2].target_name(), Some("MASQUERADE"));
    let masq = d.chain("nat", "KUBE-MARK-MASQ").unwrap();
    assert_eq!(masq.rules[0].target_arg("--or-mark"), Some("0x4000"));
    let svcs = d.chain("nat", "KUBE-SERVICES").unwrap();
    assert_eq!(
        svcs.rules[1]
            .module_arg("addrtype", "--dst-type")
            .unwrap()
            .values,
        ["LOCAL"]
    );
}

/// `iptables -L FORWARD` (no -n, no -v): names instead of addresses and ports, and no
/// interface columns, which the dump says; a port name is kept as printed (the walk cannot
/// match it: the rule counts as not matching).
#[test]
fn iptables_listing_without_n_or_v_says_what_it_cannot_show() {
    let p = iptables::parse(&pasted("iptables-L-FORWARD.txt"));
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    let d = p.value;
    assert!(d.ifaces_hidden);
    assert!(
        d.assumptions.iter().any(|a| a.contains("without -v")),
        "{:?}",
        d.assumptions
    );
    let fwd = d.chain("filter", "FORWARD").unwrap();
    assert_eq!(fwd.policy.as_deref(), Some("DROP"));
    assert_eq!(fwd.rules.len(), 5);
    // `anywhere` is no address match; the interface-limited accept looks unconditional.
    assert!(fwd.rules[2].args.is_empty());
    assert_eq!(
        fwd.rules[3]
            .module_arg("multiport", "--dports")
            .unwrap()
            .values,
        ["http,https"]
    );
}

/// A listing line in a form not read back is kept, with an option the walk does not model, so
/// the rule never matches more than it does.
#[test]
fn iptables_listing_keeps_unread_matches_as_not_matching() {
    let text = "Chain INPUT (policy ACCEPT)
target     prot opt source               destination
ACCEPT     icmp --  0.0.0.0/0            0.0.0.0/0            limit: avg 1/sec burst 5
ACCEPT     all  --  0.0.0.0/0            0.0.0.0/0
";
    let p = iptables::parse(text);
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    let input = p.value.chain("filter", "INPUT").unwrap().clone();
    let unread = input.rules[0].module_arg("listing", "--unread").unwrap();
    assert_eq!(unread.values, ["limit: avg 1/sec burst 5"]);
    assert!(input.rules[1].args.is_empty());
    assert!(p
        .value
        .assumptions
        .iter()
        .any(|a| a.contains("1 listed rule(s)")));
}

/// `conntrack -L` captured here (conntrack-tools 1.4.7) after kubernetes#48370's sequence in a
/// scratch namespace: a UDP socket sent to 10.96.0.10:53 before the DNAT rule existed, a second
/// socket after, then the first again (its entry, still alive, keeps bypassing the DNAT). The
/// tool's summary line (stderr, first here) is not an entry.
#[test]
fn conntrack_list_entries_and_their_nat_bindings() {
    let p = weir_netdiag::conntrack::parse(&pasted("conntrack-L.txt"));
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    let e = p.value;
    assert_eq!(e.len(), 2);
    assert_eq!(e[0].proto, "udp");
    assert!(e[0].unreplied && !e[0].assured && e[0].state.is_none());
    assert_eq!(e[0].orig.sport, Some(40002));
    assert_eq!(e[0].dnat(), Some(("10.1.0.7".parse().unwrap(), Some(53))));
    assert_eq!(e[1].orig.sport, Some(40001));
    assert_eq!(e[1].dnat(), None);
    assert_eq!(e[1].snat(), None);
    assert_eq!(e[1].summary(), "udp 10.1.0.1:40001 → 10.96.0.10:53");

    // /proc/net/nf_conntrack's form (a ticket's paste: cilium#12098), TCP state and mark.
    let p = weir_netdiag::conntrack::parse("ipv4     2 tcp      6 59 SYN_RECV src=192.168.34.149 dst=192.168.21.197 sport=47458 dport=31313 src=192.168.126.96 dst=192.168.21.197 sport=80 dport=47458 mark=128 zone=0 use=2\n");
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    let e = &p.value[0];
    assert_eq!(e.state.as_deref(), Some("SYN_RECV"));
    assert_eq!(e.mark, Some(128));
    assert_eq!(
        e.dnat(),
        Some(("192.168.126.96".parse().unwrap(), Some(80)))
    );
    assert_eq!(e.snat(), Some("192.168.21.197".parse().unwrap()));
}

/// `ip route get` answers captured here (iproute2 6.1, kernel 6.18) under their prompt lines:
/// an output lookup, an input lookup (`from … iif eth0`), one refused by strict rp_filter on
/// eth1 (this kernel says `Invalid argument`; 4.x kernels said `Invalid cross-device link`),
/// and a local address. The `cache` lines are not answers.
#[test]
fn ip_route_get_answers_with_their_commands() {
    let p = weir_netdiag::route_get::parse(&pasted("ip-route-get.txt"));
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    let g = p.value;
    assert_eq!(g.len(), 4);
    let out = g[0].answer.as_ref().unwrap();
    assert_eq!(g[0].dst.to_string(), "10.1.0.7");
    assert!(g[0].iif.is_none() && g[0].from.is_none());
    assert_eq!(out.dev.as_deref(), Some("eth0"));
    assert_eq!(out.src.map(|a| a.to_string()).as_deref(), Some("10.1.0.1"));
    assert_eq!(out.kind, "unicast");
    assert_eq!(g[1].iif.as_deref(), Some("eth0"));
    assert_eq!(
        g[1].from.map(|a| a.to_string()).as_deref(),
        Some("203.0.113.10")
    );
    assert_eq!(g[1].answer.as_ref().unwrap().dev.as_deref(), Some("eth1"));
    assert_eq!(g[2].iif.as_deref(), Some("eth1"));
    assert_eq!(g[2].answer.as_ref().unwrap_err(), "Invalid argument");
    assert_eq!(
        g[2].command.as_deref(),
        Some("ip route get 10.2.0.9 from 203.0.113.10 iif eth1")
    );
    assert_eq!(g[3].answer.as_ref().unwrap().kind, "local");

    // An error with no command above it cannot say which lookup failed.
    let p = weir_netdiag::route_get::parse("RTNETLINK answers: Network is unreachable\n");
    assert!(p.value.is_empty());
    assert_eq!(p.skipped.len(), 1);
}

/// `tcpdump -n` and `-n -v` of ICMP echo over IPv4 and IPv6 on lo, as a terminal shows them
/// (captured here: `tests/data/pasted/README.md`): every packet line read, `-v`'s two lines as
/// one, the capture's interface from its `listening on` line.
#[test]
fn tcpdump_icmp_v4_v6_and_verbose_lines() {
    use weir_netdiag::tcpdump::{self, SeenKind};
    let text = data("pasted/tcpdump-lo-icmp-v.txt");
    let st = NodeState::from_sources([("tcpdump-lo-icmp-v.txt".to_string(), text)]);
    assert!(st.skipped.is_empty(), "{:?}", st.skipped);
    let caps = st.captures.as_ref().unwrap();
    assert_eq!(caps.len(), 2);
    assert_eq!(caps[0].iface.as_deref(), Some("lo"));
    let kinds: Vec<&SeenKind> = caps[0].packets.iter().map(|s| &s.kind).collect();
    assert_eq!(
        kinds,
        [
            &SeenKind::EchoRequest,
            &SeenKind::EchoReply,
            &SeenKind::EchoRequest,
            &SeenKind::EchoReply,
            &SeenKind::EchoRequest
        ]
    );
    assert!(caps[0].packets[2].src.is_ipv6());
    // `-v`: the header line and the addresses below it, one packet each.
    assert_eq!(caps[1].packets.len(), 2);
    assert_eq!(caps[1].packets[1].kind, SeenKind::EchoReply);
    assert!(caps[1].packets[0].text.contains("(tos 0x0"));
    // `tcpdump -i any`: each line's own interface and direction.
    let any = tcpdump::parse(&data("tcpdump-answered/tcpdump.txt"));
    assert!(any.skipped.is_empty(), "{:?}", any.skipped);
    assert_eq!(any.value.iface, None);
    let s = &any.value.packets[2];
    assert_eq!(
        (s.iface.as_deref(), s.direction.as_deref(), &s.kind),
        (Some("eth1"), Some("In"), &SeenKind::Tcp("S.".into()))
    );
    assert_eq!((s.sport, s.dport), (Some(8080), Some(s.dport.unwrap())));
}

/// `nft list ruleset` text as pasted: kubernetes#97283's `nft list table ip filter` (its prompt,
/// iptables-nft's translated rules, counters, cut by the stored copy) and `nft -a` with handles.
#[test]
fn nft_text_pastes() {
    let p = weir_netdiag::nft_text::parse(&data("tickets/k8s-97283-rhel8-firewalld-nft/nft.txt"));
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    let rs = p.value;
    let fwd = rs.chains.iter().find(|c| c.name == "FORWARD").unwrap();
    let hook = fwd.hook.as_ref().unwrap();
    assert_eq!(
        (hook.hook.as_str(), hook.priority, hook.policy.as_str()),
        ("forward", 0, "drop")
    );
    let jumps = rs
        .rules
        .iter()
        .filter(|r| r.chain == "FORWARD" && r.text.contains("jump"))
        .count();
    assert_eq!(jumps, 7);
    assert_eq!(rs.rules[0].counters(), Some((65069, 11110763)));
    let p = weir_netdiag::nft_text::parse(&data("pasted/nft-a-list-ruleset-counters.txt"));
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    let handles: Vec<Option<u64>> = p.value.rules.iter().map(|r| r.handle).collect();
    assert_eq!(handles, [Some(3), Some(4), Some(5), Some(6), Some(7)]);
}

/// What is a partial dump (its unseen chains are branches in trace): a grep cut, `-A` lines with
/// no `*table` header and no `-P` lines; not `iptables -S` (its `-P` lines), not a whole save.
#[test]
fn partial_dumps_are_told_from_whole_ones() {
    let partial = |name: &str| iptables::parse(&data(name)).value.partial;
    assert!(partial("iptables-grep-cut.txt"));
    assert!(partial("pasted/iptables-save-grep-A1.txt"));
    assert!(!partial("iptables-S-filter.txt"));
    assert!(!partial("eni-node/iptables-save.txt"));
    assert!(!partial("pasted/iptables-legacy-save-c-drops.txt"));
}
