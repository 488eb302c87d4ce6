//! The generated cluster, as Kubernetes objects (JSON) for the fake API server: 1,000
//! namespaces, 10 pods and 10 NetworkPolicies each (the shapes of crates/policy/tests/scale.rs:
//! default deny, app to app by named port, from other teams' namespaces, a CIDR with an
//! exception, DNS egress by named port, egress to an app in every namespace, same-namespace
//! ingress with egress to the outside), the pods spread round-robin over `nodes` nodes; and the
//! two bench pods with the policies that select them for the connection-rate phase.

use serde_json::{json, Value};
use weir_fakeapi::FakeApi;
use weir_model::k8s_openapi::api::core::v1::{Namespace, Pod};
use weir_model::k8s_openapi::api::networking::v1::NetworkPolicy;

pub const NAMESPACES: usize = 1_000;
pub const PODS_PER_NAMESPACE: usize = 10;
pub const POLICIES_PER_NAMESPACE: usize = 10;
/// The node the agent enforces for; pod `id` lives on node `id % nodes`.
pub const NODE: &str = "node-0";

pub const CLIENT_NS: &str = "bench-client";
pub const SERVER_NS: &str = "bench-server";
pub const CLIENT_IP: &str = "10.250.1.2";
pub const SERVER_IP: &str = "10.250.2.2";
/// The server pod's connection-rate port.
pub const CONN_PORT: u16 = 9091;

pub fn apply(api: &FakeApi, v: Value) -> Result<(), String> {
    let r = match v["kind"].as_str() {
        Some("Namespace") => serde_json::from_value::<Namespace>(v)
            .map_err(|e| e.to_string())
            .map(|o| api.apply(&o)),
        Some("Pod") => serde_json::from_value::<Pod>(v)
            .map_err(|e| e.to_string())
            .map(|o| api.apply(&o)),
        Some("NetworkPolicy") => serde_json::from_value::<NetworkPolicy>(v)
            .map_err(|e| e.to_string())
            .map(|o| api.apply(&o)),
        other => return Err(format!("kind {other:?}")),
    };
    r?.map_err(|e| format!("{e:#}"))
}

fn namespace(name: &str, labels: Value) -> Value {
    let mut labels = labels;
    labels["kubernetes.io/metadata.name"] = name.into();
    json!({"apiVersion": "v1", "kind": "Namespace",
           "metadata": {"name": name, "labels": labels}})
}

fn pod_ip(id: usize) -> String {
    format!("10.{}.{}.{}", id / 65536, (id / 256) % 256, id % 256)
}

/// Pod `i` of namespace `n` (`app` overrides its app label: the label changes).
pub fn pod(n: usize, i: usize, nodes: usize, app: Option<&str>) -> Value {
    let id = n * PODS_PER_NAMESPACE + i;
    let mut ips = vec![json!({"ip": pod_ip(id)})];
    if id.is_multiple_of(5) {
        ips.push(json!({"ip": format!("fd00::{id:x}")}));
    }
    let default_app = format!("a{}", i % 5);
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("pod-{i}"), "namespace": format!("ns-{n}"),
                     "labels": {"app": app.unwrap_or(&default_app),
                                "tier": if i.is_multiple_of(2) { "fe" } else { "be" }}},
        "spec": {"nodeName": format!("node-{}", id % nodes),
                 "containers": [{"name": "app", "ports": [
                     {"name": "http", "containerPort": 8080 + (i % 3), "protocol": "TCP"},
                     {"name": "dns", "containerPort": 53, "protocol": "UDP"}]}]},
        "status": {"phase": "Running", "podIP": pod_ip(id), "podIPs": ips},
    })
}

fn equals(key: &str, value: &str) -> Value {
    json!({"matchLabels": {key: value}})
}

