//! Conversion: the API's defaults, every field read, and each malformed input's warning and
//! safe outcome. (The oracle reads converted objects too, so these are checked here.)

use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::json;

use super::*;
use crate::warning::Outcome;

fn policy(spec: serde_json::Value) -> (PolicyInfo, Vec<Warning>) {
    let o: NetworkPolicy = serde_json::from_value(json!({
        "metadata": {"namespace": "shop", "name": "p"},
        "spec": spec,
    }))
    .unwrap();
    let mut warnings = Vec::new();
    (PolicyInfo::convert(&o, &mut warnings), warnings)
}

fn fields(warnings: &[Warning]) -> Vec<(String, Outcome)> {
    warnings
        .iter()
        .map(|w| (w.field.clone(), w.outcome))
        .collect()
}

#[test]
fn policy_types_default_as_the_api_does() {
    let (p, w) = policy(json!({"podSelector": {}}));
    assert!(w.is_empty());
    assert!(p.isolates_ingress && !p.isolates_egress);
    // `egress: []` has no rules: still Ingress only.
    let (p, _) = policy(json!({"podSelector": {}, "egress": []}));
    assert!(p.isolates_ingress && !p.isolates_egress);
    let (p, _) = policy(json!({"podSelector": {}, "egress": [{}]}));
    assert!(p.isolates_ingress && p.isolates_egress);
    assert_eq!(
        p.egress,
        [Rule {
            peers: Peers::Any,
            ports: Ports::Any
        }]
    );
    let (p, _) = policy(json!({"policyTypes": ["Egress"], "ingress": [{}]}));
    assert!(!p.isolates_ingress && p.isolates_egress);
    assert!(
        p.rules(Direction::Ingress).is_empty(),
        "ingress rules of an Egress-only policy"
    );
    let (p, w) = policy(json!({"policyTypes": ["egress"]}));
    assert!(p.isolates_ingress && p.isolates_egress);
    assert_eq!(
        fields(&w),
        [(
            "spec.policyTypes[0]".into(),
            Outcome::PolicyIsolatesBothDirections
        )]
    );
}

#[test]
fn peers_and_ports_are_read_in_full() {
    let (p, w) = policy(json!({
        "podSelector": {"matchLabels": {"app": "web"}},
        "ingress": [{
            "from": [
                {"podSelector": {"matchLabels": {"app": "lb"}}},
                {"namespaceSelector": {}},
                {"namespaceSelector": {"matchLabels": {"team": "x"}}, "podSelector": {}},
                {"ipBlock": {"cidr": "10.0.0.5/8", "except": ["10.1.0.0/16"]}},
            ],
            "ports": [
                {"port": 80},
                {"protocol": "UDP", "port": 53, "endPort": 60},
                {"protocol": "SCTP"},
                {"port": "http"},
            ],
        }],
    }));
    assert!(w.is_empty(), "{w:?}");
    let rule = &p.ingress[0];
    let Peers::Only(peers) = &rule.peers else {
        panic!()
    };
    let web =
        Selector::parse(&serde_json::from_value(json!({"matchLabels": {"app": "lb"}})).unwrap())
            .unwrap();
    assert_eq!(
        peers[0],
        Peer::Pods {
            namespaces: NamespaceScope::Own,
            pods: web
        }
    );
    assert_eq!(
        peers[1],
        Peer::Pods {
            namespaces: NamespaceScope::Matching(Selector::everything()),
            pods: Selector::everything()
        }
    );
    assert!(
        matches!(&peers[2], Peer::Pods { namespaces: NamespaceScope::Matching(s), pods } if !s.selects_everything() && pods.selects_everything())
    );
    let Peer::Block(block) = &peers[3] else {
        panic!()
    };
    assert_eq!(block.cidr.to_string(), "10.0.0.0/8", "host bits cleared");
    assert!(block.contains("10.2.0.1".parse().unwrap()));
    assert!(!block.contains("10.1.0.1".parse().unwrap()));
    let Ports::Only(ports) = &rule.ports else {
        panic!()
    };
    let want = [
        PortSpec {
            protocol: Protocol::Tcp,
            port: PortSelector::Range(80, 80),
        },
        PortSpec {
            protocol: Protocol::Tcp,
            port: PortSelector::Named("http".into()),
        },
        PortSpec {
            protocol: Protocol::Udp,
            port: PortSelector::Range(53, 60),
        },
        PortSpec {
            protocol: Protocol::Sctp,
            port: PortSelector::All,
        },
    ];
    assert_eq!(ports, &want);
}

