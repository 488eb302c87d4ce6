//! The deciding rule's counters cited in its hop (issue 30): the DROP, REJECT or ACCEPT that
//! decides a walk shows its place in its chain and the packets it has counted, from
//! `iptables-save -c` (`[3:180] -A …`), `iptables -L -v` (its `pkts bytes` columns) and nft's
//! `counter packets N bytes M`, each a paste captured here (`tests/data/pasted/README.md`).

mod common;

use common::{data_dir, has_hop};
use weir_netdiag::state::NodeState;
use weir_netdiag::trace::{self, Packet, Proto, Trace, Verdict, LOCAL};

/// The fixture `pasted/NAME` with table local's loopback routes (output routing needs them).
fn node_with(name: &str, extra: &[(&str, &str)]) -> NodeState {
    let text = std::fs::read_to_string(data_dir("pasted").join(name)).unwrap();
    let mut sources = vec![
        (name.to_string(), text),
        (
            "ip-route-show-table-local".to_string(),
            "local 127.0.0.0/8 dev lo proto kernel scope host src 127.0.0.1\n".to_string(),
        ),
    ];
    sources.extend(extra.iter().map(|(n, t)| (n.to_string(), t.to_string())));
    let st = NodeState::from_sources(sources);
    assert!(st.skipped.is_empty(), "{:?}", st.skipped);
    st
}

/// A TCP SYN the node sends itself to 127.0.0.1:`dport`.
fn local_syn(st: &NodeState, dport: u16) -> Trace {
    let t = trace::trace(
        st,
        &Packet {
            src: "127.0.0.1".parse().unwrap(),
            dst: "127.0.0.1".parse().unwrap(),
            proto: Proto::Tcp,
            sport: 40000,
            dport,
            iif: LOCAL.into(),
        },
    );
    eprintln!("{}", trace::render(&t));
    t
}

#[test]
fn iptables_save_c_counters_are_cited_at_the_drop_and_the_accept() {
    let st = node_with("iptables-legacy-save-c-drops.txt", &[]);
    let t = local_syn(&st, 9);
    assert_eq!(t.verdict, Verdict::Dropped, "{:?}", t.cause);
    assert!(
        has_hop(
            &t,
            "OUTPUT",
            "--dport 9 -j DROP",
            "dropped (rule 2 of KUBE-FIREWALL; its counter in the paste: 3 packets, 180 bytes)"
        ),
        "{:#?}",
        t.hops
    );
    let t = local_syn(&st, 7);
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
    assert!(
        has_hop(
            &t,
            "OUTPUT",
            "--dport 7 -j ACCEPT",
            "accepted (rule 2 of OUTPUT; its counter in the paste: 1 packet, 60 bytes)"
        ),
        "{:#?}",
        t.hops
    );
}

/// A grep cut of the same dump: the counters are cited, the rule's place is not (the cut hides
/// the rules around it).
#[test]
fn a_grep_cut_dump_cites_the_counter_without_a_place() {
    let text = std::fs::read_to_string(data_dir("pasted").join("iptables-legacy-save-c-drops.txt"))
        .unwrap();
    let cut: String = std::iter::once("# iptables-save -c | grep -e OUTPUT -e KUBE-FIREWALL\n")
        .chain(
            text.lines()
                .filter(|l| l.contains("OUTPUT") || l.contains("KUBE-FIREWALL"))
                .flat_map(|l| [l, "\n"]),
        )
        .collect();
    let st = NodeState::from_sources([
        ("cut.txt".to_string(), cut),
        (
            "ip-route-show-table-local".to_string(),
            "local 127.0.0.0/8 dev lo proto kernel scope host src 127.0.0.1\n".to_string(),
        ),
    ]);
    assert!(st.iptables.as_ref().unwrap().partial);
    let t = local_syn(&st, 9);
    assert!(
        has_hop(
            &t,
            "OUTPUT",
            "--dport 9 -j DROP",
            "dropped (its counter in the paste: 3 packets, 180 bytes)"
        ),
        "{:#?}",
        t.hops
    );
}

#[test]
fn nft_counters_are_cited_with_the_rules_handle() {
    let st = node_with("nft-a-list-ruleset-counters.txt", &[]);
    let t = local_syn(&st, 9);
    assert_eq!(t.verdict, Verdict::Rejected, "{:?}", t.cause);
    assert!(
        has_hop(
            &t,
            "OUTPUT",
            "tcp dport 9 counter reject",
            "rejected (rule handle 7 of kube-firewall; its counter in the paste: 3 packets, 180 bytes)"
        ),
        "{:#?}",
        t.hops
    );
    let t = local_syn(&st, 7);
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
    assert!(has_hop(
        &t,
        "OUTPUT",
        "tcp dport 7 counter accept",
        "accepted (rule handle 5 of output; its counter in the paste: 1 packet, 60 bytes)"
    ));
}

/// `iptables -L -n -v --line-numbers`: the listing's own rule number, and a counter of zero
/// said for what it shows (the rule has matched nothing so far).
#[test]
fn a_listings_counters_and_rule_numbers_are_cited() {
    let routes = "default via 10.0.0.1 dev eth0\n10.0.0.0/24 dev eth0 proto kernel scope link src 10.0.0.4\n\
                  10.0.1.0/24 dev eth1 proto kernel scope link src 10.0.1.4\n";
    let sysctl = "net.ipv4.ip_forward = 1\nnet.ipv4.conf.all.rp_filter = 0\nnet.ipv4.conf.eth1.rp_filter = 0\n";
    let st = node_with(
        "iptables-L-n-v-line-numbers.txt",
        &[("ip-route.txt", routes), ("sysctl.txt", sysctl)],
    );
    let t = trace::trace(
        &st,
        &Packet {
            src: "10.0.1.9".parse().unwrap(),
            dst: "192.0.2.7".parse().unwrap(),
            proto: Proto::Tcp,
            sport: 40000,
            dport: 22,
            iif: "eth1".into(),
        },
    );
    eprintln!("{}", trace::render(&t));
    assert_eq!(t.verdict, Verdict::Rejected, "{:?}", t.cause);
    assert!(
        has_hop(
            &t,
            "FORWARD",
            "REJECT",
            "rejected (rule 5 of FORWARD; its counter in the paste: 0 packets, 0 bytes: it has matched no packet so far)"
        ),
        "{:#?}",
        t.hops
    );
}
