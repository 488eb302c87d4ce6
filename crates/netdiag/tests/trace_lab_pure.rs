//! Regression cases for what the differential matrix (crates/weir/tests/lab_trace.rs) found,
//! on node a of the matrix's bridge lab collected with `weir trace collect` under each weir
//! proxy mode (tests/data/lab-bridge-{nftables,iptables,userspace}-a; pods a1 10.244.1.2 on
//! veth weirf7a2b57a364, a2 10.244.1.3, b1 10.244.2.2, b2 10.244.2.3; services web 10.96.0.1
//! → a1,b1; remote 10.96.0.3 → b1; np NodePort 30081 → b1; gone 10.96.0.8 without endpoints).
//! No root needed.

mod common;

use weir_netdiag::state::NodeState;
use weir_netdiag::trace::{self, Verdict};

use common::{data_dir, walk};

const A1: &str = "10.244.1.2";
const A1_VETH: &str = "weirf7a2b57a364";

fn node(mode: &str) -> NodeState {
    NodeState::from_dir(&data_dir(&format!("lab-bridge-{mode}-a")))
        .unwrap()
        .0
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// weir's nftables mode DNATs through a map keyed by `ip daddr . meta l4proto . th dport .
/// numgen random mod N`. The walk used to skip it (the address is a map, not a literal) and
/// sent the packet on to the ClusterIP itself.
#[test]
fn nftables_dnat_through_the_endpoint_map() {
    let st = node("nftables");
    let t = walk(&st, A1, "10.96.0.3", 80, A1_VETH);
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
    assert_eq!(t.endpoints, vec!["10.244.2.2:8080"]);
    let e = t.egress.as_ref().unwrap();
    assert_eq!(
        (e.dst.to_string(), e.dport, e.oif.as_deref()),
        ("10.244.2.2".into(), 8080, Some("eth0"))
    );
    assert!(t.hops.iter().any(|h| h.note == "DNAT to 10.244.2.2:8080"));
    // The pod's veth is a port of cni0: the IP layer sees the packet on cni0.
    assert_eq!(t.hops[0].stage, "bridge");

    // Two endpoints: both are candidates ("one of"), and the walk goes to each.
    let t = walk(&st, A1, "10.96.0.1", 80, A1_VETH);
    assert_eq!(
        sorted(t.endpoints.clone()),
        vec!["10.244.1.2:8080", "10.244.2.2:8080"]
    );
    assert!(t.choices.iter().any(|c| c.starts_with("one of")));
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
    assert_eq!(
        sorted(
            t.endpoint_outcomes
                .iter()
                .filter(|e| e.verdict == Verdict::Delivered)
                .map(|e| e.endpoint.clone())
                .collect()
        ),
        vec!["10.244.1.2:8080", "10.244.2.2:8080"]
    );

    // Outside → NodePort (policy Cluster) on node a: the NodePort map, then masquerade.
    let t = walk(&st, "198.51.100.1", "172.30.9.11", 30081, "eth0");
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
    assert_eq!(t.endpoints, vec!["10.244.2.2:8080"]);
    assert_eq!(t.egress.unwrap().src.to_string(), "172.30.9.11");
}

/// A service without endpoints is rejected at once (TCP reset / ICMP unreachable), which a
/// client sees as "connection refused", not a timeout; the walk used to call it dropped.
#[test]
fn no_endpoints_is_rejected_in_every_kernel_mode() {
    for mode in ["nftables", "iptables"] {
        let st = node(mode);
        let t = walk(&st, A1, "10.96.0.8", 80, A1_VETH);
        assert_eq!(t.verdict, Verdict::Rejected, "{mode}: {:?}", t.cause);
        assert!(trace::render(&t).contains("verdict: REJECTED"));
        // Outside → its NodePort too.
        let t = walk(&st, "198.51.100.1", "172.30.9.11", 30001, "eth0");
        assert_eq!(t.verdict, Verdict::Rejected, "{mode}: {:?}", t.cause);
    }
}

/// iptables mode: the statistic cascade's alternatives are the endpoint set.
#[test]
fn iptables_statistic_cascade_is_the_endpoint_set() {
    let st = node("iptables");
    let t = walk(&st, A1, "10.96.0.1", 80, A1_VETH);
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
    assert_eq!(
        sorted(t.endpoints.clone()),
        vec!["10.244.1.2:8080", "10.244.2.2:8080"]
    );
}

/// userspace mode: nft `redirect` to the proxy's listener, a local socket on the address of
/// the interface the packet came in on. The walk used to pass the rule over and forward the
/// packet to the ClusterIP out of eth0.
#[test]
fn userspace_redirect_is_local_delivery_to_the_listener() {
    let st = node("userspace");
    let t = walk(&st, A1, "10.96.0.1", 80, A1_VETH);
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
    let e = t.egress.unwrap();
    assert!(e.local, "{e:?}");
    assert_eq!(e.dst.to_string(), "10.244.1.1", "cni0's address");
    assert_ne!(e.dport, 80, "the listener's port");
    assert!(t
        .assumptions
        .iter()
        .all(|a| !a.contains("redirect not modelled")));
}

/// eni-shared with the fix (tests/data/lab-eni-a-fix-on, kube-proxy's iptables shapes): pod a1
/// (10.12.192.18, veth eniccaff4a074a3) → the ClusterIP of `web`, whose first endpoint is a1
/// itself. The hairpin is masqueraded out a1's veth (no address, so eth0's 10.12.97.11 is
/// taken) and a1 answers on that same veth. The walk used to have the reply arrive on eth0,
/// the masquerade address's interface, and fail strict rp_filter there; the kernel delivers
/// it (the lab's hairpin probes pass).
#[test]
fn a_reply_from_a_directly_connected_backend_returns_on_its_link() {
    let dir = data_dir("lab-eni-a-fix-on");
    let st = NodeState::from_dir(&dir).unwrap().0;
    let t = walk(&st, "10.12.192.18", "10.96.0.1", 80, "eniccaff4a074a3");
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
    assert!(t
        .hops
        .iter()
        .any(|h| h.stage == "reply" && h.place == "eniccaff4a074a3"));
    assert!(t.endpoints.contains(&"10.12.192.18:8080".to_string()));
    // No cloud source-check warning: the packet never reaches the VPC.
    assert!(t
        .hops
        .iter()
        .all(|h| !h.note.contains("source/destination check")));
}