/// Policy `j` of namespace `n`; `wide` widens policy 5's port to a range (the policy
/// changes).
pub fn policy(n: usize, j: usize, wide: bool) -> Value {
    let app = equals("app", &format!("a{}", j % 5));
    let http = json!([{"protocol": "TCP", "port": "http"}]);
    let spec = match j {
        0 => json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
        1 | 2 => json!({"podSelector": app, "policyTypes": ["Ingress"], "ingress": [{
            "from": [{"podSelector": equals("app", &format!("a{}", (j + 1) % 5))}],
            "ports": http}]}),
        3 | 4 => json!({"podSelector": app, "policyTypes": ["Ingress"], "ingress": [{
            "from": [{"namespaceSelector": equals("team", &format!("t{}", (n + j) % 20)),
                      "podSelector": equals("tier", "fe")}],
            "ports": [{"protocol": "TCP", "port": 8000, "endPort": 8100}]}]}),
        5 => {
            let port = if wide {
                json!({"protocol": "TCP", "port": 443, "endPort": 444})
            } else {
                json!({"protocol": "TCP", "port": 443})
            };
            json!({"podSelector": equals("tier", "fe"), "policyTypes": ["Ingress"], "ingress": [{
                "from": [{"ipBlock": {"cidr": "192.168.0.0/16", "except": ["192.168.1.0/24"]}}],
                "ports": [port]}]})
        }
        6 => json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"], "egress": [{
            "to": [{"namespaceSelector": equals("kubernetes.io/metadata.name", "ns-0")}],
            "ports": [{"protocol": "UDP", "port": "dns"}]}]}),
        7 => json!({"podSelector": app, "policyTypes": ["Ingress", "Egress"], "egress": [{
            "to": [{"namespaceSelector": {}, "podSelector": equals("app", "a1")}],
            "ports": http}]}),
        _ => json!({"podSelector": app, "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": {}}]}],
            "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}}]}]}),
    };
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"name": format!("pol-{j}"), "namespace": format!("ns-{n}")},
           "spec": spec})
}

/// Every object of the generated cluster.
pub fn objects(nodes: usize) -> impl Iterator<Item = Value> {
    (0..NAMESPACES).flat_map(move |n| {
        let ns = namespace(&format!("ns-{n}"), json!({"team": format!("t{}", n % 20)}));
        let pods = (0..PODS_PER_NAMESPACE).map(move |i| pod(n, i, nodes, None));
        let policies = (0..POLICIES_PER_NAMESPACE).map(move |j| policy(n, j, false));
        std::iter::once(ns).chain(pods).chain(policies)
    })
}

/// Namespaces whose pod 0 is on [`NODE`]: the pods the changes relabel and whose policies
/// they edit.
pub fn local_namespaces(nodes: usize) -> Vec<usize> {
    (0..NAMESPACES)
        .filter(|n| (n * PODS_PER_NAMESPACE).is_multiple_of(nodes))
        .collect()
}

/// The bench's two pods on [`NODE`], each in a namespace of its own, in no policy yet.
pub fn bench_pods() -> Vec<Value> {
    let mut v = Vec::new();
    for (ns, app, ip) in [
        (CLIENT_NS, "client", CLIENT_IP),
        (SERVER_NS, "server", SERVER_IP),
    ] {
        v.push(namespace(ns, json!({"role": app})));
        v.push(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": app, "namespace": ns, "labels": {"app": app}},
            "spec": {"nodeName": NODE, "containers": [{"name": "app", "ports": [
                {"name": "conn", "containerPort": CONN_PORT, "protocol": "TCP"}]}]},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
        }));
    }
    v
}

/// How the policies selecting the bench pods allow the connection.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Shape {
    /// Every policy allows it: the first rule of each pod chain matches.
    AllAllow,
    /// Each allows another port but the last in chain order, which allows the bench's: the
    /// first packet walks every rule of both chains.
    LastAllows,
}

/// `count` policies, half in the client's namespace selecting the client for egress to the
/// server, half in the server's selecting the server for ingress from the client.
pub fn bench_policies(count: usize, shape: Shape) -> Vec<Value> {
    let half = count / 2;
    let port = |k: usize| match shape {
        Shape::LastAllows if k + 1 < half => 20_000 + k as u16,
        _ => CONN_PORT,
    };
    let mut v = Vec::with_capacity(count);
    for k in 0..half {
        let ports = json!([{"protocol": "TCP", "port": port(k)}]);
        v.push(
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": format!("egress-{k:04}"), "namespace": CLIENT_NS},
            "spec": {"podSelector": equals("app", "client"), "policyTypes": ["Egress"],
                "egress": [{"to": [{"namespaceSelector": equals("role", "server"),
                                    "podSelector": equals("app", "server")}],
                            "ports": ports}]}}),
        );
        v.push(
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": format!("ingress-{k:04}"), "namespace": SERVER_NS},
            "spec": {"podSelector": equals("app", "server"), "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"namespaceSelector": equals("role", "client"),
                                       "podSelector": equals("app", "client")}],
                             "ports": ports}]}}),
        );
    }
    v
}