#[test]
fn malformed_parts_allow_nothing_and_name_the_field() {
    let (p, w) = policy(json!({
        "podSelector": {},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [{
            "from": [
                {"ipBlock": {"cidr": "10.0.0.0/33"}},
                {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["ten"]}},
                {},
                {"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}},
                {"podSelector": {"matchExpressions": [{"key": "a", "operator": "Equals", "values": ["b"]}]}},
                {"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
            ],
        }],
        "egress": [{
            "ports": [
                {"protocol": "ICMP", "port": 1},
                {"port": "Not_A_Name"},
                {"port": "80"},
                {"port": 0},
                {"port": 90, "endPort": 80},
                {"port": "http", "endPort": 90},
                {"endPort": 90},
            ],
        }],
    }));
    assert_eq!(
        p.ingress,
        [Rule {
            peers: Peers::Only(vec![]),
            ports: Ports::Any
        }]
    );
    // Every port entry unreadable: the rule allows nothing, not every port.
    assert_eq!(
        p.egress,
        [Rule {
            peers: Peers::Any,
            ports: Ports::Only(vec![])
        }]
    );
    let peer = Outcome::PeerAllowsNothing;
    let port = Outcome::PortAllowsNothing;
    assert_eq!(
        fields(&w),
        [
            ("spec.ingress[0].from[0].ipBlock.cidr".into(), peer),
            ("spec.ingress[0].from[1].ipBlock.except[0]".into(), peer),
            ("spec.ingress[0].from[2]".into(), peer),
            ("spec.ingress[0].from[3]".into(), peer),
            ("spec.ingress[0].from[4].podSelector".into(), peer),
            ("spec.ingress[0].from[5].namespaceSelector".into(), peer),
            ("spec.egress[0].ports[0].protocol".into(), port),
            ("spec.egress[0].ports[1].port".into(), port),
            ("spec.egress[0].ports[2].port".into(), port),
            ("spec.egress[0].ports[3].port".into(), port),
            ("spec.egress[0].ports[4].endPort".into(), port),
            ("spec.egress[0].ports[5].endPort".into(), port),
            ("spec.egress[0].ports[6].endPort".into(), port),
        ]
    );
    assert_eq!(
        w[0].to_string(),
        "NetworkPolicy shop/p: spec.ingress[0].from[0].ipBlock.cidr: invalid CIDR \"10.0.0.0/33\": this peer allows nothing"
    );
}

#[test]
fn an_unreadable_pod_selector_isolates_the_namespace_and_allows_nothing() {
    let (p, w) = policy(json!({
        "podSelector": {"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["x"]}]},
        "policyTypes": ["Egress"],
        "egress": [{}],
    }));
    assert_eq!(
        fields(&w),
        [("spec.podSelector".into(), Outcome::PolicyIsolatesNamespace)]
    );
    assert!(p.pod_selector.selects_everything());
    assert!(p.isolates_egress && !p.isolates_ingress);
    assert!(p.egress.is_empty() && p.ingress.is_empty());
}

#[test]
fn pods_keep_addresses_ports_and_state() {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"namespace": "shop", "name": "web-0", "labels": {"app": "web"}},
        "spec": {
            "nodeName": "n1",
            "containers": [
                {"name": "a", "ports": [
                    {"name": "http", "containerPort": 8080},
                    {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                    {"name": "Bad_Name", "containerPort": 81},
                    {"name": "odd", "containerPort": 82, "protocol": "XTP"},
                ]},
                {"name": "b", "ports": [{"name": "http", "containerPort": 8081}]},
            ],
            "initContainers": [{"name": "side", "ports": [{"name": "metrics", "containerPort": 9090}]}],
        },
        "status": {"phase": "Running", "podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}, {"ip": "fd00::5"}, {"ip": "x"}]},
    }))
    .unwrap();
    let mut w = Vec::new();
    let info = PodInfo::convert(&pod, &mut w);
    let ips: Vec<IpAddr> = vec!["10.0.0.5".parse().unwrap(), "fd00::5".parse().unwrap()];
    assert_eq!(info.ips, ips);
    assert_eq!(info.node.as_deref(), Some("n1"));
    assert!(info.is_policy_pod());
    assert_eq!(info.named_port("dns", Protocol::Udp), Some(53));
    assert_eq!(info.named_port("dns", Protocol::Tcp), None);
    assert_eq!(info.named_port("metrics", Protocol::Tcp), Some(9090));
    assert_eq!(
        info.named_port("http", Protocol::Tcp),
        None,
        "8080 and 8081: ambiguous"
    );
    assert_eq!(
        fields(&w),
        [
            ("status.podIPs[2].ip".into(), Outcome::Ignored),
            ("spec.containers[0].ports[2].name".into(), Outcome::Ignored),
            (
                "spec.containers[0].ports[3].protocol".into(),
                Outcome::Ignored
            ),
            (
                "spec.containers[1].ports[0]".into(),
                Outcome::NamedPortUnresolved
            ),
        ]
    );

    let done: Pod = serde_json::from_value(json!({
        "metadata": {"namespace": "shop", "name": "job"},
        "spec": {"containers": [], "hostNetwork": true},
        "status": {"phase": "Succeeded", "podIP": "10.0.0.6"},
    }))
    .unwrap();
    let info = PodInfo::convert(&done, &mut w);
    assert!(info.host_network && info.terminated && !info.is_live() && !info.is_policy_pod());
}

#[test]
fn namespaces_always_carry_their_name_label() {
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "shop", "labels": {"team": "x"}}}))
            .unwrap();
    let info = NamespaceInfo::from(&ns);
    assert_eq!(info.labels.get(LABEL_NAMESPACE_NAME), Some("shop"));
    let cluster = Cluster::default();
    assert_eq!(
        cluster.namespace_labels("unseen").get(LABEL_NAMESPACE_NAME),
        Some("unseen")
    );
}

#[test]
fn iana_service_names() {
    for good in ["http", "h2c", "a-b", "x1", "abcdefghijklmno"] {
        assert!(is_iana_service_name(good), "{good}");
    }
    for bad in [
        "",
        "80",
        "Http",
        "a_b",
        "-a",
        "a-",
        "a--b",
        "abcdefghijklmnop",
    ] {
        assert!(!is_iana_service_name(bad), "{bad}");
    }
}
