//! The DNS objects the lab adds to its Kubernetes objects: the DNS Service and its
//! EndpointSlice, a headless service and an ExternalName service.

use std::net::Ipv4Addr;

use serde_json::{json, Value};

use super::state::{
    DNS_NAMESPACE, DNS_SERVICE, EXTERNAL_NAME, EXTERNAL_SERVICE, HEADLESS, TARGET_SERVICE,
};
use crate::echo::ECHO_PORT;
use crate::manifests::{NAMESPACE, PORT_NAME};
use crate::state::LabState;

/// The DNS Service and its EndpointSlice (the server on `server_ip`, a host-network endpoint),
/// a headless service over `web`'s backends and an ExternalName service. Pure.
pub fn objects(cluster_ip: Ipv4Addr, server_ip: Ipv4Addr, state: &LabState) -> Vec<Value> {
    let ports = json!([
        { "name": "dns", "port": 53, "protocol": "UDP" },
        { "name": "dns-tcp", "port": 53, "protocol": "TCP" },
    ]);
    let mut docs = vec![
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": { "name": DNS_SERVICE, "namespace": DNS_NAMESPACE },
            "spec": {
                "type": "ClusterIP",
                "clusterIP": cluster_ip.to_string(), "clusterIPs": [cluster_ip.to_string()],
                "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                "selector": { "k8s-app": DNS_SERVICE },
                "ports": ports.as_array().unwrap().iter().map(|p| {
                    let mut p = p.clone();
                    p["targetPort"] = json!(53);
                    p
                }).collect::<Vec<_>>(),
            },
        }),
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {
                "name": format!("{DNS_SERVICE}-lab"), "namespace": DNS_NAMESPACE,
                "labels": { "kubernetes.io/service-name": DNS_SERVICE },
            },
            "addressType": "IPv4",
            "ports": ports,
            "endpoints": [{
                "addresses": [server_ip.to_string()],
                "conditions": { "ready": true, "serving": true, "terminating": false },
            }],
        }),
    ];
    if let Some(web) = state.services.iter().find(|s| s.name == TARGET_SERVICE) {
        let endpoints: Vec<Value> = web
            .backends
            .iter()
            .filter_map(|b| state.pods.iter().find(|p| &p.name == b))
            .map(|p| {
                json!({
                    "addresses": [p.ip.to_string()], "hostname": p.name,
                    "conditions": { "ready": true }, "nodeName": p.node,
                })
            })
            .collect();
        docs.push(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": { "name": HEADLESS, "namespace": NAMESPACE },
            "spec": {
                "clusterIP": "None", "selector": { "app": TARGET_SERVICE },
                "ports": [{ "name": PORT_NAME, "port": ECHO_PORT, "protocol": "TCP" }],
            },
        }));
        docs.push(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {
                "name": format!("{HEADLESS}-lab"), "namespace": NAMESPACE,
                "labels": { "kubernetes.io/service-name": HEADLESS },
            },
            "addressType": "IPv4",
            "ports": [{ "name": PORT_NAME, "port": ECHO_PORT, "protocol": "TCP" }],
            "endpoints": endpoints,
        }));
    }
    docs.push(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": { "name": EXTERNAL_SERVICE, "namespace": NAMESPACE },
        "spec": { "type": "ExternalName", "externalName": EXTERNAL_NAME },
    }));
    docs
}
