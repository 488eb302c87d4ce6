//! The pure part: Node objects → desired state → diff against what the kernel holds.

use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::json;
use weir_model::k8s_openapi::api::core::v1::Node;
use weir_model::{Object, Snapshot};
use weir_routes::diff::{Observed, ObservedVtep};
use weir_routes::plan::{vtep_mac, RouteEntry};
use weir_routes::{annotations::VtepData, desire, diff, Backend, Config, Local, NodeStatus, Op};
use weir_routes::{format_mac, Underlay, VxlanConfig};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}
fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

/// A Node with pod CIDRs, InternalIPs and (optionally) a published VTEP.
fn node(name: &str, cidrs: &[&str], ips: &[&str], vtep_mac: Option<&str>) -> Object {
    let mut annotations = serde_json::Map::new();
    if let Some(mac) = vtep_mac {
        annotations.insert("weir.dev/backend-type".into(), json!("vxlan"));
        annotations.insert(
            "weir.dev/backend-data".into(),
            json!(format!(r#"{{"VNI":1,"VtepMAC":"{mac}"}}"#)),
        );
    }
    let addresses: Vec<_> = ips
        .iter()
        .map(|a| json!({"type": "InternalIP", "address": a}))
        .collect();
    let n: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"podCIDR": cidrs[0], "podCIDRs": cidrs},
        "status": {"addresses": addresses},
    }))
    .unwrap();
    n.into()
}

fn snapshot(objects: &[Object]) -> Snapshot {
    Snapshot::from_objects(objects)
}

const MAC_B: &str = "02:00:00:00:00:0b";
const MAC_C: &str = "02:00:00:00:00:0c";

fn mac(s: &str) -> [u8; 6] {
    weir_routes::parse_mac(s).unwrap()
}

/// Node a (10.0.1.10 on eth0 #2, MTU 1500) running vxlan; b on another subnet; c dual-stack.
fn vxlan_cluster() -> Vec<Object> {
    vec![
        node("a", &["10.244.0.0/24"], &["10.0.1.10"], None),
        node("b", &["10.244.1.0/24"], &["10.0.2.10"], Some(MAC_B)),
        node(
            "c",
            &["10.244.2.0/24", "fd00:10:244:2::/64"],
            &["10.0.2.11", "fd00::11"],
            Some(MAC_C),
        ),
    ]
}

fn vxlan_local() -> Local {
    Local {
        addresses: vec![net("10.0.1.10/24"), net("127.0.0.1/8")],
        underlay: Some(Underlay {
            ip: ip("10.0.1.10"),
            index: 2,
            mtu: 1500,
        }),
    }
}

fn vxlan_cfg() -> Config {
    Config::new("a", Backend::Vxlan(VxlanConfig::default()))
}

/// The kernel state right after `desired` was applied.
fn as_applied(desired: &weir_routes::Desired) -> Observed {
    let vtep = desired.vtep.as_ref().map(|v| ObservedVtep {
        index: 7,
        kind: Some("vxlan".into()),
        vxlan: weir_kernel::VxlanInfo {
            vni: Some(v.vni),
            local: Some(v.local),
            port: Some(v.port),
            underlay: Some(v.underlay_index),
            learning: Some(false),
        },
        mac: v.mac.to_vec(),
        mtu: v.mtu,
        up: true,
        addresses: v.addresses.clone(),
    });
    Observed {
        vtep,
        entries: desired.entries.clone(),
    }
}

#[test]
fn vxlan_desires_a_vtep_and_per_node_neighbour_fdb_and_onlink_routes() {
    let d = desire(&vxlan_cfg(), &snapshot(&vxlan_cluster()), &vxlan_local());
    assert_eq!(d.blocked, None);
    let v = d.vtep.as_ref().unwrap();
    assert_eq!((v.name.as_str(), v.vni, v.port), ("weir.1", 1, 8472));
    assert_eq!(v.mtu, 1450, "underlay 1500 - 50 for an IPv4 underlay");
    assert_eq!(v.local, ip("10.0.1.10"));
    assert_eq!(v.addresses, vec![net("10.244.0.0/32")]);
    let r = &d.entries.routes;
    assert_eq!(r.len(), 3, "{r:?}");
    let onlink = |gw: &str| RouteEntry {
        gateway: ip(gw),
        via_vtep: true,
    };
    assert_eq!(r[&net("10.244.1.0/24")], onlink("10.244.1.0"));
    assert_eq!(r[&net("10.244.2.0/24")], onlink("10.244.2.0"));
    assert_eq!(r[&net("fd00:10:244:2::/64")], onlink("fd00:10:244:2::"));
    assert!(
        !r.contains_key(&net("10.244.0.0/24")),
        "never a route to our own pods"
    );
    let n = &d.entries.neighbours;
    assert_eq!(n[&ip("10.244.1.0")], mac(MAC_B));
    assert_eq!(n[&ip("10.244.2.0")], mac(MAC_C));
    assert_eq!(n[&ip("fd00:10:244:2::")], mac(MAC_C));
    let f = &d.entries.fdb;
    assert_eq!(f.len(), 2);
    assert_eq!(f[&mac(MAC_B)], ip("10.0.2.10"));
    assert_eq!(
        f[&mac(MAC_C)],
        ip("10.0.2.11"),
        "the underlay's family, not the IPv6 InternalIP"
    );
    assert!(matches!(d.status["b"], NodeStatus::Routed { .. }));
}

