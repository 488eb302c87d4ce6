use std::net::{IpAddr, Ipv4Addr};
use weir_model::*;
use weir_proxy::nft::{render_full, render_update, NftOptions};

fn plan(n: usize, eps: usize, shift: u8) -> Plan {
    let mut p = Plan::default();
    p.cluster_cidrs = vec!["10.244.0.0/16".parse().unwrap()];
    for i in 0..n {
        let key = ServicePortKey { namespace: "ns".into(), name: format!("s{i}"), port_name: "".into(), protocol: Protocol::Tcp, family: IpFamily::V4 };
        let vip = IpAddr::V4(Ipv4Addr::from(0x0a60_0000u32 + i as u32));
        let endpoints: Vec<Endpoint> = (0..eps).map(|j| Endpoint { ip: IpAddr::V4(Ipv4Addr::from(0x0af4_0000u32 + ((i * eps + j) as u32) + if i == 0 && j == 0 { shift as u32 * 1000000 } else { 0 })), port: 8080, node_name: None, zone: None, is_local: false, ready: true, serving: true, terminating: false }).collect();
        p.services.insert(key, ServicePortPlan { port: 80, frontends: vec![Frontend { kind: FrontendKind::ClusterIp, addr: Some(vip), port: 80, endpoints: EndpointSet::Cluster, verdict: Verdict::Forward, masquerade: Masquerade::OffCluster, short_circuit: false, source_ranges: None }], cluster_endpoints: endpoints, local_endpoints: vec![], affinity_timeout: None, internal_policy_local: false, external_policy_local: false, health_check_node_port: None, topology: TopologyMode::None, has_any_endpoints: true });
    }
    p
}
fn main() {
    let n: usize = std::env::args().nth(1).unwrap().parse().unwrap();
    let o = NftOptions::default();
    let a = plan(n, 10, 0);
    let b = plan(n, 10, 1);
    std::fs::write("/tmp/full.nft", render_full(&a, &o)).unwrap();
    let d = a.diff(&b);
    std::fs::write("/tmp/upd.nft", render_update(&a, &b, &d, &o)).unwrap();
}
