mod common;
use common::*;
use proptest::prelude::*;
use weir_model::*;

#[test]
fn diff_reports_added_removed_changed_service_ports() {
    let cfg = config();
    let old = plan(
        &snapshot(&["nodes.yaml", "basic.yaml", "conditions.yaml"]),
        &cfg,
    );
    // Remove conditions.yaml's services, add lb.yaml's, change web's endpoints.
    let mut snap = snapshot(&["nodes.yaml", "basic.yaml", "lb.yaml"]);
    snap.endpoint_slices
        .remove(&("shop".into(), "web-2".into()));
    let new = plan(&snap, &cfg);
    let d = old.diff(&new);
    let names =
        |it: Vec<&ServicePortKey>| it.into_iter().map(|k| k.to_string()).collect::<Vec<_>>();
    assert_eq!(
        names(d.removed.keys().collect()),
        [
            "default/dead/tcp/v4",
            "default/draining/tcp/v4",
            "default/draining-nil/tcp/v4",
            "default/empty/tcp/v4",
            "default/mixed/tcp/v4"
        ]
    );
    assert_eq!(
        names(d.added.keys().collect()),
        [
            "default/lb:https/tcp/v4",
            "default/lb-strict/tcp/v4",
            "default/sticky/tcp/v4"
        ]
    );
    assert_eq!(
        names(d.changed.keys().collect()),
        ["shop/web:http/tcp/v4", "shop/web:metrics/tcp/v4"]
    );
    let c = &d.changed[&tcp4("shop", "web", "http")];
    assert_eq!(c.old.cluster_endpoints.len(), 3);
    assert_eq!(c.new.cluster_endpoints.len(), 2);
    assert!(!d.globals_changed);
    let mut applied = old.clone();
    applied.apply(&d);
    assert_eq!(applied, new);
    assert!(new.diff(&new).is_empty());
}

#[test]
fn diff_flags_global_changes() {
    let snap = snapshot(&["nodes.yaml", "basic.yaml"]);
    let old = plan(&snap, &config());
    let new = plan(
        &snap,
        &ProxyConfig {
            nodeport_addresses: vec!["0.0.0.0/0".parse().unwrap()],
            ..config()
        },
    );
    let d = old.diff(&new);
    assert!(d.globals_changed);
    assert!(d.touched().is_empty());
    let mut applied = old.clone();
    applied.apply(&d);
    assert_eq!(applied, new);
}

fn arb_endpoint() -> impl Strategy<Value = Endpoint> {
    (0u8..4, prop::bool::ANY, prop::bool::ANY).prop_map(|(last, local, ready)| Endpoint {
        ip: format!("10.244.0.{last}").parse().unwrap(),
        port: 8080,
        is_local: local,
        ready,
        serving: ready,
        terminating: false,
    })
}

fn arb_sp() -> impl Strategy<Value = ServicePortPlan> {
    (
        prop::sample::select(vec![80u16, 443]),
        prop::collection::vec(arb_endpoint(), 0..3),
        prop::option::of(prop::sample::select(vec![60u32, 10800])),
        prop::bool::ANY,
    )
        .prop_map(|(port, eps, aff, etp)| ServicePortPlan {
            port,
            frontends: vec![Frontend {
                kind: FrontendKind::ClusterIp,
                addr: Some("10.96.0.1".parse().unwrap()),
                port,
                endpoints: EndpointSet::Cluster,
                verdict: if eps.is_empty() {
                    Verdict::Reject
                } else {
                    Verdict::Forward
                },
                masquerade: Masquerade::OffCluster,
                short_circuit: false,
                source_ranges: None,
            }],
            has_any_endpoints: !eps.is_empty(),
            cluster_endpoints: eps,
            local_endpoints: vec![],
            affinity_timeout: aff,
            internal_policy_local: false,
            external_policy_local: etp,
            health_check_node_port: None,
            topology: TopologyMode::None,
        })
}

fn arb_plan() -> impl Strategy<Value = Plan> {
    let key = (
        prop::sample::select(vec!["a", "b"]),
        prop::sample::select(vec!["x", "y", "z"]),
        prop::sample::select(vec![Protocol::Tcp, Protocol::Udp]),
        prop::sample::select(vec![IpFamily::V4, IpFamily::V6]),
    )
        .prop_map(|(ns, n, p, f)| key(ns, n, "", p, f));
    (
        prop::collection::btree_map(key, arb_sp(), 0..8),
        prop::bool::ANY,
        prop::bool::ANY,
    )
        .prop_map(|(services, masq, np)| Plan {
            services: services
                .into_iter()
                .map(|(k, v)| (k, std::sync::Arc::new(v)))
                .collect(),
            masquerade_all: masq,
            node_port_addresses_v4: if np {
                NodePortAddresses::AllLocal
            } else {
                NodePortAddresses::None
            },
            ..Default::default()
        })
}

proptest! {
    #[test]
    fn applying_the_diff_yields_the_new_plan(old in arb_plan(), new in arb_plan()) {
        let d = old.diff(&new);
        let mut applied = old.clone();
        applied.apply(&d);
        prop_assert_eq!(&applied, &new);
        prop_assert!(old.diff(&old).is_empty());
        prop_assert_eq!(d.is_empty(), old == new);
        // Every touched key really differs, and every differing key is touched.
        for k in old.services.keys().chain(new.services.keys()) {
            let differs = old.services.get(k) != new.services.get(k);
            prop_assert_eq!(differs, d.touched().contains(k));
        }
    }
}