#[test]
fn ipv6_underlay_takes_70_bytes_and_uses_ipv6_remote_addresses() {
    let mut local = vxlan_local();
    local.underlay = Some(Underlay {
        ip: ip("fd00::10"),
        index: 2,
        mtu: 9000,
    });
    let d = desire(&vxlan_cfg(), &snapshot(&vxlan_cluster()), &local);
    assert_eq!(d.vtep.as_ref().unwrap().mtu, 8930);
    assert_eq!(d.entries.fdb[&mac(MAC_C)], ip("fd00::11"));
    // b has no IPv6 address: refused, and nothing of b's is programmed.
    let NodeStatus::Refused { reasons, routed } = &d.status["b"] else {
        panic!("{:?}", d.status["b"]);
    };
    assert!(
        routed.is_empty() && reasons[0].contains("no IPv6 underlay"),
        "{reasons:?}"
    );
    assert!(!d.entries.fdb.contains_key(&mac(MAC_B)));
}

#[test]
fn first_sync_creates_everything_and_a_restart_changes_nothing() {
    let d = desire(&vxlan_cfg(), &snapshot(&vxlan_cluster()), &vxlan_local());
    let ops = diff(&d, &Observed::default()).unwrap();
    assert!(matches!(ops[0], Op::CreateVtep(_)));
    assert_eq!(ops[1], Op::AddVtepAddress(net("10.244.0.0/32")));
    let count = |f: fn(&Op) -> bool| ops.iter().filter(|o| f(o)).count();
    assert_eq!(count(|o| matches!(o, Op::SetFdb(..))), 2);
    assert_eq!(count(|o| matches!(o, Op::SetNeighbour(..))), 3);
    assert_eq!(count(|o| matches!(o, Op::AddRoute(..))), 3);
    // Routes come after the neighbour and FDB entries they rely on.
    let first_route = ops
        .iter()
        .position(|o| matches!(o, Op::AddRoute(..)))
        .unwrap();
    assert!(ops[..first_route]
        .iter()
        .all(|o| !matches!(o, Op::AddRoute(..))));
    assert!(ops[first_route..]
        .iter()
        .all(|o| matches!(o, Op::AddRoute(..))));

    assert_eq!(diff(&d, &as_applied(&d)).unwrap(), vec![]);
}

/// Every key an operation touches: a route destination, neighbour address or FDB MAC.
fn touched(ops: &[Op]) -> Vec<String> {
    ops.iter()
        .map(|o| match o {
            Op::AddRoute(d, _) | Op::DelRoute(d, _) => d.to_string(),
            Op::SetNeighbour(i, _) | Op::DelNeighbour(i, _) => i.to_string(),
            Op::SetFdb(m, _) | Op::DelFdb(m, _) => format_mac(m),
            other => format!("{other:?}"),
        })
        .collect()
}

#[test]
fn a_node_joining_touches_only_its_own_entries() {
    let before = desire(&vxlan_cfg(), &snapshot(&vxlan_cluster()), &vxlan_local());
    let mut objects = vxlan_cluster();
    objects.push(node(
        "d",
        &["10.244.3.0/24"],
        &["10.0.3.10"],
        Some("02:00:00:00:00:0d"),
    ));
    let after = desire(&vxlan_cfg(), &snapshot(&objects), &vxlan_local());
    let ops = diff(&after, &as_applied(&before)).unwrap();
    assert_eq!(
        touched(&ops),
        vec!["02:00:00:00:00:0d", "10.244.3.0", "10.244.3.0/24"]
    );
    assert_eq!(
        ops[0],
        Op::SetFdb(mac("02:00:00:00:00:0d"), ip("10.0.3.10"))
    );
}

#[test]
fn a_node_leaving_removes_only_its_own_entries() {
    let before = desire(&vxlan_cfg(), &snapshot(&vxlan_cluster()), &vxlan_local());
    let mut objects = vxlan_cluster();
    objects.retain(|o| o.key().name != "c");
    let after = desire(&vxlan_cfg(), &snapshot(&objects), &vxlan_local());
    let ops = diff(&after, &as_applied(&before)).unwrap();
    assert!(ops
        .iter()
        .all(|o| matches!(o, Op::DelRoute(..) | Op::DelNeighbour(..) | Op::DelFdb(..))));
    let mut keys = touched(&ops);
    keys.sort();
    assert_eq!(
        keys,
        vec![
            "02:00:00:00:00:0c",
            "10.244.2.0",
            "10.244.2.0/24",
            "fd00:10:244:2::",
            "fd00:10:244:2::/64"
        ]
    );
}

