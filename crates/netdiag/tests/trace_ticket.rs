//! Issue 22's ticket: a pod on an addressless secondary ENI (eth1), policy-routed out of it,
//! dialing an IPVS LoadBalancer IP, with the outputs as they were pasted
//! (`tests/data/ticket-eni-ipvs-lb`: `ip link`, `ip route show table all`, `ip rule`,
//! iptables-save v1.4.21, `ipset list`, `ipvsadm -Ln | grep -A3`, the pod's `ip addr`; no node
//! `ip addr`, no sysctls). The ticket rules out "delivered": the connection times out.

mod common;

use std::path::Path;

use weir_netdiag::state::NodeState;
use weir_netdiag::trace::{self, Fact, Packet, Proto, Trace, Verdict};

use common::{data_dir as dir, has_hop};

/// The pod's SYN to the LoadBalancer IP, from the side the pod's `ip addr` names.
fn walk_pod(st: &NodeState) -> Trace {
    let pod = st.pod.as_ref().expect("pod-ip-addr.txt read");
    let t = trace::trace(
        st,
        &Packet {
            src: pod.addr.into(),
            dst: "10.12.115.101".parse().unwrap(),
            proto: Proto::Tcp,
            sport: 40000,
            dport: 443,
            iif: pod.host_iface.clone().expect("host veth found"),
        },
    );
    eprintln!("{}", trace::render(&t));
    t
}

fn ticket_with(sysctl: Option<&str>) -> (tempfile::TempDir, NodeState) {
    let tmp = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(dir("ticket-eni-ipvs-lb")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), tmp.path().join(e.file_name())).unwrap();
    }
    if let Some(s) = sysctl {
        std::fs::write(tmp.path().join("sysctl.txt"), s).unwrap();
    }
    let (st, _) = NodeState::from_dir(Path::new(tmp.path())).unwrap();
    (tmp, st)
}

#[test]
fn ticket_eni_ipvs_lb_reads_every_pasted_file() {
    let (st, ignored) = NodeState::from_dir(&dir("ticket-eni-ipvs-lb")).unwrap();
    assert_eq!(ignored, ["README.md"]);
    assert!(st.skipped.is_empty(), "{:?}", st.skipped);
    // The pod: its address, and its host veth through eth0@if5 and the node's link 5.
    let pod = st.pod.as_ref().unwrap();
    assert_eq!(pod.addr.to_string(), "10.12.192.44");
    assert_eq!(pod.host_iface.as_deref(), Some("eni3f9c1a2b4d5"));
    // No `ip addr`: eth0's address comes from its proto kernel route and table local, and
    // eth1 has none (table local lists every local address).
    assert!(st.addrs.is_none());
    let eth0: Vec<String> = st
        .ipv4_on("eth0")
        .iter()
        .map(|a| a.addr.to_string())
        .collect();
    assert_eq!(eth0, ["10.12.97.49"]);
    assert!(st.ipv4_on("eth1").is_empty());
    assert!(st
        .assumptions
        .iter()
        .any(|a| a.contains("no IPv4 address on eth1")));
}

