//! The lab's "API server": the Kubernetes objects (Nodes, Services, EndpointSlices) every node's
//! `weir proxy --manifests` watches, rendered from the topology and the running lab (pure), and
//! written atomically into `<lab>/manifests/`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use serde_json::{json, Value};

use crate::echo::ECHO_PORT;
use crate::state::{LabState, ServiceState};
use crate::topology::{ServiceType, Topology};

/// The namespace every lab service lives in.
pub const NAMESPACE: &str = "default";

/// The name of every service's (single) port, in the Service and its EndpointSlice.
pub const PORT_NAME: &str = "echo";

/// kube-apiserver's default ClientIP affinity timeout.
pub const AFFINITY_TIMEOUT_SECONDS: u32 = 10800;

/// A Node with its underlay address as InternalIP (what the proxy takes as the node's IP) and
/// the annotations its routes agent published (its VTEP, for the other nodes' agents).
pub fn node_object(
    name: &str,
    internal_ip: &str,
    pod_cidr: &str,
    annotations: &BTreeMap<String, String>,
) -> Value {
    dual_stack_node_object(name, &[internal_ip], &[pod_cidr], annotations)
}

/// A Node with an InternalIP and a podCIDR per family (IPv4 first, as kubelet and
/// kube-controller-manager order them).
pub fn dual_stack_node_object(
    name: &str,
    internal_ips: &[&str],
    pod_cidrs: &[&str],
    annotations: &BTreeMap<String, String>,
) -> Value {
    let mut metadata = json!({ "name": name, "labels": { "kubernetes.io/hostname": name } });
    if !annotations.is_empty() {
        metadata["annotations"] = json!(annotations);
    }
    let mut addresses: Vec<Value> = internal_ips
        .iter()
        .map(|ip| json!({ "type": "InternalIP", "address": ip }))
        .collect();
    addresses.push(json!({ "type": "Hostname", "address": name }));
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": metadata,
        "spec": { "podCIDR": pod_cidrs.first(), "podCIDRs": pod_cidrs },
        "status": { "addresses": addresses },
    })
}

/// The Service object of `svc`.
pub fn service_object(svc: &ServiceState) -> Value {
    let mut port = json!({
        "name": PORT_NAME,
        "port": svc.port,
        "targetPort": ECHO_PORT,
        "protocol": svc.protocol.as_k8s(),
    });
    if let Some(np) = svc.node_port {
        port["nodePort"] = json!(np);
    }
    // Dual-stack labs: PreferDualStack, a ClusterIP per family (IPv4 primary).
    let (cluster_ips, families, policy) = match svc.cluster_ip6 {
        None => (
            vec![svc.cluster_ip.to_string()],
            vec!["IPv4"],
            "SingleStack",
        ),
        Some(ip6) => (
            vec![svc.cluster_ip.to_string(), ip6.to_string()],
            vec!["IPv4", "IPv6"],
            "PreferDualStack",
        ),
    };
    let mut spec = json!({
        "type": svc.kind.as_str(),
        "clusterIP": svc.cluster_ip.to_string(),
        "clusterIPs": cluster_ips,
        "ipFamilies": families,
        "ipFamilyPolicy": policy,
        "selector": { "app": svc.name },
        "ports": [port],
        "sessionAffinity": if svc.sticky() { "ClientIP" } else { "None" },
        "internalTrafficPolicy": "Cluster",
    });
    if svc.sticky() {
        spec["sessionAffinityConfig"] =
            json!({ "clientIP": { "timeoutSeconds": AFFINITY_TIMEOUT_SECONDS } });
    }
    if svc.kind.has_node_port() {
        spec["externalTrafficPolicy"] = json!(if svc.local_policy() {
            "Local"
        } else {
            "Cluster"
        });
    }
    if let Some(hc) = svc.health_check_node_port {
        spec["healthCheckNodePort"] = json!(hc);
    }
    let mut obj = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": { "name": svc.name, "namespace": NAMESPACE },
        "spec": spec,
    });
    if svc.kind == ServiceType::LoadBalancer {
        let ingress: Vec<Value> = svc
            .load_balancer_ip
            .iter()
            .map(|ip| json!({ "ip": ip.to_string(), "ipMode": "VIP" }))
            .collect();
        obj["status"] = json!({ "loadBalancer": { "ingress": ingress } });
    }
    obj
}

/// The EndpointSlice of `svc`: one ready endpoint per backend pod (none for a service without
/// backends, which keeps its empty slice as the endpoint controller would).
pub fn endpoint_slice_object(svc: &ServiceState, state: &LabState) -> Value {
    slice_object(svc, state, false)
}

/// A dual-stack Service's IPv6 EndpointSlice (`<name>-lab6`, addressType IPv6): the backends'
/// IPv6 addresses.
pub fn endpoint_slice_object6(svc: &ServiceState, state: &LabState) -> Value {
    slice_object(svc, state, true)
}

