//! Facts a dump does not hold are not assumed: local addresses are learnt from the routes, and
//! where a verdict depends on a missing sysctl or route table, every value is walked and the
//! verdict is conditional, with what settles it.

mod common;

use std::path::Path;

use weir_netdiag::state::NodeState;
use weir_netdiag::trace::{Fact, Verdict};

use common::{data_dir as dir, has_hop, walk};

/// `tests/data/<name>` copied without `drop` (file names).
fn without(name: &str, drop: &[&str]) -> (tempfile::TempDir, NodeState) {
    let tmp = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(dir(name)).unwrap() {
        let e = e.unwrap();
        let n = e.file_name().to_string_lossy().into_owned();
        if !drop.contains(&n.as_str()) {
            std::fs::copy(e.path(), tmp.path().join(&n)).unwrap();
        }
    }
    let (st, _) = NodeState::from_dir(Path::new(tmp.path())).unwrap();
    (tmp, st)
}

/// The lab's eni-shared node with the fix off, as a ticket would paste it: no sysctls, no
/// `ip addr`. The walk used to take rp_filter as 0 and say "delivered", and to leave the
/// masqueraded source unchanged.
#[test]
fn eni_fix_off_without_sysctls_or_addresses_is_conditional_on_rp_filter() {
    let (_tmp, st) = without("lab-eni-a-fix-off", &["sysctl.txt", "ip-addr.json"]);
    assert!(st.addrs.is_none() && st.sysctls.is_none());
    let t = walk(
        &st,
        "10.12.192.18",
        "10.12.115.102",
        8443,
        "eni69381f0634bc",
    );
    // eth0's address from table local and its proto kernel route: masquerade's fallback.
    assert!(has_hop(
        &t,
        "POSTROUTING",
        "-j MASQUERADE",
        "10.12.192.18 → 10.12.97.11"
    ));
    assert_eq!(t.verdict, Verdict::Conditional);
    let strict = t
        .branches
        .iter()
        .find(|b| {
            b.verdict == Verdict::Dropped && b.when_text.contains("rp_filter on eth0 is 1 (strict)")
        })
        .unwrap_or_else(|| panic!("{:#?}", t.branches));
    assert!(strict
        .cause
        .as_deref()
        .unwrap()
        .starts_with("reply routing: strict reverse-path filter on eth0"));
    assert!(strict
        .fixes
        .iter()
        .any(|f| f.contains("give eth1 an IPv4 address")));
    assert!(strict.fixes.iter().any(|f| f.contains("rp_filter=2")));
    assert!(t.branches.iter().any(|b| b.verdict == Verdict::Delivered
        && b.when_text
            .contains("rp_filter on eth0 is 0 (off) or 2 (loose)")
        && b.when_text.contains("net.ipv4.ip_forward is 1")));
    assert!(t
        .branches
        .iter()
        .any(|b| b.verdict == Verdict::Dropped && b.when_text == "net.ipv4.ip_forward is 0"));
    let facts: Vec<&Fact> = t.unknowns.iter().map(|u| &u.fact).collect();
    assert!(facts.contains(&&Fact::RpFilter("eth0".into())), "{facts:?}");
    assert!(t
        .unknowns
        .iter()
        .any(|u| u.settle.contains("net.ipv4.conf.eth0.rp_filter")));
    // The pod's veth is asked about too, and does not matter: said, not listed as unknown.
    assert!(!facts.contains(&&Fact::RpFilter("eni69381f0634bc".into())));
    assert!(t
        .assumptions
        .iter()
        .any(|a| a.contains("without effect") && a.contains("eni69381f0634bc")));
    // The text and the JSON carry the branches; the old fields stay.
    let text = weir_netdiag::trace::render(&t);
    assert!(
        text.contains("DROPPED if rp_filter on eth0 is 1 (strict) and net.ipv4.ip_forward is 1: reply routing"),
        "{text}"
    );
    assert!(
        text.contains("unknown: rp_filter on eth0 (max of conf/all and conf/eth0): no sysctl output in the dump; settle it with `sysctl net.ipv4.conf.all.rp_filter net.ipv4.conf.eth0.rp_filter`"),
        "{text}"
    );
    let v = serde_json::to_value(&t).unwrap();
    assert_eq!(v["verdict"], "conditional");
    assert!(v["branches"].as_array().unwrap().len() >= 3);
    for k in [
        "hops",
        "cause",
        "fixes",
        "endpoints",
        "egress",
        "assumptions",
    ] {
        assert!(v.get(k).is_some(), "{k}");
    }
    assert_eq!(v["unknowns"][0]["fact"]["kind"], "rp_filter");
    assert_eq!(v["unknowns"][0]["fact"]["on"], "eth0");
    assert_eq!(v["unknowns"][1]["fact"]["kind"], "ip_forward");
}

