//! `weir trace` over IPVS and ipsets, on a node collected in the qemu VM running `weir proxy
//! --proxy-mode ipvs` (tests/data/ipvs-node, captured by its capture.sh): the `ipvsadm` and
//! `ipset` parsers in both their list and save forms, `-m set --match-set` matches, the
//! virtual server lookup at LOCAL_IN and LOCAL_OUT, the real servers as "one of", masquerade,
//! rejection without endpoints, and the node's own connections (the OUTPUT path).

mod common;

use std::path::PathBuf;

use weir_netdiag::ipset;
use weir_netdiag::ipvs::{self, VirtualKey};
use weir_netdiag::state::NodeState;
use weir_netdiag::trace::{Verdict, LOCAL};

use common::{data_dir, has_hop, walk};

fn data(path: &str) -> PathBuf {
    data_dir("ipvs-node").join(path)
}

fn node() -> NodeState {
    NodeState::from_dir(&data("")).unwrap().0
}

/// The same node with `ipvsadm -Sn` and `ipset save` instead of the list forms.
fn node_from_saves() -> NodeState {
    let mut st = node();
    st.ipvs = Some(std::fs::read_to_string(data("save/ipvsadm-Sn.txt")).unwrap());
    st.ipset = Some(std::fs::read_to_string(data("save/ipset-save.txt")).unwrap());
    st
}

#[test]
fn ipvsadm_list_and_save_forms_read_the_same_virtual_servers() {
    let ln = ipvs::parse(&std::fs::read_to_string(data("ipvsadm-Ln.txt")).unwrap());
    let sn = ipvs::parse(&std::fs::read_to_string(data("save/ipvsadm-Sn.txt")).unwrap());
    assert!(ln.skipped.is_empty(), "{:?}", ln.skipped);
    assert!(sn.skipped.is_empty(), "{:?}", sn.skipped);
    assert_eq!(ln.value.len(), 11);
    let key = |v: &ipvs::VirtualServer| v.key.clone();
    let mut a = ln.value.clone();
    let mut b = sn.value.clone();
    a.sort_by_key(key);
    b.sort_by_key(key);
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.key, y.key);
        assert_eq!(x.scheduler, y.scheduler);
        assert_eq!(x.persistent, y.persistent);
        assert_eq!(x.real_servers, y.real_servers, "{:?}", x.key);
    }
    let aff = a
        .iter()
        .find(|v| v.key == VirtualKey::Addr("tcp".into(), "10.96.0.13:80".parse().unwrap()))
        .unwrap();
    assert_eq!(aff.persistent, Some(600));
    let empty = a
        .iter()
        .find(|v| v.key == VirtualKey::Addr("tcp".into(), "10.96.0.12:80".parse().unwrap()))
        .unwrap();
    assert!(empty.real_servers.is_empty());
}