#[test]
fn a_node_changing_its_address_moves_only_its_fdb_entry() {
    let before = desire(&vxlan_cfg(), &snapshot(&vxlan_cluster()), &vxlan_local());
    let mut objects = vxlan_cluster();
    objects[1] = node("b", &["10.244.1.0/24"], &["10.0.9.99"], Some(MAC_B));
    let after = desire(&vxlan_cfg(), &snapshot(&objects), &vxlan_local());
    let ops = diff(&after, &as_applied(&before)).unwrap();
    assert_eq!(
        ops,
        vec![
            Op::DelFdb(mac(MAC_B), ip("10.0.2.10")),
            Op::SetFdb(mac(MAC_B), ip("10.0.9.99")),
        ]
    );
}

#[test]
fn the_public_ip_annotation_wins_over_the_internal_ip() {
    let mut objects = vxlan_cluster();
    let Object::Node(b) = &objects[1] else {
        panic!()
    };
    let mut b = (**b).clone();
    b.annotations
        .insert("weir.dev/public-ip".into(), "192.0.2.7".into());
    objects[1] = b.into();
    let d = desire(&vxlan_cfg(), &snapshot(&objects), &vxlan_local());
    assert_eq!(d.entries.fdb[&mac(MAC_B)], ip("192.0.2.7"));
}

#[test]
fn nodes_without_a_vtep_or_with_another_vni_or_a_taken_mac_or_cidr_are_refused() {
    let mut objects = vxlan_cluster();
    objects.push(node("d", &["10.244.3.0/24"], &["10.0.3.10"], None));
    objects.push(node(
        "e",
        &["10.244.1.0/25"],
        &["10.0.3.11"],
        Some("02:00:00:00:00:0e"),
    ));
    objects.push(node("f", &["10.244.6.0/24"], &["10.0.3.12"], Some(MAC_B)));
    let mut g = node("g", &["10.244.7.0/24"], &["10.0.3.13"], None);
    if let Object::Node(n) = &mut g {
        let n = std::sync::Arc::make_mut(n);
        n.annotations = [(
            "weir.dev/backend-data".into(),
            r#"{"VNI":2,"VtepMAC":"02:00:00:00:00:0f"}"#.into(),
        )]
        .into();
    }
    objects.push(g);
    let d = desire(&vxlan_cfg(), &snapshot(&objects), &vxlan_local());
    let reason = |n: &str| match &d.status[n] {
        NodeStatus::Refused { reasons, .. } => reasons.join("; "),
        other => panic!("{n}: {other:?}"),
    };
    assert!(
        reason("d").contains("no VTEP published yet"),
        "{}",
        reason("d")
    );
    assert!(reason("e").contains("overlaps node b's"), "{}", reason("e"));
    assert!(
        reason("f").contains("is node b's already"),
        "{}",
        reason("f")
    );
    assert!(reason("g").contains("VNI 2 differs"), "{}", reason("g"));
    // b's entries are intact; none of the refused nodes' are there.
    assert_eq!(
        d.entries.routes[&net("10.244.1.0/24")].gateway,
        ip("10.244.1.0")
    );
    assert_eq!(d.entries.routes.len(), 3);
    assert_eq!(d.entries.fdb.len(), 2);
}

#[test]
fn without_our_own_node_object_nothing_is_changed() {
    let d = desire(&vxlan_cfg(), &snapshot(&vxlan_cluster()), &vxlan_local());
    let applied = as_applied(&d);
    let mut objects = vxlan_cluster();
    objects.remove(0);
    let blocked = desire(&vxlan_cfg(), &snapshot(&objects), &vxlan_local());
    assert!(blocked
        .blocked
        .as_deref()
        .unwrap()
        .contains("no Node object named \"a\""));
    assert_eq!(diff(&blocked, &applied).unwrap(), vec![]);
}

#[test]
fn a_changed_vtep_setting_recreates_the_device_and_reprograms_its_entries() {
    let d = desire(&vxlan_cfg(), &snapshot(&vxlan_cluster()), &vxlan_local());
    let mut applied = as_applied(&d);
    applied.vtep.as_mut().unwrap().vxlan.port = Some(4789);
    let ops = diff(&d, &applied).unwrap();
    assert_eq!(ops[0], Op::DeleteVtep);
    assert!(matches!(ops[1], Op::CreateVtep(_)));
    // The device took its neighbours, FDB entries and routes with it: all are added again.
    assert_eq!(ops.len(), 3 + 2 + 3 + 3);
    // Only the MTU wrong: just that.
    let mut applied = as_applied(&d);
    applied.vtep.as_mut().unwrap().mtu = 1500;
    assert_eq!(diff(&d, &applied).unwrap(), vec![Op::SetVtepMtu(1450)]);
}