/// With every file, nothing is unknown: the same walk is unconditional.
#[test]
fn with_the_sysctls_the_same_walk_is_not_conditional() {
    let (st, _) = NodeState::from_dir(&dir("lab-eni-a-fix-off")).unwrap();
    let t = walk(
        &st,
        "10.12.192.18",
        "10.12.115.102",
        8443,
        "eni69381f0634bc",
    );
    assert_eq!(t.verdict, Verdict::Dropped);
    assert!(t.branches.is_empty() && t.unknowns.is_empty());
}

/// A partial sysctl paste: conf.all.rp_filter = 1 leaves the effective value on eth0 (the max
/// of conf/all and conf/eth0) 1 or 2, so the verdict is still conditional, on those two; with
/// conf.all = 2 it is 2 whatever conf/eth0 says, and nothing is conditional.
#[test]
fn conf_all_bounds_the_effective_rp_filter_from_below() {
    let (tmp, _) = without("lab-eni-a-fix-off", &["sysctl.txt"]);
    let sysctl = |all: u8| {
        std::fs::write(
            tmp.path().join("sysctl.txt"),
            format!("net.ipv4.ip_forward = 1\nnet.ipv4.conf.all.rp_filter = {all}\n"),
        )
        .unwrap();
        let (st, _) = NodeState::from_dir(tmp.path()).unwrap();
        walk(
            &st,
            "10.12.192.18",
            "10.12.115.102",
            8443,
            "eni69381f0634bc",
        )
    };
    let t = sysctl(1);
    assert_eq!(t.verdict, Verdict::Conditional);
    let whens: Vec<(&Verdict, &str)> = t
        .branches
        .iter()
        .map(|b| (&b.verdict, b.when_text.as_str()))
        .collect();
    assert_eq!(
        whens,
        [
            (&Verdict::Dropped, "rp_filter on eth0 is 1 (strict)"),
            (&Verdict::Delivered, "rp_filter on eth0 is 2 (loose)")
        ]
    );
    let t = sysctl(2);
    assert_eq!(t.verdict, Verdict::Delivered);
    assert!(t.unknowns.is_empty(), "{:?}", t.unknowns);
}

/// The lab's bridge node without its sysctls: pod a1 → ClusterIP 10.96.0.2 whose endpoint a2
/// sits on the same bridge. The reply (a2 → a1, not masqueraded) is bridged; only
/// br_netfilter gets it to conntrack to be un-DNATed, so the verdict depends on it. With the
/// collected sysctls (bridge-nf-call-iptables = 1) it is delivered, as the kernel showed.
#[test]
fn same_bridge_service_reply_depends_on_br_netfilter() {
    const A1: &str = "10.244.1.2";
    const A1_VETH: &str = "weirf7a2b57a364";
    let (_tmp, st) = without("lab-bridge-iptables-a", &["sysctl.txt"]);
    let t = walk(&st, A1, "10.96.0.2", 80, A1_VETH);
    assert_eq!(t.verdict, Verdict::Conditional, "{:?}", t.cause);
    let off = t
        .branches
        .iter()
        .find(|b| b.when_text.contains("bridge-nf-call-iptables is 0"))
        .unwrap_or_else(|| panic!("{:#?}", t.branches));
    assert_eq!(off.verdict, Verdict::Dropped);
    assert!(off
        .cause
        .as_deref()
        .unwrap()
        .contains("without br_netfilter"));
    assert!(off.fixes[0].contains("modprobe br_netfilter"));
    assert!(t
        .branches
        .iter()
        .any(|b| b.verdict == Verdict::Delivered
            && b.when_text.contains("bridge-nf-call-iptables is 1")));
    assert!(t.unknowns.iter().any(|u| u.fact == Fact::BrNetfilter));

    let (st, _) = NodeState::from_dir(&dir("lab-bridge-iptables-a")).unwrap();
    let t = walk(&st, A1, "10.96.0.2", 80, A1_VETH);
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
    assert!(t
        .hops
        .iter()
        .any(|h| h.note.contains("br_netfilter hands it to conntrack")));
}