#[test]
fn ipset_list_and_save_forms_read_the_same_members() {
    let list = ipset::parse(&std::fs::read_to_string(data("ipset-list.txt")).unwrap());
    let save = ipset::parse(&std::fs::read_to_string(data("save/ipset-save.txt")).unwrap());
    assert!(list.skipped.is_empty(), "{:?}", list.skipped);
    assert!(save.skipped.is_empty(), "{:?}", save.skipped);
    let sorted = |v: &[ipset::IpSet]| {
        let mut v: Vec<(String, String, Vec<String>)> = v
            .iter()
            .map(|s| {
                let mut m = s.members.clone();
                m.sort();
                (s.name.clone(), s.kind.clone(), m)
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(sorted(&list.value), sorted(&save.value));
    let cluster = list
        .value
        .iter()
        .find(|s| s.name == "KUBE-CLUSTER-IP")
        .unwrap();
    let f = |dst: &str, dport| ipset::Fields {
        src: "10.0.0.2".parse().unwrap(),
        dst: dst.parse().unwrap(),
        proto: "tcp",
        sport: 40000,
        dport,
    };
    assert_eq!(
        cluster.contains("dst,dst", &f("10.96.0.10", 80)),
        Some(true)
    );
    assert_eq!(
        cluster.contains("dst,dst", &f("10.96.0.10", 81)),
        Some(false)
    );
    assert_eq!(
        cluster.contains("dst,dst", &f("10.96.0.99", 80)),
        Some(false)
    );
}

/// Client → ClusterIP: KUBE-SERVICES marks it by set membership, the address is local (on
/// kube-ipvs0), KUBE-IPVS-FILTER lets it through, IPVS picks one of the two real servers
/// round robin, KUBE-POSTROUTING masquerades it out of the pod's veth, and the reply returns.
#[test]
fn client_to_cluster_ip_through_ipvs() {
    for st in [node(), node_from_saves()] {
        let t = walk(&st, "10.0.0.2", "10.96.0.10", 80, "eth0");
        assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
        assert!(has_hop(
            &t,
            "PREROUTING",
            "--match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ",
            "jump KUBE-MARK-MASQ"
        ));
        assert!(has_hop(&t, "routing", "kube-ipvs0", "10.96.0.10 is local"));
        assert!(
            !t.hops.iter().any(|h| h.note == "dropped"),
            "KUBE-IPVS-FILTER must let a ClusterIP through"
        );
        assert!(
            has_hop(
                &t,
                "IPVS LOCAL_IN",
                "TCP  10.96.0.10:80 rr",
                "real server 10.244.1.11:8080"
            ) || has_hop(
                &t,
                "IPVS LOCAL_IN",
                "-A -t 10.96.0.10:80 -s rr",
                "real server 10.244.1.11:8080"
            )
        );
        assert!(t.choices.iter().any(
            |c| c.starts_with("one of 10.244.1.11:8080, 10.244.2.12:8080 (IPVS scheduler rr)")
        ));
        assert!(has_hop(
            &t,
            "POSTROUTING",
            "-j MASQUERADE --random-fully",
            "source 10.0.0.2 → 10.244.1.1"
        ));
        assert!(has_hop(&t, "reply send", "", "out eth0 to 10.0.0.2"));
    }
}

#[test]
fn a_service_without_endpoints_is_rejected_by_ipvs() {
    for st in [node(), node_from_saves()] {
        let t = walk(&st, "10.0.0.2", "10.96.0.12", 80, "eth0");
        // ICMP port unreachable (ip_vs_leave): refused at once, as iptables' and nft's
        // rejects for a Service without endpoints are (it used to be called a drop).
        assert_eq!(t.verdict, Verdict::Rejected);
        assert!(t.cause.as_deref().unwrap().contains("has no real servers"));
    }
}

#[test]
fn affinity_shows_as_persistence_and_node_ports_walk_through_the_bitmap_set() {
    let st = node();
    let t = walk(&st, "10.0.0.2", "10.96.0.13", 80, "eth0");
    assert_eq!(t.verdict, Verdict::Delivered);
    assert!(t
        .choices
        .iter()
        .any(|c| c.contains("persistent 600s (ClientIP affinity)")));
    // NodePort: KUBE-NODE-PORT-TCP (bitmap:port, `dst`) marks for masquerade.
    let t = walk(&st, "10.0.0.2", "10.0.0.1", 30080, "eth0");
    assert_eq!(t.verdict, Verdict::Delivered);
    assert!(has_hop(
        &t,
        "PREROUTING",
        "--match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ",
        "jump KUBE-MARK-MASQ"
    ));
    // externalTrafficPolicy Local: only the local endpoint, the client's address kept.
    let t = walk(&st, "10.0.0.2", "10.0.0.1", 30081, "eth0");
    assert_eq!(t.verdict, Verdict::Delivered);
    assert!(t
        .choices
        .iter()
        .any(|c| c.starts_with("one of 10.244.1.11:8080 (IPVS")));
    assert!(!t.hops.iter().any(|h| h.note.contains("MASQUERADE")));
    // A port nobody serves on a ClusterIP: KUBE-IPVS-FILTER rejects it.
    let t = walk(&st, "10.0.0.2", "10.96.0.10", 81, "eth0");
    assert_eq!(t.verdict, Verdict::Rejected);
    assert!(t
        .cause
        .as_deref()
        .unwrap()
        .contains("--match-set KUBE-IPVS-IPS dst -j REJECT"));
}

#[test]
fn without_the_ipset_output_the_walk_says_so() {
    let mut st = node();
    st.ipset = None;
    let t = walk(&st, "10.0.0.2", "10.96.0.10", 80, "eth0");
    assert!(t
        .assumptions
        .iter()
        .any(|a| a.starts_with("no ipset output: rules matching set KUBE-CLUSTER-IP")));
}

/// The node's own connection to a ClusterIP (OUTPUT path): the source is the local route's
/// (10.96.0.10 itself), nat OUTPUT marks it (not from the cluster CIDR), IPVS at LOCAL_OUT
/// sends it to a real server, the new route leaves by the pod's veth, masquerade picks
/// 10.244.1.1, and the reply is delivered to the local socket through INPUT.
#[test]
fn the_node_itself_to_a_cluster_ip() {
    let st = node();
    let t = walk(&st, "0.0.0.0", "10.96.0.10", 80, LOCAL);
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
    assert!(has_hop(
        &t,
        "output routing",
        "",
        "source address 10.96.0.10"
    ));
    assert!(has_hop(
        &t,
        "OUTPUT",
        "--match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ",
        "jump KUBE-MARK-MASQ"
    ));
    assert!(has_hop(
        &t,
        "IPVS LOCAL_OUT",
        "",
        "real server 10.244.1.11:8080"
    ));
    assert!(has_hop(&t, "output reroute", "", "out veth1"));
    assert!(has_hop(
        &t,
        "POSTROUTING",
        "MASQUERADE",
        "source 10.96.0.10 → 10.244.1.1"
    ));
    assert!(has_hop(
        &t,
        "reply deliver",
        "",
        "the reply is for this node"
    ));
}

/// The node to its own NodePort address: IPVS at LOCAL_OUT too (the virtual server is on
/// 10.0.0.1:30080); from 127.0.0.1 KUBE-SERVICES returns early, so nothing marks it.
#[test]
fn the_node_itself_to_its_own_node_port_and_to_a_plain_local_port() {
    let st = node();
    let t = walk(&st, "0.0.0.0", "10.0.0.1", 30080, LOCAL);
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
    assert!(has_hop(&t, "IPVS LOCAL_OUT", "", "real server"));
    // A local port no virtual server holds: looped over lo to a local socket.
    let t = walk(&st, "127.0.0.1", "10.0.0.1", 22, LOCAL);
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
    assert!(has_hop(
        &t,
        "deliver",
        "",
        "to a local socket on 10.0.0.1:22"
    ));
    assert!(!t.hops.iter().any(|h| h.stage.starts_with("IPVS")));
}
