//! The vxlan backend in the real kernel: three nodes on two routed underlay subnets, each with a
//! pod, connected by weir's VTEPs (TCP over IPv4 and IPv6 pod addresses).

mod common;

use common::*;
use weir_routes::kernel::cleanup;
use weir_routes::{Backend, NodeStatus, VxlanConfig};

fn vxlan() -> Backend {
    Backend::Vxlan(VxlanConfig::default())
}

/// Brings up the overlay on every node of `c`: a first sync creates the VTEPs (the others are
/// "not published yet"), the published annotations go on the Node objects, a second sync
/// programs the entries. Returns the annotated Node objects.
fn bring_up(c: &Cluster, nodes: &[u8]) -> Vec<weir_model::Object> {
    let bare: Vec<_> = nodes
        .iter()
        .map(|i| node_object(c.node(*i), &Default::default()))
        .collect();
    let mut annotated = Vec::new();
    for i in nodes {
        let n = c.node(*i);
        let r = sync(n, &vxlan(), &bare);
        for (name, s) in &r.desired.status {
            let NodeStatus::Refused { reasons, .. } = s else {
                panic!("{name} routed without a published VTEP: {s:?}")
            };
            assert!(reasons[0].contains("no VTEP published yet"), "{reasons:?}");
        }
        // What weir publishes is what the kernel has.
        let link = n.rtnl().require_link("weir.1").unwrap();
        assert_eq!(link.mac, r.desired.vtep.as_ref().unwrap().mac.to_vec());
        assert_eq!(link.mtu, 1450, "underlay 1500 - 50");
        let vx = link.vxlan.unwrap();
        assert_eq!(
            (vx.vni, vx.port, vx.local, vx.learning),
            (Some(1), Some(8472), Some(n.ip), Some(false))
        );
        annotated.push(node_object(n, &published(&r, &vxlan())));
    }
    for i in nodes {
        let r = sync(c.node(*i), &vxlan(), &annotated);
        for (name, s) in &r.desired.status {
            assert!(matches!(s, NodeStatus::Routed { .. }), "{name}: {s:?}");
        }
    }
    annotated
}

#[test]
fn pods_reach_each_other_across_routed_subnets_and_nodes_come_and_go() {
    if !runnable() {
        return;
    }
    // node1 on 10.77.1.0/24; node2 and node3 on 10.77.2.0/24; the router between.
    let c = Cluster::new("vx", &[1, 2, 2]);
    let (n1, n2, n3) = (c.node(1), c.node(2), c.node(3));
    let objects = bring_up(&c, &[1, 2, 3]);

    for (a, b) in [(n1, n2), (n1, n3), (n3, n2), (n2, n1)] {
        tcp(a, b, b.pod_v4(), 200_000).unwrap();
        tcp(a, b, b.pod_v6(), 200_000).unwrap();
    }
    let out = run(&format!(
        "ip netns exec {} busybox ping -c1 -W2 {}",
        n1.pod_ns,
        n3.pod_v4()
    ));
    assert!(out.contains("1 packets received"), "{out}");

    // The entries as iproute2 shows them.
    let routes = run(&format!("ip -n {} route show proto 87", n1.ns));
    assert!(
        routes.contains("10.244.2.0/24 via 10.244.2.0 dev weir.1 onlink"),
        "{routes}"
    );
    assert!(
        routes.contains("10.244.3.0/24 via 10.244.3.0 dev weir.1 onlink"),
        "{routes}"
    );
    let fdb = run(&format!("bridge -n {} fdb show dev weir.1", n1.ns));
    assert!(fdb.contains("dst 10.77.2.12 self permanent"), "{fdb}");
    assert!(fdb.contains("dst 10.77.2.13 self permanent"), "{fdb}");

    // A restart (a new process: fresh netlink socket, no memory) changes nothing.
    let before = dump(n1);
    let again = sync(n1, &vxlan(), &objects);
    assert!(again.applied.is_empty(), "{:?}", again.applied);
    assert_eq!(dump(n1), before);

    // node3 leaves: node1 and node2 drop its entries only, and keep working: a TCP stream
    // between their pods runs throughout the leave and the rejoin.
    let flow = Flow::start(n1, n2, n2.pod_v4());
    let flow6 = Flow::start(n2, n1, n1.pod_v6());
    let without3: Vec<_> = objects[..2].to_vec();
    for n in [n1, n2] {
        let r = sync(n, &vxlan(), &without3);
        assert_eq!(
            r.applied.len(),
            5,
            "{}: route+neigh for 2 CIDRs, 1 fdb: {:?}",
            n.name,
            r.applied
        );
    }
    let routes = run(&format!("ip -n {} route show proto 87", n1.ns));
    assert!(!routes.contains("10.244.3.0"), "{routes}");
    assert!(routes.contains("10.244.2.0/24"), "{routes}");
    tcp(n1, n2, n2.pod_v4(), 10_000).unwrap();
    tcp(n2, n1, n1.pod_v6(), 10_000).unwrap();
    assert!(
        tcp(n1, n3, n3.pod_v4(), 100).is_err(),
        "node3 must be unreachable once gone"
    );

    // node3 comes back (same VTEP: its MAC is stable), traffic flows again.
    for n in [n1, n2] {
        let r = sync(n, &vxlan(), &objects);
        assert_eq!(r.applied.len(), 5, "{}: {:?}", n.name, r.applied);
    }
    tcp(n1, n3, n3.pod_v4(), 10_000).unwrap();
    tcp(n3, n2, n2.pod_v6(), 10_000).unwrap();
    for f in [flow, flow6] {
        let (bytes, silence) = f.finish().unwrap();
        // Sent every 5 ms; a lost route would stall it for a retransmission timeout or more.
        // (1 s leaves room for a busy machine.)
        assert!(
            bytes > 0 && silence < std::time::Duration::from_secs(1),
            "{bytes} B, {silence:?}"
        );
    }
}

#[test]
fn cleanup_removes_all_of_weirs_and_nothing_else() {
    if !runnable() {
        return;
    }
    let c = Cluster::new("cl", &[1, 2]);
    let n1 = c.node(1);
    // Routes weir did not make, one of them to a pod CIDR weir also routes elsewhere.
    run(&format!(
        "ip -n {} route add 10.99.0.0/24 via 10.77.1.1",
        n1.ns
    ));
    run(&format!(
        "ip -n {} route add 10.244.2.0/25 via 10.77.1.1 proto static",
        n1.ns
    ));
    bring_up(&c, &[1, 2]);
    let routes = run(&format!("ip -n {} route show", n1.ns));
    assert!(
        routes.contains("10.244.2.0/24 via 10.244.2.0 dev weir.1 proto 87 onlink"),
        "{routes}"
    );

    let cleaned = cleanup(&mut n1.rtnl()).unwrap();
    assert!(cleaned.errors.is_empty(), "{:?}", cleaned.errors);
    assert_eq!(cleaned.devices, vec!["weir.1".to_string()]);
    assert_eq!(dump(n1), "", "nothing of weir's is left");
    let routes = run(&format!("ip -n {} route show", n1.ns));
    assert!(routes.contains("10.99.0.0/24 via 10.77.1.1"), "{routes}");
    assert!(
        routes.contains("10.244.2.0/25 via 10.77.1.1 dev eth0 proto static"),
        "{routes}"
    );
    // A second cleanup finds nothing.
    let again = cleanup(&mut n1.rtnl()).unwrap();
    assert_eq!((again.routes, again.devices.len()), (0, 0));
}