/// weir-cni's connmark fix, without the sysctls: outside → NodePort → a pod on the ENI. The
/// request is marked 0x80, so its reverse-path check depends on src_valid_mark as well as
/// rp_filter: strict without src_valid_mark drops it, anything else lets it in.
#[test]
fn connmark_fix_without_sysctls_depends_on_src_valid_mark() {
    let (_tmp, st) = without("lab-eni-a-fix-on", &["sysctl.txt"]);
    let t = walk(&st, "10.12.97.1", "10.12.97.11", 30080, "eth0");
    assert_eq!(t.verdict, Verdict::Conditional, "{:?}", t.cause);
    let dropped = t
        .branches
        .iter()
        .find(|b| {
            b.verdict == Verdict::Dropped
                && b.cause
                    .as_deref()
                    .unwrap_or("")
                    .starts_with("routing: strict reverse-path filter on eth0")
        })
        .unwrap_or_else(|| panic!("{:#?}", t.branches));
    assert!(
        dropped
            .when_text
            .contains("rp_filter on eth0 is 1 (strict)")
            && dropped.when_text.contains("src_valid_mark on eth0 is 0"),
        "{}",
        dropped.when_text
    );
    assert!(t
        .unknowns
        .iter()
        .any(|u| u.fact == Fact::SrcValidMark("eth0".into())));
    assert!(t
        .branches
        .iter()
        .any(|b| b.verdict == Verdict::Delivered
            && b.when_text.contains("src_valid_mark on eth0 is 1")));
}

/// A dump without `ip route` says nothing about where a packet goes: the walk's verdict is
/// unknown and names the output that settles it, where it used to be "dropped: routing: no
/// route" (12 of the 13 trace tickets in tests/data/tickets ended that way, for a file the
/// reporter never pasted).
#[test]
fn without_ip_route_the_verdict_is_unknown_and_names_ip_route_show_table_all() {
    let (_tmp, st) = without("lab-eni-a-fix-off", &["ip-route.json"]);
    assert!(st.routes.is_none());
    let t = walk(
        &st,
        "10.12.192.18",
        "10.12.115.102",
        8443,
        "eni69381f0634bc",
    );
    // The request is walked as forwarded (its DNATed destination, a pod, is not one of the
    // node's addresses by table local); its reverse-path check needs the routes: unknown.
    assert_eq!(t.verdict, Verdict::Unknown, "{:?}", t.cause);
    let cause = t.cause.as_deref().unwrap();
    assert!(cause.contains("cannot tell"), "{cause}");
    assert!(cause.contains("no `ip route` output"), "{cause}");
    assert!(cause.contains("`ip route show table all`"), "{cause}");
    assert!(!cause.contains("no route to"), "{cause}");
}