#[test]
fn ticket_eni_ipvs_lb_pod_to_lb_ip_is_the_reply_dropped_by_strict_rp_filter_if_it_is_strict() {
    let (st, _) = NodeState::from_dir(&dir("ticket-eni-ipvs-lb")).unwrap();
    let t = walk_pod(&st);
    // The LB IP is local (kube-ipvs0), IPVS takes it and picks a real server; the list is
    // grep's cut of it.
    assert!(has_hop(
        &t,
        "PREROUTING",
        "--match-set KUBE-LOAD-BALANCER dst,dst -j KUBE-LOAD-BALANCER",
        "jump KUBE-LOAD-BALANCER"
    ));
    assert!(has_hop(
        &t,
        "IPVS LOCAL_IN",
        "TCP  10.12.115.101:443 rr",
        "real server 10.12.200.5:8443"
    ));
    assert!(t.assumptions.iter().any(|a| a.contains("grep cut")));
    // IPVS's own route is main's (eth0), but nf_nat routes the DNATed packet again with the
    // pod's source: rule 1536 sends it out of eth1.
    assert!(has_hop(
        &t,
        "IPVS routing",
        "32766: from all lookup main",
        "out eth0"
    ));
    assert!(has_hop(
        &t,
        "OUTPUT reroute",
        "1536: from 10.12.192.44 lookup 1003 → default via 10.12.192.1 dev eth1",
        "out eth1"
    ));
    // The SYN leaves eth1 masqueraded to eth0's address.
    assert!(has_hop(
        &t,
        "POSTROUTING",
        "-m mark --mark 0x4000/0x4000 -j MASQUERADE",
        "source 10.12.192.44 → 10.12.97.49"
    ));
    assert!(t.hops.iter().any(|h| h.stage == "send"
        && h.place == "eth1"
        && h.note.contains("out eth1 10.12.97.49 → 10.12.200.5:8443")));
    // The SYN-ACK comes back on eth0, and strict rp_filter there drops it.
    assert!(t
        .hops
        .iter()
        .any(|h| h.stage == "reply" && h.place == "eth0"));
    assert!(has_hop(
        &t,
        "reply routing",
        "1536: from 10.12.192.44 lookup 1003",
        "strict rp_filter drops it"
    ));
    // No sysctls: conditional, not "delivered".
    assert_eq!(t.verdict, Verdict::Conditional);
    let strict = t
        .branches
        .iter()
        .find(|b| b.when_text == "rp_filter on eth0 is 1 (strict)")
        .unwrap_or_else(|| panic!("{:#?}", t.branches));
    assert_eq!(strict.verdict, Verdict::Dropped);
    // Every real server is walked, and each one's reply fails the same way.
    let each = |rs: &str| {
        format!("{rs}:8443: DROPPED: reply routing: strict reverse-path filter on eth0 drops {rs} → 10.12.192.44 (the route back leaves by eth1)")
    };
    assert_eq!(
        strict.cause.as_deref(),
        Some(
            format!(
                "0 of 3 endpoints delivered; {}; {}; {}",
                each("10.12.200.5"),
                each("10.12.201.7"),
                each("10.12.202.9")
            )
            .as_str()
        )
    );
    assert_eq!(t.endpoint_outcomes.len(), 3);
    for e in &t.endpoint_outcomes {
        assert_eq!(e.verdict, Verdict::Conditional, "{}", e.endpoint);
        assert!(!e.delivered());
        assert!(e
            .branches
            .iter()
            .any(|b| b.verdict == Verdict::Dropped
                && b.when_text == "rp_filter on eth0 is 1 (strict)"));
    }
    // The three fixes: the ENI's own address, connmark + fwmark + src_valid_mark, loose.
    assert_eq!(strict.fixes.len(), 3, "{:?}", strict.fixes);
    assert!(strict.fixes[0].starts_with("give eth1 an IPv4 address of its own"));
    assert!(
        strict.fixes[1].contains("connmark")
            && strict.fixes[1].contains("fwmark")
            && strict.fixes[1].contains("before `1536: from 10.12.192.44 lookup 1003`")
            && strict.fixes[1].contains("src_valid_mark=1")
    );
    assert!(strict.fixes[2].contains("net.ipv4.conf.eth0.rp_filter=2"));
    assert!(t.branches.iter().any(|b| b.verdict == Verdict::Delivered
        && b.when_text
            .starts_with("rp_filter on eth0 is 0 (off) or 2 (loose)")));
    // The hops, cause and fixes shown are the strict branch's.
    assert_eq!(t.cause, strict.cause);
    let rp = t
        .unknowns
        .iter()
        .find(|u| u.fact == Fact::RpFilter("eth0".into()))
        .unwrap();
    assert!(rp.settle.contains("net.ipv4.conf.eth0.rp_filter"));
    let text = trace::render(&t);
    assert!(
        text.contains("DROPPED if rp_filter on eth0 is 1 (strict): 0 of 3 endpoints delivered; 10.12.200.5:8443: DROPPED: reply routing: strict reverse-path filter on eth0"),
        "{text}"
    );
}

