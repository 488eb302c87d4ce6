//! ICMP echo and packets the node sends itself, against the kernel (root): a real `ping`
//! and `weir trace --proto icmp` on the node's live state must agree, with the rule that
//! decides flipped each time so a walk that always said one thing fails.

mod common;

use common::ns::Ns;
use common::walk_icmp;
use weir_netdiag::trace::{Verdict, LOCAL};

/// Client — node — backend, the node routing between them.
struct Routed {
    client: Ns,
    node: Ns,
    _backend: Ns,
}

fn routed(tag: &str) -> Routed {
    let client = Ns::new("wdi", &format!("{tag}c"));
    let node = Ns::new("wdi", &format!("{tag}n"));
    let backend = Ns::new("wdi", &format!("{tag}b"));
    node.sh(&format!(
        "ip link add eth0 type veth peer name c0 netns {} && ip link add eth1 type veth peer name b0 netns {} \
         && ip addr add 10.70.0.1/24 dev eth0 && ip addr add 10.71.0.1/24 dev eth1 \
         && ip link set eth0 up && ip link set eth1 up && sysctl -qw net.ipv4.ip_forward=1",
        client.0, backend.0
    ));
    client.sh("ip addr add 10.70.0.2/24 dev c0 && ip link set c0 up && ip route add default via 10.70.0.1");
    backend.sh("ip addr add 10.71.0.2/24 dev b0 && ip link set b0 up && ip route add default via 10.71.0.1");
    Routed {
        client,
        node,
        _backend: backend,
    }
}

/// A forwarded ping: dropped by an iptables ICMP rule, then by an nft `icmp type` rule, and
/// passed by a rule that drops only TCP.
#[test]
fn a_forwarded_ping_meets_icmp_rules_as_the_kernel_does() {
    let r = routed("f");
    let walk = |r: &Routed| walk_icmp(&r.node.state(), "10.70.0.2", "10.71.0.2", "eth0");

    r.node
        .sh("iptables -A FORWARD -p icmp -m icmp --icmp-type echo-request -j DROP");
    assert!(
        !r.client.pings("10.71.0.2"),
        "iptables must drop the echo request"
    );
    let t = walk(&r);
    assert_eq!(t.verdict, Verdict::Dropped, "{:?}", t.cause);
    assert!(
        t.cause.as_deref().unwrap().starts_with("FORWARD"),
        "{:?}",
        t.cause
    );

    r.node.sh("iptables -F FORWARD && nft add table inet wdi && nft add chain inet wdi filt '{ type filter hook forward priority 0; }' \
               && nft add rule inet wdi filt icmp type echo-request drop");
    assert!(
        !r.client.pings("10.71.0.2"),
        "nft must drop the echo request"
    );
    let t = walk(&r);
    assert_eq!(t.verdict, Verdict::Dropped, "{:?}", t.cause);

    r.node.sh(
        "nft flush chain inet wdi filt && nft add rule inet wdi filt meta l4proto tcp drop \
               && iptables -A FORWARD -p tcp -j DROP",
    );
    assert!(
        r.client.pings("10.71.0.2"),
        "rules for TCP must not touch ICMP"
    );
    let t = walk(&r);
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
}

/// The node pings the backend itself: the OUTPUT path, dropped by an OUTPUT ICMP rule, then
/// delivered once it is gone.
#[test]
fn a_ping_the_node_sends_takes_the_output_path() {
    let r = routed("o");
    r.node.sh("iptables -A OUTPUT -p icmp -j DROP");
    assert!(
        !r.node.pings("10.71.0.2"),
        "OUTPUT must drop the node's ping"
    );
    let t = walk_icmp(&r.node.state(), "10.71.0.1", "10.71.0.2", LOCAL);
    assert_eq!(t.verdict, Verdict::Dropped, "{:?}", t.cause);
    assert!(
        t.cause.as_deref().unwrap().contains("OUTPUT"),
        "{:?}",
        t.cause
    );

    r.node.sh("iptables -F OUTPUT");
    assert!(r.node.pings("10.71.0.2"));
    let t = walk_icmp(&r.node.state(), "10.71.0.1", "10.71.0.2", LOCAL);
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
}