/// Only table local pasted (`ip route show table local`): table main is not in the dump, so a
/// destination with no route there is unknown too; with table main in the dump, a destination
/// it has no route for is still a definite "no route".
#[test]
fn routes_without_table_main_are_unknown_but_a_missing_route_in_main_is_a_drop() {
    use weir_netdiag::state::Output;
    use weir_netdiag::trace::{trace, Packet, Proto};
    let packet = Packet {
        src: "192.168.0.99".parse().unwrap(),
        dst: "172.16.5.5".parse().unwrap(),
        proto: Proto::Tcp,
        sport: 40000,
        dport: 80,
        iif: "eth0".into(),
    };
    let sysctl = (Output::Sysctl, "net.ipv4.ip_forward = 1\n".to_string());
    let local_only = NodeState::from_outputs([
        (
            Output::IpRoute,
            "ip route show table local\nlocal 192.168.0.1 dev eth0 proto kernel scope host src 192.168.0.1\n"
                .to_string(),
        ),
        sysctl.clone(),
    ]);
    let t = trace(&local_only, &packet);
    assert_eq!(t.verdict, Verdict::Unknown, "{:?}", t.cause);
    assert!(
        t.cause.as_deref().unwrap().contains("no table main"),
        "{:?}",
        t.cause
    );

    let with_main = NodeState::from_outputs([
        (
            Output::IpRoute,
            "192.168.0.0/24 dev eth0 proto kernel scope link src 192.168.0.1\n".to_string(),
        ),
        sysctl,
    ]);
    let t = trace(&with_main, &packet);
    assert_eq!(t.verdict, Verdict::Dropped, "{:?}", t.cause);
    assert_eq!(t.cause.as_deref(), Some("routing: no route to 172.16.5.5"));
}

/// Pasted `ip route get` answers stand in for the routes when the dump has none, for the very
/// lookup they made: an input lookup `from SRC iif IIF` answered gives the route (and passes
/// the reverse-path check: the kernel validated the source); one refused with `Invalid
/// cross-device link` (fib_validate_source's EXDEV) is the reverse-path filter dropping it. A
/// lookup no answer made stays unknown.
#[test]
fn ip_route_get_answers_are_route_evidence_without_routes() {
    use weir_netdiag::state::Output;
    use weir_netdiag::trace::{trace, Packet, Proto};
    let packet = |dst: &str, iif: &str| Packet {
        src: "203.0.113.10".parse().unwrap(),
        dst: dst.parse().unwrap(),
        proto: Proto::Tcp,
        sport: 40000,
        dport: 80,
        iif: iif.into(),
    };
    let gets = "$ ip route get 10.2.0.9 from 203.0.113.10 iif eth0
10.2.0.9 from 203.0.113.10 dev eth1
    cache iif eth0
$ ip route get 10.2.0.9 from 203.0.113.10 iif eth1
RTNETLINK answers: Invalid cross-device link
";
    let st = NodeState::from_outputs([
        (Output::IpRouteGet, gets.to_string()),
        (
            Output::Sysctl,
            "net.ipv4.ip_forward = 1\nnet.ipv4.conf.all.rp_filter = 1\n".to_string(),
        ),
    ]);
    assert!(st.skipped.is_empty(), "{:?}", st.skipped);
    let t = trace(&st, &packet("10.2.0.9", "eth0"));
    assert!(
        has_hop(
            &t,
            "routing",
            "10.2.0.9 from 203.0.113.10 dev eth1",
            "out eth1"
        ),
        "{:#?}",
        t.hops
    );
    assert!(
        has_hop(&t, "routing", "iif eth0", "passes"),
        "{:#?}",
        t.hops
    );
    assert!(t
        .assumptions
        .iter()
        .any(|a| a
            .contains("the pasted `ip route get 10.2.0.9 from 203.0.113.10 iif eth0`'s answer")));

    let t = trace(&st, &packet("10.2.0.9", "eth1"));
    assert_eq!(t.verdict, Verdict::Dropped, "{:?}", t.cause);
    let cause = t.cause.as_deref().unwrap();
    assert!(
        cause.contains("reverse-path filter (rp_filter) on eth1"),
        "{cause}"
    );
    assert!(cause.contains("Invalid cross-device link"), "{cause}");

    let t = trace(&st, &packet("10.2.0.10", "eth0"));
    assert_eq!(t.verdict, Verdict::Unknown, "{:?}", t.cause);
}

