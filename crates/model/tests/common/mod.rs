#![allow(dead_code)]
use std::net::IpAddr;
use std::path::Path;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use weir_model::*;

/// Loads fixture files (multi-document YAML) into a snapshot.
pub fn snapshot(files: &[&str]) -> Snapshot {
    let mut s = Snapshot::default();
    for f in files {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(f);
        let text = std::fs::read_to_string(&path).unwrap();
        let docs: Vec<serde_json::Value> = serde_saphyr::from_str_multiple(&text).unwrap();
        for v in docs {
            let o: Object = match v["kind"].as_str().unwrap() {
                "Service" => serde_json::from_value::<Service>(v).unwrap().into(),
                "EndpointSlice" => serde_json::from_value::<EndpointSlice>(v).unwrap().into(),
                "Node" => serde_json::from_value::<Node>(v).unwrap().into(),
                k => panic!("unexpected kind {k}"),
            };
            s.insert(o);
        }
    }
    s
}

pub fn config() -> ProxyConfig {
    ProxyConfig {
        node_name: "node-a".into(),
        cluster_cidrs: vec![
            "10.244.0.0/16".parse().unwrap(),
            "fd00:244::/48".parse().unwrap(),
        ],
        ..Default::default()
    }
}

pub fn key(ns: &str, name: &str, port: &str, proto: Protocol, fam: IpFamily) -> ServicePortKey {
    ServicePortKey {
        namespace: ns.into(),
        name: name.into(),
        port_name: port.into(),
        protocol: proto,
        family: fam,
    }
}

pub fn tcp4(ns: &str, name: &str, port: &str) -> ServicePortKey {
    key(ns, name, port, Protocol::Tcp, IpFamily::V4)
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub fn ips(eps: &[Endpoint]) -> Vec<String> {
    eps.iter().map(|e| format!("{}:{}", e.ip, e.port)).collect()
}

pub fn fe(p: &ServicePortPlan, kind: FrontendKind) -> Vec<&Frontend> {
    p.frontends.iter().filter(|f| f.kind == kind).collect()
}
