//! Per-event planning equals planning from scratch: after any sequence of object events
//! (applied, changed, relabelled, deleted; this node's Node appearing and moving), the
//! incremental [`Planner::apply`] gives exactly [`plan`] of the objects then standing.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeAddress, NodeSpec, NodeStatus, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::api::discovery::v1::{
    Endpoint as K8sEndpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice,
    ForZone,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use proptest::prelude::*;
use weir_model::*;

const SERVICES: [&str; 3] = ["a", "b", "c"];
const NODES: [&str; 2] = ["node-a", "node-b"];

fn meta(ns: &str, name: &str, labels: Option<(&str, &str)>) -> ObjectMeta {
    ObjectMeta {
        namespace: (!ns.is_empty()).then(|| ns.to_string()),
        name: Some(name.to_string()),
        labels: labels.map(|(k, v)| BTreeMap::from([(k.to_string(), v.to_string())])),
        ..Default::default()
    }
}

/// A service of a few shapes: plain, NodePort with eTP Local, headless, ExternalName,
/// invalid clusterIP, two ports one with a bad protocol.
fn service(name: &str, shape: u8, ip: u8) -> Service {
    let mut spec = ServiceSpec {
        cluster_ips: Some(vec![format!("10.96.0.{ip}")]),
        ports: Some(vec![ServicePort {
            name: Some("http".into()),
            port: 80,
            ..Default::default()
        }]),
        ..Default::default()
    };
    match shape % 6 {
        1 => {
            spec.type_ = Some("NodePort".into());
            spec.external_traffic_policy = Some("Local".into());
            spec.health_check_node_port = Some(30999);
            spec.ports.as_mut().unwrap()[0].node_port = Some(30080 + i32::from(ip));
        }
        2 => spec.cluster_ips = Some(vec!["None".into()]),
        3 => {
            spec.type_ = Some("ExternalName".into());
            spec.external_name = Some("example.com".into());
        }
        4 => spec.cluster_ips = Some(vec!["not-an-ip".into()]),
        5 => spec.ports.as_mut().unwrap().push(ServicePort {
            name: Some("odd".into()),
            port: 81,
            protocol: Some("XTP".into()),
            ..Default::default()
        }),
        _ => {}
    }
    Service {
        metadata: meta("ns", name, None),
        spec: Some(spec),
        status: None,
    }
}

/// A slice labelled for `owner` (or unlabelled), with endpoints on either node, some not
/// ready, some with zone hints, some with a bad address.
fn slice(name: &str, owner: Option<&str>, eps: &[(u8, u8)]) -> EndpointSlice {
    EndpointSlice {
        metadata: meta("ns", name, owner.map(|o| ("kubernetes.io/service-name", o))),
        address_type: "IPv4".into(),
        ports: Some(vec![EndpointPort {
            name: Some("http".into()),
            port: Some(8080),
            ..Default::default()
        }]),
        endpoints: Some(
            eps.iter()
                .map(|&(host, flags)| K8sEndpoint {
                    addresses: vec![if flags % 7 == 6 {
                        "bogus".to_string()
                    } else {
                        format!("10.244.0.{host}")
                    }],
                    node_name: Some(NODES[usize::from(flags % 2)].into()),
                    conditions: Some(EndpointConditions {
                        ready: Some(flags % 3 != 0),
                        serving: Some(true),
                        terminating: Some(flags % 3 == 0),
                    }),
                    hints: (flags % 5 == 0).then(|| EndpointHints {
                        for_zones: Some(vec![ForZone {
                            name: "zone-a".into(),
                        }]),
                        for_nodes: None,
                    }),
                    ..Default::default()
                })
                .collect(),
        ),
    }
}

fn node(name: &str, ip: u8, zone: bool) -> Node {
    Node {
        metadata: meta(
            "",
            name,
            zone.then_some(("topology.kubernetes.io/zone", "zone-a")),
        ),
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".into(),
                address: format!("192.168.0.{ip}"),
            }]),
            ..Default::default()
        }),
    }
}

#[derive(Debug, Clone)]
enum Ev {
    Service(usize, u8, u8),
    DeleteService(usize),
    Slice(usize, Option<usize>, Vec<(u8, u8)>),
    DeleteSlice(usize),
    Node(usize, u8, bool),
    DeleteNode(usize),
    /// Plan now (the incremental planner sees the events since the last plan as one batch).
    Sync,
}

fn event() -> impl Strategy<Value = Ev> {
    prop_oneof![
        (0..3usize, any::<u8>(), 1..4u8).prop_map(|(s, shape, ip)| Ev::Service(s, shape, ip)),
        (0..3usize).prop_map(Ev::DeleteService),
        (
            0..4usize,
            proptest::option::weighted(0.8, 0..3usize),
            proptest::collection::vec((1..6u8, any::<u8>()), 0..4)
        )
            .prop_map(|(i, owner, eps)| Ev::Slice(i, owner, eps)),
        (0..4usize).prop_map(Ev::DeleteSlice),
        (0..2usize, 1..3u8, any::<bool>()).prop_map(|(n, ip, z)| Ev::Node(n, ip, z)),
        (0..2usize).prop_map(Ev::DeleteNode),
        Just(Ev::Sync),
    ]
}