/// Without table local or `ip addr`, an IPVS virtual server's address is local (kube-ipvs0) and
/// its local route, as the kernel's own, has the address as `src`: the node's own connection to
/// it takes the VIP as its source (calico#3258's symptom; its pasted `ipvsadm -Sn`).
#[test]
fn a_connection_the_node_opens_to_an_ipvs_vip_takes_the_vip_as_source() {
    use weir_netdiag::trace::{trace, Packet, Proto};
    let (st, _) = NodeState::from_dir(&dir("tickets/calico-3258-ipvs-vip-as-source")).unwrap();
    let t = trace(
        &st,
        &Packet {
            src: "0.0.0.0".parse().unwrap(),
            dst: "10.254.0.1".parse().unwrap(),
            proto: Proto::Tcp,
            sport: 40000,
            dport: 443,
            iif: "local".into(),
        },
    );
    assert!(
        has_hop(
            &t,
            "output routing",
            "",
            "source address 10.254.0.1 (picked by the route)"
        ),
        "{:#?}",
        t.hops
    );
    assert!(
        has_hop(&t, "output reroute", "", "from 10.254.0.1 to 10.111.32.239"),
        "{:#?}",
        t.hops
    );
    // Still no routes to the real servers: unknown, not a drop.
    assert_eq!(t.verdict, Verdict::Unknown, "{:?}", t.cause);
}

/// A FORWARD chain with policy DROP whose only accepts could be in chains the paste does not
/// hold (a CNI's and kube-proxy's): neither "dropped" nor "delivered" is claimed; the verdict
/// is conditional on what those chains do, and names the output that settles it.
#[test]
fn a_jump_to_a_chain_not_in_the_paste_is_a_branch_not_an_assumption() {
    let tmp = tempfile::tempdir().unwrap();
    let files = [
        (
            "iptables-save.txt",
            "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [120:7200]\n:OUTPUT ACCEPT [0:0]\n\
             -A FORWARD -m comment --comment \"cali:wUHhoiAYhphO9Mso\" -j cali-FORWARD\n\
             -A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n\
             COMMIT\n",
        ),
        (
            "ip-route.txt",
            "default via 10.0.0.1 dev eth0\n10.0.0.0/24 dev eth0 proto kernel scope link src 10.0.0.4\n\
             10.244.1.0/24 dev cni0 proto kernel scope link src 10.244.1.1\n",
        ),
        (
            "sysctl.txt",
            "net.ipv4.ip_forward = 1\nnet.ipv4.conf.all.rp_filter = 0\nnet.ipv4.conf.eth0.rp_filter = 0\n\
             net.ipv4.conf.cni0.rp_filter = 0\nnet.ipv4.conf.all.src_valid_mark = 0\n\
             net.ipv4.conf.eth0.src_valid_mark = 0\n",
        ),
    ];
    for (name, text) in files {
        std::fs::write(tmp.path().join(name), text).unwrap();
    }
    let (st, _) = NodeState::from_dir(tmp.path()).unwrap();
    let t = walk(&st, "10.0.0.5", "10.244.1.7", 80, "eth0");
    assert_eq!(t.verdict, Verdict::Conditional, "{:?}", t.cause);
    let dropped = t
        .branches
        .iter()
        .find(|b| b.verdict == Verdict::Dropped)
        .unwrap_or_else(|| panic!("{:#?}", t.branches));
    assert!(
        dropped
            .when_text
            .contains("filter cali-FORWARD (not in the paste) returns it")
            && dropped
                .when_text
                .contains("filter KUBE-FORWARD (not in the paste) returns it"),
        "{}",
        dropped.when_text
    );
    assert!(
        dropped
            .cause
            .as_deref()
            .unwrap()
            .contains("FORWARD DROP (policy)"),
        "{:?}",
        dropped.cause
    );
    assert!(t
        .branches
        .iter()
        .any(|b| b.verdict == Verdict::Delivered && b.when_text.contains("accepts it")));
    let facts: Vec<&Fact> = t.unknowns.iter().map(|u| &u.fact).collect();
    assert!(
        facts.contains(&&Fact::Chain("filter cali-FORWARD".into())),
        "{facts:?}"
    );
    assert!(t
        .unknowns
        .iter()
        .any(|u| u.settle.contains("iptables-save -t filter")));
}

