//! The objects a lab with policies adds to its manifest directory: its Namespaces, a Pod per
//! lab pod (namespace, labels, node, address, the echo server's ports) and the topology's
//! NetworkPolicies (pure); and [`load_cluster`], which reads them back the way `weir policy`
//! does, so the oracle judges exactly what the agents enforce.

use std::path::Path;
use std::time::Duration;

use anyhow::bail;
use serde_json::{json, Value};
use weir_policy::Cluster;
use weir_source::{Limits, ManifestDir, Object};

use crate::echo::ECHO_PORT;
use crate::policy_spec::{policy_objects, DEFAULT_NAMESPACE};
use crate::state::{LabState, PodState};
use crate::topology::Topology;

/// Every namespace of the topology, and `default`.
pub fn namespace_objects(topo: &Topology) -> Vec<Value> {
    let mut docs = Vec::new();
    if !topo.namespaces.contains_key(DEFAULT_NAMESPACE) {
        docs.push(namespace(DEFAULT_NAMESPACE, &Default::default()));
    }
    docs.extend(topo.namespaces.iter().map(|(n, l)| namespace(n, l)));
    docs
}

fn namespace(name: &str, labels: &std::collections::BTreeMap<String, String>) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": { "name": name, "labels": labels },
    })
}

/// A lab pod as the API server would hold it once it runs: its node, its address, and the
/// echo server's ports (named, so policies may name them).
pub fn pod_object(topo: &Topology, pod: &PodState) -> Value {
    let meta = topo.pod_meta(&pod.name);
    // A dual-stack pod lists both, IPv4 first (the lab's primary family), as the kubelet does.
    let mut pod_ips = vec![json!({ "ip": pod.ip.to_string() })];
    pod_ips.extend(pod.ip6.map(|ip| json!({ "ip": ip.to_string() })));
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": pod.name, "namespace": meta.namespace, "labels": meta.labels },
        "spec": {
            "nodeName": pod.node,
            "containers": [{
                "name": "echo",
                "image": "weir-lab/echo",
                "ports": [
                    { "name": "echo", "containerPort": ECHO_PORT, "protocol": "TCP" },
                    { "name": "echo-udp", "containerPort": ECHO_PORT, "protocol": "UDP" },
                ],
            }],
        },
        "status": {
            "phase": "Running",
            "podIP": pod.ip.to_string(),
            "podIPs": pod_ips,
        },
    })
}

/// `namespaces.yaml`, `pods.yaml` and `policies.yaml` (a topology without policies: none).
pub fn render(topo: &Topology, state: &LabState) -> Vec<(&'static str, Vec<Value>)> {
    if !topo.enforces_policy() {
        return Vec::new();
    }
    let pods = state.pods.iter().map(|p| pod_object(topo, p)).collect();
    vec![
        ("namespaces.yaml", namespace_objects(topo)),
        ("pods.yaml", pods),
        ("policies.yaml", policy_objects(&topo.policies)),
    ]
}

/// The Namespaces, Pods and NetworkPolicies of manifest directory `dir`, read as `weir
/// policy --manifests` reads them (weir-source with the policy kinds) into the oracle's
/// [`Cluster`]. Any manifest error fails: an expectation must not come from a partial view.
pub fn load_cluster(dir: &Path) -> anyhow::Result<Cluster> {
    let limits = Limits {
        // The lab wrote these files before; nothing is half-written.
        settle: Duration::ZERO,
        ..Limits::default()
    };
    let mut manifests = ManifestDir::with_limits(dir, limits).with_policy_objects();
    let report = manifests.scan();
    if let Some(e) = report.failed {
        bail!("{e}");
    }
    let errors = manifests.errors();
    if !errors.is_empty() {
        let lines: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        bail!(
            "manifest errors in {}:\n{}",
            dir.display(),
            lines.join("\n")
        );
    }
    let mut cluster = Cluster::default();
    for object in manifests.objects() {
        match object {
            Object::Namespace(ns) => cluster.insert_namespace(ns),
            Object::Pod(pod) => {
                if let Some(part) = &pod.policy {
                    cluster.insert_pod(part.value.clone());
                }
            }
            Object::NetworkPolicy(p) => cluster.insert_policy(p.value.clone()),
            _ => {}
        }
    }
    Ok(cluster)
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_policy::ObjectKey;

    #[test]
    fn renders_and_reads_back_the_policy_lab() {
        let topo = Topology::policy_demo();
        let state = LabState::simulated(&topo);
        let files = render(&topo, &state);
        let names: Vec<&str> = files.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["namespaces.yaml", "pods.yaml", "policies.yaml"]);
        let dir = tempfile::tempdir().unwrap();
        for (name, docs) in files {
            let text: Vec<String> = docs
                .iter()
                .map(|d| weir_source::yaml::to_string(d).unwrap())
                .collect();
            std::fs::write(dir.path().join(name), text.join("---\n")).unwrap();
        }
        let cluster = load_cluster(dir.path()).unwrap();
        let ns: Vec<&str> = cluster.namespaces.keys().map(|k| &**k).collect();
        assert_eq!(ns, ["default", "dev", "prod"]);
        assert_eq!(cluster.pods.len(), 4);
        let web = &cluster.pods[&ObjectKey::new("prod", "web")];
        assert_eq!(web.node.as_deref(), Some("a"));
        assert_eq!(web.ips, [std::net::IpAddr::from([10, 244, 1, 2])]);
        assert_eq!(web.labels.get("app"), Some("web"));
        assert!(cluster
            .pods
            .contains_key(&ObjectKey::new("default", "peer")));
        assert_eq!(cluster.policies.len(), 5);
        assert!(cluster
            .policies
            .contains_key(&ObjectKey::new("dev", "tool-egress")));
    }

    #[test]
    fn a_lab_without_policies_writes_none_of_them() {
        let topo = Topology::default_demo();
        assert!(render(&topo, &LabState::simulated(&topo)).is_empty());
    }

    #[test]
    fn a_manifest_error_is_not_a_view() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("policies.yaml"),
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: x, namespace: d}\nspec: {podSelector: 5}\n",
        )
        .unwrap();
        let e = load_cluster(dir.path()).unwrap_err().to_string();
        assert!(e.contains("policies.yaml"), "{e}");
    }
}