fn slice_object(svc: &ServiceState, state: &LabState, v6: bool) -> Value {
    let endpoints: Vec<Value> = svc
        .backends
        .iter()
        .filter_map(|b| state.pods.iter().find(|p| &p.name == b))
        .filter_map(|p| {
            let ip = if v6 {
                p.ip6?.to_string()
            } else {
                p.ip.to_string()
            };
            Some((p, ip))
        })
        .map(|(p, ip)| {
            json!({
                "addresses": [ip],
                "conditions": { "ready": true, "serving": true, "terminating": false },
                "nodeName": p.node,
                "targetRef": { "kind": "Pod", "name": p.name, "namespace": NAMESPACE },
            })
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": format!("{}-lab{}", svc.name, if v6 { "6" } else { "" }),
            "namespace": NAMESPACE,
            "labels": {
                "kubernetes.io/service-name": svc.name,
                "endpointslice.kubernetes.io/managed-by": "weir-lab",
            },
        },
        "addressType": if v6 { "IPv6" } else { "IPv4" },
        "ports": [{ "name": PORT_NAME, "port": ECHO_PORT, "protocol": svc.protocol.as_k8s() }],
        "endpoints": endpoints,
    })
}

fn documents(docs: &[Value]) -> String {
    docs.iter()
        .map(|d| weir_source::yaml::to_string(d).expect("JSON values serialize as YAML"))
        .collect::<Vec<_>>()
        .join("---\n")
}

/// `nodes.yaml`: every node of the lab. Pure.
pub fn render_nodes(topo: &Topology, state: &LabState) -> (String, String) {
    let nodes: Vec<Value> = state
        .nodes
        .iter()
        .map(|n| {
            let node = topo.node(&n.name).map(|(_, t)| t);
            let mut ips = vec![n.underlay_ip.to_string()];
            ips.extend(n.underlay_ip6.map(|ip| ip.to_string()));
            let mut cidrs: Vec<String> = node.map(|t| t.pod_cidr.to_string()).into_iter().collect();
            cidrs.extend(node.and_then(|t| topo.pod_cidr6(t)).map(|c| c.to_string()));
            let ips: Vec<&str> = ips.iter().map(String::as_str).collect();
            let cidrs: Vec<&str> = cidrs.iter().map(String::as_str).collect();
            dual_stack_node_object(&n.name, &ips, &cidrs, &n.annotations)
        })
        .collect();
    (
        "nodes.yaml".to_string(),
        format!("# written by weir lab\n{}", documents(&nodes)),
    )
}

/// Every manifest file of the lab: `nodes.yaml`, one `service-<name>.yaml` (Service +
/// EndpointSlice) per service, and with policies `namespaces.yaml`, `pods.yaml` and
/// `policies.yaml` ([`crate::netpol::objects`]). Pure.
pub fn render(topo: &Topology, state: &LabState) -> Vec<(String, String)> {
    let mut files = vec![render_nodes(topo, state)];
    for svc in &state.services {
        let mut docs = vec![service_object(svc), endpoint_slice_object(svc, state)];
        if svc.cluster_ip6.is_some() {
            docs.push(endpoint_slice_object6(svc, state));
        }
        files.push((
            format!("service-{}.yaml", svc.name),
            format!("# written by weir lab\n{}", documents(&docs)),
        ));
    }
    for (name, docs) in crate::netpol::objects::render(topo, state) {
        files.push((
            name.to_string(),
            format!("# written by weir lab\n{}", documents(&docs)),
        ));
    }
    files
}