/// No routes pasted, the node's addresses known (`ip addr`), FORWARD policy DROP with nothing
/// accepting: a packet for a pod (not one of the node's addresses) must be forwarded, and
/// whatever the routes say it is dropped there — the paste settles it without them.
#[test]
fn forward_drop_settles_a_forwarded_packet_without_routes() {
    let tmp = tempfile::tempdir().unwrap();
    let files = [
        (
            "iptables-save.txt",
            "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [120:7200]\n:OUTPUT ACCEPT [0:0]\n\
             -A FORWARD -i docker0 -o docker0 -j ACCEPT\nCOMMIT\n",
        ),
        (
            "ip-addr.txt",
            "1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN group default qlen 1000\n\
             \x20   link/loopback 00:00:00:00:00:00 brd 00:00:00:00:00:00\n\
             \x20   inet 127.0.0.1/8 scope host lo\n\
             2: eth0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc mq state UP group default qlen 1000\n\
             \x20   link/ether 02:42:ac:11:00:02 brd ff:ff:ff:ff:ff:ff\n\
             \x20   inet 10.0.0.4/24 brd 10.0.0.255 scope global eth0\n",
        ),
        (
            "sysctl.txt",
            "net.ipv4.ip_forward = 1\nnet.ipv4.conf.all.rp_filter = 0\nnet.ipv4.conf.eth0.rp_filter = 0\n",
        ),
    ];
    for (name, text) in files {
        std::fs::write(tmp.path().join(name), text).unwrap();
    }
    let (st, _) = NodeState::from_dir(tmp.path()).unwrap();
    assert!(st.routes.is_none() && st.addresses_complete());
    let t = walk(&st, "10.0.0.5", "10.244.1.7", 80, "eth0");
    assert_eq!(
        t.verdict,
        Verdict::Dropped,
        "{:?} {:#?}",
        t.cause,
        t.branches
    );
    assert!(
        t.cause
            .as_deref()
            .unwrap()
            .contains("FORWARD DROP (policy)"),
        "{:?}",
        t.cause
    );
    // The paste's counters (`[120:7200]`, iptables-save -c) are cited as evidence.
    assert!(
        has_hop(
            &t,
            "FORWARD",
            ":FORWARD DROP (policy)",
            "120 packets dropped so far"
        ),
        "{:#?}",
        t.hops
    );
    assert!(t
        .assumptions
        .iter()
        .any(|a| a.contains("leaves by an interface the paste does not name")));
}

/// A grep cut of the node's iptables-save (`iptables-save | grep -A1 "KUBE-SVC-.*statistic"`,
/// real `--` separators) in place of the whole dump: the nat and filter chains it does not show
/// are not taken as empty. Where nat PREROUTING may DNAT the ClusterIP the verdict is unknown,
/// naming `iptables-save -t nat`; the whole dump walks the same packet to its endpoints.
#[test]
fn a_grep_cut_dump_branches_on_the_chains_it_does_not_show() {
    let tmp = tempfile::tempdir().unwrap();
    let node = common::data_dir("lab-eni-a-fix-off");
    for e in std::fs::read_dir(&node).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_owned();
        if name != "iptables-save.txt" && name != "nft-ruleset.json" {
            std::fs::copy(&p, tmp.path().join(name)).unwrap();
        }
    }
    std::fs::copy(
        common::data_dir("pasted/iptables-save-grep-A1.txt"),
        tmp.path().join("iptables-save.txt"),
    )
    .unwrap();
    let (cut, _) = NodeState::from_dir(tmp.path()).unwrap();
    assert!(cut.iptables.as_ref().unwrap().partial);
    let t = walk(&cut, "10.12.192.18", "10.96.0.1", 80, "eni69381f0634bc");
    assert_ne!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
    let unseen = t
        .branches
        .iter()
        .find(|b| {
            b.when_text
                .contains("iptables nat PREROUTING has a rule for it where the paste was cut")
        })
        .unwrap_or_else(|| panic!("{:#?}", t.branches));
    assert_eq!(unseen.verdict, Verdict::Unknown);
    assert!(unseen
        .cause
        .as_deref()
        .unwrap()
        .contains("iptables nat PREROUTING is not in the paste"));
    let nat = t
        .unknowns
        .iter()
        .find(|u| u.fact == Fact::Unseen("iptables nat PREROUTING".into()))
        .unwrap_or_else(|| panic!("{:#?}", t.unknowns));
    assert!(
        nat.settle.contains("iptables-save -t nat"),
        "{}",
        nat.settle
    );
    assert!(nat.why.contains("the paste was cut"), "{}", nat.why);

    // The whole dump: no such branch, the ClusterIP is DNATed.
    let (whole, _) = NodeState::from_dir(&node).unwrap();
    assert!(!whole.iptables.as_ref().unwrap().partial);
    let t = walk(&whole, "10.12.192.18", "10.96.0.1", 80, "eni69381f0634bc");
    assert!(t
        .unknowns
        .iter()
        .all(|u| !matches!(&u.fact, Fact::Chain(_) | Fact::Unseen(_))));
    assert!(!t.endpoints.is_empty(), "{:?}", t.cause);
}