#[test]
fn a_foreign_device_with_our_name_is_an_error_not_deleted() {
    let d = desire(&vxlan_cfg(), &snapshot(&vxlan_cluster()), &vxlan_local());
    let mut applied = as_applied(&d);
    applied.vtep.as_mut().unwrap().kind = Some("dummy".into());
    let e = diff(&d, &applied).unwrap_err();
    assert!(
        e.to_string()
            .contains("weir.1 exists and is not a vxlan device"),
        "{e}"
    );
}

#[test]
fn host_gw_routes_via_node_addresses_and_refuses_nodes_off_the_segment() {
    let objects = vec![
        node(
            "a",
            &["10.244.0.0/24", "fd00:10:244::/64"],
            &["10.0.1.10", "fd00:1::10"],
            None,
        ),
        node(
            "b",
            &["10.244.1.0/24", "fd00:10:244:1::/64"],
            &["10.0.1.11", "fd00:1::11"],
            None,
        ),
        node("c", &["10.244.2.0/24"], &["10.0.2.10"], None),
    ];
    let local = Local {
        addresses: vec![
            net("10.0.1.10/24"),
            net("fd00:1::10/64"),
            net("10.99.0.1/32"),
        ],
        underlay: None,
    };
    let cfg = Config::new("a", Backend::HostGw);
    let d = desire(&cfg, &snapshot(&objects), &local);
    assert_eq!(d.vtep, None);
    let direct = |gw: &str| RouteEntry {
        gateway: ip(gw),
        via_vtep: false,
    };
    assert_eq!(d.entries.routes.len(), 2, "{:?}", d.entries.routes);
    assert_eq!(d.entries.routes[&net("10.244.1.0/24")], direct("10.0.1.11"));
    assert_eq!(
        d.entries.routes[&net("fd00:10:244:1::/64")],
        direct("fd00:1::11")
    );
    assert!(d.entries.neighbours.is_empty() && d.entries.fdb.is_empty());
    match &d.status["c"] {
        NodeStatus::Refused { reasons, routed } => {
            assert!(routed.is_empty());
            assert!(
                reasons[0].contains("10.0.2.10 is not on a directly connected subnet"),
                "{reasons:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        d.status["b"],
        NodeStatus::Routed {
            pod_cidrs: vec![net("10.244.1.0/24"), net("fd00:10:244:1::/64")]
        }
    );
    // A host route (/32) connects nothing.
    assert!(!local.connected(ip("10.99.0.1")));
}

#[test]
fn flannel_backend_data_parses_and_renders_in_flannel_shape() {
    let v = VtepData::parse(r#"{"VNI":1,"VtepMAC":"52:c3:57:d4:e0:f1"}"#).unwrap();
    assert_eq!(
        (v.vni, format_mac(&v.mac)),
        (Some(1), "52:c3:57:d4:e0:f1".to_string())
    );
    assert_eq!(v.render(), r#"{"VNI":1,"VtepMAC":"52:c3:57:d4:e0:f1"}"#);
    // Older flannel omits the VNI.
    assert_eq!(
        VtepData::parse(r#"{"VtepMAC":"22:f8:75:bb:da:4e"}"#)
            .unwrap()
            .vni,
        None
    );
    assert!(VtepData::parse(r#"{"VtepMAC":"01:00:5e:00:00:01"}"#)
        .unwrap_err()
        .contains("unicast"));
    assert!(VtepData::parse("nope").is_err());
}

#[test]
fn broken_annotations_are_reported_per_node() {
    let mut objects = vxlan_cluster();
    if let Object::Node(n) = &mut objects[1] {
        let n = std::sync::Arc::make_mut(n);
        n.annotations.insert(
            "weir.dev/backend-data".into(),
            "{\"VtepMAC\":\"zz\"}".into(),
        );
    }
    let d = desire(&vxlan_cfg(), &snapshot(&objects), &vxlan_local());
    let NodeStatus::Refused { reasons, .. } = &d.status["b"] else {
        panic!()
    };
    assert!(
        reasons.iter().any(|r| r.contains("VtepMAC \"zz\"")),
        "{reasons:?}"
    );
    assert!(matches!(d.status["c"], NodeStatus::Routed { .. }));
}

#[test]
fn vtep_mac_is_stable_unicast_and_per_node() {
    let m = vtep_mac("a", 1);
    assert_eq!(m, vtep_mac("a", 1));
    assert_ne!(m, vtep_mac("b", 1));
    assert_eq!(m[0] & 0x03, 0x02, "locally administered unicast");
}
