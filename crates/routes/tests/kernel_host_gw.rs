//! The host-gw backend in the real kernel: plain routes between nodes on one segment, a clear
//! refusal for a node behind a router, and foreign routes left alone.

mod common;

use common::*;
use weir_model::Snapshot;
use weir_routes::kernel::reconcile;
use weir_routes::{Backend, Config, NodeStatus, Op};

#[test]
fn host_gw_routes_on_a_shared_segment_and_refuses_a_routed_node() {
    if !runnable() {
        return;
    }
    // node1 behind the router on 10.77.1.0/24; node2 and node3 share 10.77.2.0/24.
    let c = Cluster::new("hg", &[1, 2, 2]);
    let (n1, n2, n3) = (c.node(1), c.node(2), c.node(3));
    let objects: Vec<_> = c
        .nodes
        .iter()
        .map(|n| node_object(n, &Default::default()))
        .collect();
    for n in [n2, n3] {
        let r = sync(n, &Backend::HostGw, &objects);
        assert_eq!(r.desired.vtep, None);
        match &r.desired.status["node1"] {
            NodeStatus::Refused { routed, reasons } => {
                assert!(routed.is_empty());
                assert!(
                    reasons[0].contains("10.77.1.11 is not on a directly connected subnet"),
                    "{reasons:?}"
                );
            }
            other => panic!("{other:?}"),
        }
        // The simulated underlay is IPv4 only: the IPv6 pod CIDR of the peer is refused, its
        // IPv4 one routed.
        let peer = if n.i == 2 { "node3" } else { "node2" };
        let NodeStatus::Refused { routed, reasons } = &r.desired.status[peer] else {
            panic!("{:?}", r.desired.status[peer]);
        };
        assert_eq!(routed.len(), 1, "{routed:?}");
        assert!(
            reasons[0].contains("no InternalIP of its family"),
            "{reasons:?}"
        );
    }
    let routes = run(&format!("ip -n {} route show proto 87", n2.ns));
    assert_eq!(routes.trim(), "10.244.3.0/24 via 10.77.2.13 dev eth0");
    tcp(n2, n3, n3.pod_v4(), 100_000).unwrap();
    tcp(n3, n2, n2.pod_v4(), 100_000).unwrap();
    assert!(
        tcp(n2, n1, n1.pod_v4(), 100).is_err(),
        "node1 is not routed"
    );

    // A restart changes nothing.
    let before = dump(n2);
    assert!(sync(n2, &Backend::HostGw, &objects).applied.is_empty());
    assert_eq!(dump(n2), before);
}

#[test]
fn a_foreign_route_to_a_pod_cidr_is_left_alone_and_reported() {
    if !runnable() {
        return;
    }
    let c = Cluster::new("fr", &[2, 2, 2]);
    let (n1, n2) = (c.node(1), c.node(2));
    run(&format!(
        "ip -n {} route add 10.244.2.0/24 via 10.77.2.1 proto static",
        n1.ns
    ));
    let objects: Vec<_> = c
        .nodes
        .iter()
        .map(|n| node_object(n, &Default::default()))
        .collect();
    let cfg = Config::new(&n1.name, Backend::HostGw);
    let snapshot = Snapshot::from_objects(&objects);
    let r = reconcile(&mut n1.rtnl(), &cfg, &snapshot, None).unwrap();
    assert_eq!(r.failed.len(), 1, "{:?}", r.failed);
    assert!(matches!(r.failed[0].0, Op::AddRoute(..)));
    assert!(r.failed[0].1.contains("exists"), "{}", r.failed[0].1);
    // node3's route went in regardless; the foreign route is untouched.
    let routes = run(&format!("ip -n {} route show", n1.ns));
    assert!(
        routes.contains("10.244.2.0/24 via 10.77.2.1 dev eth0 proto static"),
        "{routes}"
    );
    assert!(
        routes.contains("10.244.3.0/24 via 10.77.2.13 dev eth0 proto 87"),
        "{routes}"
    );
    // Once it is removed, the next reconciliation puts weir's in place.
    run(&format!(
        "ip -n {} route del 10.244.2.0/24 via 10.77.2.1",
        n1.ns
    ));
    let r = reconcile(&mut n1.rtnl(), &cfg, &snapshot, None).unwrap();
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    assert_eq!(r.applied.len(), 1);
    sync(n2, &Backend::HostGw, &objects); // the way back
    tcp(n1, n2, n2.pod_v4(), 10_000).unwrap();
}