fn to_change(ev: &Ev) -> Option<(ObjectKey, Option<Object>)> {
    let slice_name = |i: usize| format!("slice-{i}");
    Some(match ev {
        Ev::Service(i, shape, ip) => {
            let o: Object = service(SERVICES[*i], *shape, *ip).into();
            (o.key(), Some(o))
        }
        Ev::DeleteService(i) => (ObjectKey::new(Kind::Service, "ns", SERVICES[*i]), None),
        Ev::Slice(i, owner, eps) => {
            let o: Object = slice(&slice_name(*i), owner.map(|o| SERVICES[o]), eps).into();
            (o.key(), Some(o))
        }
        Ev::DeleteSlice(i) => (
            ObjectKey::new(Kind::EndpointSlice, "ns", slice_name(*i)),
            None,
        ),
        Ev::Node(n, ip, zone) => {
            let o: Object = node(NODES[*n], *ip, *zone).into();
            (o.key(), Some(o))
        }
        Ev::DeleteNode(n) => (ObjectKey::new(Kind::Node, "", NODES[*n]), None),
        Ev::Sync => return None,
    })
}

fn config() -> ProxyConfig {
    ProxyConfig {
        node_name: "node-a".into(),
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        ..Default::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn incremental_planning_equals_planning_from_scratch(
        events in proptest::collection::vec(event(), 1..40)
    ) {
        let cfg = config();
        let mut incremental = Planner::default();
        let mut world = Snapshot::default();
        let mut batch = Vec::new();
        // The plan before the last update, and every update's diff composed since the start.
        let mut previous = Plan::default();
        let mut composed = PlanDiff::default();
        for ev in events.iter().chain([&Ev::Sync]) {
            match to_change(ev) {
                Some((key, object)) => {
                    match &object {
                        Some(o) => world.insert(o.clone()),
                        None => {
                            world.remove(&key);
                        }
                    }
                    batch.push((key, object));
                }
                None => {
                    let diff = incremental.update(std::mem::take(&mut batch), &cfg);
                    let got = incremental.current().clone();
                    prop_assert_eq!(&got, &plan(&world, &cfg), "after {:?}", ev);
                    // The diff found while replanning is the diff of the whole plans, and
                    // applying it to the old plan gives the new one.
                    prop_assert_eq!(&diff, &previous.diff(&got), "diff after {:?}", ev);
                    let mut applied = previous.clone();
                    applied.apply(&diff);
                    prop_assert_eq!(&applied, &got);
                    composed = composed.then(diff);
                    previous = got;
                }
            }
        }
        // The diffs composed one after the other are the diff from nothing to the end (what a
        // consumer that missed every sync in between needs).
        let end = incremental.current().clone();
        let (_, composed_services) = composed.sides();
        prop_assert_eq!(&composed_services.services, &end.services);
        let mut from_empty = Plan::default();
        from_empty.apply(&composed);
        prop_assert_eq!(&from_empty, &end);
        // And the whole-snapshot entry point, fed the same world, agrees and changes nothing.
        let mut whole = Planner::default();
        let first = whole.plan(&world, &cfg);
        prop_assert_eq!(&first, &incremental.apply(Vec::new(), &cfg));
        prop_assert!(first.diff(&whole.plan(&world, &cfg)).is_empty());
    }
}

/// A change to one service replans that service only: every other service port keeps its
/// `Arc` (so the backend's diff sees them unchanged by pointer).
#[test]
fn an_endpoint_change_replans_only_its_service() {
    let cfg = config();
    let mut planner = Planner::default();
    let mut changes = Vec::new();
    for (i, s) in SERVICES.iter().enumerate() {
        let svc: Object = service(s, 0, i as u8 + 1).into();
        let sl: Object = slice(&format!("slice-{i}"), Some(s), &[(i as u8 + 1, 1)]).into();
        changes.push((svc.key(), Some(svc)));
        changes.push((sl.key(), Some(sl)));
    }
    let before = planner.apply(changes, &cfg);
    assert_eq!(before.services.len(), 3);
    let sl: Object = slice("slice-1", Some("b"), &[(9, 1)]).into();
    let after = planner.apply([(sl.key(), Some(sl))], &cfg);
    let replaced: Vec<String> = after
        .services
        .iter()
        .filter(|(k, v)| !std::sync::Arc::ptr_eq(v, &before.services[*k]))
        .map(|(k, _)| k.name.to_string())
        .collect();
    assert_eq!(replaced, vec!["b".to_string()]);
}

/// The compact objects hold what Kubernetes objects carry for weir, and a Kubernetes object
/// made from one (the manifest source's last-known-good copy) converts back to the same.
#[test]
fn compact_objects_round_trip_through_kubernetes_objects() {
    let objects: Vec<Object> = vec![
        service("a", 1, 1).into(),
        service("b", 2, 2).into(),
        service("c", 3, 3).into(),
        service("a", 5, 1).into(),
        slice("s", Some("a"), &[(1, 0), (2, 5), (3, 6)]).into(),
        slice("u", None, &[]).into(),
        node("node-a", 1, true).into(),
    ];
    for o in objects {
        let back: Object = match &o {
            Object::Service(s) => Service::from(&**s).into(),
            Object::EndpointSlice(s) => EndpointSlice::from(&**s).into(),
            Object::Node(n) => Node::from(&**n).into(),
            Object::Pod(p) => k8s_openapi::api::core::v1::Pod::from(&**p).into(),
            Object::Namespace(_) | Object::NetworkPolicy(_) => continue,
        };
        assert_eq!(back, o);
    }
}