/// Writes `files` into `dir` (created if needed), each atomically: a hidden temporary file
/// (the manifest loader skips hidden files) renamed into place.
pub fn write(dir: &Path, files: &[(String, String)]) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    for (name, text) in files {
        let tmp = dir.join(format!(".{name}.tmp"));
        let path = dir.join(name);
        std::fs::write(&tmp, text).with_context(|| format!("write {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("rename to {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demo_state() -> (Topology, LabState) {
        let topo = Topology::default_demo();
        let state = LabState::simulated(&topo);
        (topo, state)
    }

    #[test]
    fn renders_nodes_services_and_slices() {
        let (topo, state) = demo_state();
        let files = render(&topo, &state);
        let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "nodes.yaml",
                "service-web.yaml",
                "service-dns.yaml",
                "service-shop.yaml",
                "service-api.yaml",
                "service-gone.yaml"
            ]
        );
        let docs = |text: &str| -> Vec<Value> {
            let mut reader = text.as_bytes();
            weir_source::yaml::documents(&mut reader)
                .map(|d| d.unwrap())
                .collect()
        };
        let nodes = docs(&files[0].1);
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[1]["metadata"]["name"], "b");
        assert_eq!(nodes[1]["status"]["addresses"][0]["type"], "InternalIP");
        assert_eq!(nodes[1]["status"]["addresses"][0]["address"], "172.30.0.12");

        let web = docs(&files[1].1);
        assert_eq!(web[0]["spec"]["clusterIP"], "10.96.0.1");
        assert_eq!(web[0]["spec"]["ports"][0]["port"], 80);
        assert_eq!(web[0]["spec"]["ports"][0]["targetPort"], 8080);
        assert!(web[0]["spec"].get("externalTrafficPolicy").is_none());
        assert_eq!(
            web[1]["metadata"]["labels"]["kubernetes.io/service-name"],
            "web"
        );
        let eps = web[1]["endpoints"].as_array().unwrap();
        assert_eq!(eps.len(), 2);
        assert_eq!(eps[0]["addresses"][0], "10.244.1.2");
        assert_eq!(eps[0]["nodeName"], "a");
        assert_eq!(eps[1]["addresses"][0], "10.244.2.2");
        assert_eq!(eps[1]["conditions"]["ready"], true);

        let dns = docs(&files[2].1);
        assert_eq!(dns[0]["spec"]["ports"][0]["protocol"], "UDP");
        assert_eq!(dns[1]["ports"][0]["protocol"], "UDP");

        let shop = docs(&files[3].1);
        assert_eq!(shop[0]["spec"]["type"], "NodePort");
        assert_eq!(shop[0]["spec"]["ports"][0]["nodePort"], 30080);
        assert_eq!(shop[0]["spec"]["externalTrafficPolicy"], "Local");

        let api = docs(&files[4].1);
        assert_eq!(api[0]["spec"]["type"], "LoadBalancer");
        assert_eq!(api[0]["spec"]["externalTrafficPolicy"], "Cluster");
        assert_eq!(
            api[0]["status"]["loadBalancer"]["ingress"][0]["ip"],
            "203.0.113.1"
        );

        let gone = docs(&files[5].1);
        assert_eq!(gone[1]["endpoints"].as_array().unwrap().len(), 0);
    }

    #[test]
    fn dual_stack_objects_carry_both_families() {
        let topo = Topology::dual_stack_demo();
        let state = LabState::simulated(&topo);
        let files = render(&topo, &state);
        let docs = |text: &str| -> Vec<Value> {
            let mut reader = text.as_bytes();
            weir_source::yaml::documents(&mut reader)
                .map(|d| d.unwrap())
                .collect()
        };
        let nodes = docs(&files[0].1);
        assert_eq!(
            nodes[1]["spec"]["podCIDRs"],
            json!(["10.244.2.0/24", "fd00:10:244:2::/64"])
        );
        assert_eq!(nodes[1]["spec"]["podCIDR"], "10.244.2.0/24");
        assert_eq!(
            nodes[1]["status"]["addresses"],
            json!([
                {"type": "InternalIP", "address": "172.30.0.12"},
                {"type": "InternalIP", "address": "fd00:172:30::c"},
                {"type": "Hostname", "address": "b"},
            ])
        );
        let web = docs(&files[1].1);
        assert_eq!(web.len(), 3);
        assert_eq!(web[0]["spec"]["ipFamilyPolicy"], "PreferDualStack");
        assert_eq!(web[0]["spec"]["ipFamilies"], json!(["IPv4", "IPv6"]));
        assert_eq!(
            web[0]["spec"]["clusterIPs"],
            json!(["10.96.0.1", "fd00:10:96::1"])
        );
        assert_eq!(web[1]["addressType"], "IPv4");
        assert_eq!(web[2]["addressType"], "IPv6");
        assert_eq!(web[2]["metadata"]["name"], "web-lab6");
        assert_eq!(
            web[2]["metadata"]["labels"]["kubernetes.io/service-name"],
            "web"
        );
        let eps: Vec<&Value> = web[2]["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| &e["addresses"][0])
            .collect();
        assert_eq!(
            eps,
            [&json!("fd00:10:244:1::2"), &json!("fd00:10:244:2::2")]
        );
        // IPv4-only labs are unchanged: one slice, SingleStack.
        let (topo, state) = demo_state();
        let web = docs(&render(&topo, &state)[1].1);
        assert_eq!(web.len(), 2);
        assert_eq!(web[0]["spec"]["ipFamilyPolicy"], "SingleStack");
    }

    #[test]
    fn writes_atomically() {
        let (topo, state) = demo_state();
        let dir = tempfile::tempdir().unwrap();
        let files = render(&topo, &state);
        write(&dir.path().join("m"), &files).unwrap();
        let mut listed: Vec<String> = std::fs::read_dir(dir.path().join("m"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        listed.sort();
        assert_eq!(listed.len(), 6, "{listed:?}");
        assert!(listed.iter().all(|n| !n.starts_with('.')), "{listed:?}");
    }
}