/// The same dump with the node's sysctls: the verdict is no longer conditional.
#[test]
fn ticket_eni_ipvs_lb_settled_by_the_sysctls() {
    let (_tmp, st) = ticket_with(Some(
        "net.ipv4.ip_forward = 1\nnet.ipv4.conf.all.rp_filter = 1\nnet.ipv4.conf.eth0.rp_filter = 1\n",
    ));
    let t = walk_pod(&st);
    assert_eq!(t.verdict, Verdict::Dropped);
    assert!(t.unknowns.is_empty() && t.branches.is_empty());
    assert_eq!(t.fixes.len(), 3);

    let (_tmp, st) = ticket_with(Some(
        "net.ipv4.ip_forward = 1\nnet.ipv4.conf.all.rp_filter = 2\n",
    ));
    let t = walk_pod(&st);
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
    // Delivered as far as this node goes; the send hop still warns of the cloud's check.
    assert!(t
        .hops
        .iter()
        .any(|h| h.stage == "send" && h.note.contains("source/destination check")));
}

/// The ticket pasted with `ip route` instead of `ip route show table all`: table 1003 (where rule
/// 1536 sends the pod's traffic) and table local are not in the dump. The LB IP is still local
/// (an IPVS virtual server's), and what table 1003 holds is an unknown the verdict depends on,
/// not an empty table.
#[test]
fn ticket_eni_ipvs_lb_with_main_only_routes_does_not_guess_table_1003() {
    let (tmp, _) = ticket_with(None);
    std::fs::write(
        tmp.path().join("ip-route.txt"),
        "[root@ip-10-12-97-49 ~]# ip route\ndefault via 10.12.97.1 dev eth0 \n10.12.97.0/24 dev eth0 proto kernel scope link src 10.12.97.49 \n10.12.192.44 dev eni3f9c1a2b4d5 scope link \n169.254.169.254 dev eth0 scope link \n",
    )
    .unwrap();
    let (st, _) = NodeState::from_dir(tmp.path()).unwrap();
    let t = walk_pod(&st);
    assert!(has_hop(
        &t,
        "routing",
        "0: from all lookup local",
        "is local"
    ));
    assert_eq!(t.verdict, Verdict::Conditional);
    let unknown = t
        .branches
        .iter()
        .find(|b| b.verdict == Verdict::Unknown)
        .unwrap_or_else(|| panic!("{:#?}", t.branches));
    assert_eq!(unknown.when_text, "table 1003 holds routes");
    assert!(unknown
        .cause
        .as_deref()
        .unwrap()
        .contains("1536: from 10.12.192.44 lookup 1003"));
    assert!(t
        .unknowns
        .iter()
        .any(|u| u.fact == Fact::Table("1003".into())
            && u.settle.contains("ip route show table all")));
    // If table 1003 were empty, main would carry both ways through eth0.
    assert!(t
        .branches
        .iter()
        .any(|b| b.verdict == Verdict::Delivered && b.when_text.contains("table 1003 is empty")));
}

/// grep's cut of `ipvsadm -Ln` in the ticket: 10.12.115.102:80 is followed by another virtual
/// server inside its group, so it truly has no real servers (IPVS rejects); UDP 10.96.0.10:53
/// ends the file, so its real servers are unknown, not absent.
#[test]
fn ticket_eni_ipvs_lb_cut_virtual_servers_are_unknown_not_rejecting() {
    let (st, _) = NodeState::from_dir(&dir("ticket-eni-ipvs-lb")).unwrap();
    let pod = |dst: &str, dport: u16, proto: Proto| {
        let t = trace::trace(
            &st,
            &Packet {
                src: "10.12.192.44".parse().unwrap(),
                dst: dst.parse().unwrap(),
                proto,
                sport: 40000,
                dport,
                iif: "eni3f9c1a2b4d5".into(),
            },
        );
        eprintln!("{}", trace::render(&t));
        t
    };
    let t = pod("10.12.115.102", 80, Proto::Tcp);
    assert_eq!(t.verdict, Verdict::Rejected, "{:?}", t.cause);
    let t = pod("10.96.0.10", 53, Proto::Udp);
    assert_eq!(t.verdict, Verdict::Unknown, "{:?}", t.cause);
    assert!(t
        .cause
        .as_deref()
        .unwrap()
        .contains("its real servers are not in the dump (ipvsadm output cut with grep)"));
}
