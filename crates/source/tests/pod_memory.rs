//! Heap a Pod holds in the store, as DNS keeps it and as `weir policy` keeps it (labels,
//! node, named ports besides the address), counted by a counting allocator over 10,000 pods
//! of a common shape. DNS's pods must not grow because policy reads more of them.
//!
//! One test in this file: the counter is process-wide.

use std::collections::BTreeMap;

use weir_model::k8s_openapi::api::core::v1::{
    Container, ContainerPort, Pod, PodIP, PodSpec, PodStatus,
};
use weir_model::{Kind, Object, PodForPolicy};
use weir_source::{Event, Store};

mod counting;
use counting::live;

const PODS: usize = 10_000;

/// A Deployment's pod: four labels (app, tier, version, pod-template-hash), one container
/// with two named ports, one IPv4 address, on one of 100 nodes in one of 100 namespaces.
fn pod(i: usize) -> Pod {
    let app = format!("app-{}", i % 500);
    let mut p = Pod::default();
    p.metadata.name = Some(format!("{app}-7d9f8c6b5-{i:05}"));
    p.metadata.namespace = Some(format!("team-{}", i % 100));
    p.metadata.labels = Some(BTreeMap::from([
        ("app".to_string(), app.clone()),
        ("tier".to_string(), "backend".to_string()),
        ("version".to_string(), "v2".to_string()),
        ("pod-template-hash".to_string(), "7d9f8c6b5".to_string()),
    ]));
    let port = |name: &str, n: i32| ContainerPort {
        name: Some(name.into()),
        container_port: n,
        protocol: Some("TCP".into()),
        ..Default::default()
    };
    p.spec = Some(PodSpec {
        node_name: Some(format!("node-{}", i % 100)),
        containers: vec![Container {
            name: "main".into(),
            ports: Some(vec![port("http", 8080), port("metrics", 9090)]),
            ..Default::default()
        }],
        ..Default::default()
    });
    p.status = Some(PodStatus {
        phase: Some("Running".into()),
        pod_ips: Some(vec![PodIP {
            ip: format!("10.{}.{}.{}", 1 + i / 65536, (i / 256) % 256, i % 256),
        }]),
        ..Default::default()
    });
    p
}

/// Bytes per pod in the store after a first list.
fn per_pod(policy: bool) -> isize {
    let base = live();
    let mut store = Store::new();
    let list: Vec<Object> = (0..PODS)
        .map(|i| {
            let p = pod(i);
            if policy {
                PodForPolicy(p).into()
            } else {
                p.into()
            }
        })
        .collect();
    store.apply(Event::Listed(Kind::Pod, list));
    let held = live() - base;
    assert_eq!(store.len(), PODS);
    held / PODS as isize
}

/// Measured when set: DNS 207 bytes per pod (199 before the policy part existed: it costs
/// DNS's pods one `None` pointer), policy 634 (about 6 MiB for 10,000 pods; 1,146 while
/// labels and named ports were B-trees, whose nodes are sized for eleven entries).
const BOUND_DNS: isize = 240;
const BOUND_POLICY: isize = 750;

#[test]
fn dns_pods_stay_lean_and_policy_pods_are_bounded() {
    let dns = per_pod(false);
    let policy = per_pod(true);
    eprintln!("store per pod: DNS {dns} bytes, policy {policy} bytes ({PODS} pods)");
    assert!(
        dns <= BOUND_DNS,
        "DNS pods: {dns} bytes each (bound {BOUND_DNS})"
    );
    assert!(
        policy <= BOUND_POLICY,
        "policy pods: {policy} bytes each (bound {BOUND_POLICY})"
    );
}