/// kubernetes#97283's `nft list table ip filter` as pasted (text, cut inside FORWARD by the
/// stored copy), forwarded pod traffic: dropped by FORWARD's policy only if the seven chains it
/// jumps to, which the paste does not hold, return it and FORWARD's rules after the cut are not
/// for it; each of those is an unknown naming `nft list ruleset`.
#[test]
fn an_nft_text_paste_cut_inside_a_chain_branches_on_its_jumps_and_its_rest() {
    let text = std::fs::read_to_string(common::data_dir(
        "tickets/k8s-97283-rhel8-firewalld-nft/nft.txt",
    ))
    .unwrap();
    let st = NodeState::from_sources([
        ("nft.txt".to_string(), text),
        (
            "sysctl.txt".to_string(),
            "net.ipv4.ip_forward = 1\nnet.ipv4.conf.all.rp_filter = 0\nnet.ipv4.conf.cali0.rp_filter = 0\n"
                .to_string(),
        ),
    ]);
    assert_eq!(st.nft.as_ref().unwrap().cut, ["ip filter FORWARD"]);
    // `nft list table ip filter`: one table; the others are said to be unseen.
    assert!(
        st.assumptions
            .iter()
            .any(|a| a.contains("`nft list table ip filter` lists one table")),
        "{:?}",
        st.assumptions
    );
    let t = walk(&st, "10.254.219.69", "10.254.219.68", 80, "cali0");
    assert_eq!(t.verdict, Verdict::Conditional, "{:?}", t.cause);
    let dropped = t
        .branches
        .iter()
        .find(|b| b.verdict == Verdict::Dropped)
        .unwrap_or_else(|| panic!("{:#?}", t.branches));
    for part in [
        "nft ip filter cali-FORWARD (not in the paste) returns it",
        "nft ip filter FORWARD has no rule for it where the paste was cut",
    ] {
        assert!(dropped.when_text.contains(part), "{}", dropped.when_text);
    }
    assert!(dropped
        .cause
        .as_deref()
        .unwrap()
        .contains("chain FORWARD { policy drop; }"));
    assert!(t.branches.iter().any(|b| b.verdict == Verdict::Unknown
        && b.cause
            .as_deref()
            .is_some_and(|c| c.contains("the paste ends inside nft ip filter FORWARD"))));
    let facts: Vec<&Fact> = t.unknowns.iter().map(|u| &u.fact).collect();
    assert!(facts.contains(&&Fact::Chain("nft ip filter cali-FORWARD".into())));
    assert!(facts.contains(&&Fact::Unseen("nft ip filter FORWARD".into())));
    assert!(t
        .unknowns
        .iter()
        .all(|u| !matches!(u.fact, Fact::Chain(_) | Fact::Unseen(_))
            || u.settle.contains("nft list ruleset")));
}
