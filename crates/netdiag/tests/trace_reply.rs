//! `weir trace --reply`: a pasted conntrack entry picks, among the endpoints the rules choose
//! from, the one the connection actually went to.

use weir_netdiag::state::NodeState;
use weir_netdiag::trace::{along_entry, pasted_entry, Packet, Proto, Verdict};

const NAT_AND_FILTER: &str = "*nat
:PREROUTING ACCEPT [0:0]
:KUBE-SVC - [0:0]
:KUBE-SEP-A - [0:0]
:KUBE-SEP-B - [0:0]
-A PREROUTING -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j KUBE-SVC
-A KUBE-SVC -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-A
-A KUBE-SVC -j KUBE-SEP-B
-A KUBE-SEP-A -p tcp -m tcp -j DNAT --to-destination 10.244.1.5:8080
-A KUBE-SEP-B -p tcp -m tcp -j DNAT --to-destination 10.244.2.6:8080
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A FORWARD -d 10.244.2.6/32 -j DROP
COMMIT
";

fn node(conntrack: &str) -> (tempfile::TempDir, NodeState) {
    let tmp = tempfile::tempdir().unwrap();
    let files = [
        ("iptables-save.txt", NAT_AND_FILTER.to_string()),
        (
            "ip-route.txt",
            "10.0.0.0/24 dev eth0 proto kernel scope link src 10.0.0.4\n\
             10.244.1.0/24 dev cni0 proto kernel scope link src 10.244.1.1\n\
             10.244.2.0/24 via 10.0.0.7 dev eth0\n"
                .to_string(),
        ),
        (
            "sysctl.txt",
            "net.ipv4.ip_forward = 1\nnet.ipv4.conf.all.rp_filter = 0\n\
             net.ipv4.conf.eth0.rp_filter = 0\nnet.ipv4.conf.cni0.rp_filter = 0\n\
             net.ipv4.conf.all.src_valid_mark = 0\n"
                .to_string(),
        ),
        ("conntrack-L.txt", conntrack.to_string()),
    ];
    for (name, text) in files {
        std::fs::write(tmp.path().join(name), text).unwrap();
    }
    let (st, _) = NodeState::from_dir(tmp.path()).unwrap();
    (tmp, st)
}

fn packet() -> Packet {
    Packet {
        src: "10.0.0.5".parse().unwrap(),
        dst: "10.96.0.10".parse().unwrap(),
        proto: Proto::Tcp,
        sport: 40000,
        dport: 80,
        iif: "eth0".into(),
    }
}

#[test]
fn the_pasted_connection_decides_which_endpoint_is_walked() {
    let to_b = "tcp      6 117 SYN_SENT src=10.0.0.5 dst=10.96.0.10 sport=40000 dport=80 [UNREPLIED] src=10.244.2.6 dst=10.0.0.5 sport=8080 dport=40000 mark=0 use=1\n";
    let (_tmp, st) = node(to_b);
    let t = weir_netdiag::trace::trace(&st, &packet());
    // Without the entry: one endpoint of two fails.
    assert_eq!(t.endpoint_outcomes.len(), 2, "{:#?}", t.endpoint_outcomes);
    let entry = pasted_entry(&st, &packet()).expect("the pasted entry");
    let (t, note) = along_entry(t, entry);
    assert!(note.contains("10.244.2.6:8080"), "{note}");
    assert_eq!(t.verdict, Verdict::Dropped, "{:?}", t.cause);
    assert!(
        t.cause.as_deref().unwrap().contains("FORWARD"),
        "{:?}",
        t.cause
    );

    let to_a = "tcp      6 431999 ESTABLISHED src=10.0.0.5 dst=10.96.0.10 sport=40000 dport=80 src=10.244.1.5 dst=10.0.0.5 sport=8080 dport=40000 [ASSURED] mark=0 use=1\n";
    let (_tmp, st) = node(to_a);
    let t = weir_netdiag::trace::trace(&st, &packet());
    let entry = pasted_entry(&st, &packet()).expect("the pasted entry");
    let (t, note) = along_entry(t, entry);
    assert!(note.contains("10.244.1.5:8080"), "{note}");
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
}

#[test]
fn no_entry_for_another_connection() {
    let other = "udp      17 29 src=10.0.0.5 dst=10.96.0.53 sport=5353 dport=53 [UNREPLIED] src=10.96.0.53 dst=10.0.0.5 sport=53 dport=5353 mark=0 use=1\n";
    let (_tmp, st) = node(other);
    assert!(pasted_entry(&st, &packet()).is_none());
}
