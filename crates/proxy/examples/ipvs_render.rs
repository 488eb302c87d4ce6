//! Times ipvs mode's rendering in user space for N services × 10 endpoints (every 10th also a
//! NodePort, as the agent bench generates them): the whole desired state the plain way
//! (`render`, what every sync did before), comparing it with the last and diffing the ipsets;
//! then what a sync does now, the per-service-port rendering a full sync builds
//! (`Rendering::full`) and one endpoint change rendered alone (`Rendering::update`). No
//! kernel, no root (docs/benchmarks.md, "ipvs beside nftables in the test VM").
//!
//! ```sh
//! WEIR_SERVICES=1000 cargo run --release -p weir-proxy --example ipvs_render
//! ```

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use weir_model::{IpFamily, NodePortAddresses, Plan};
use weir_proxy::ipvs::incremental::Rendering;
use weir_proxy::ipvs::render::{ipset_update, render};
use weir_proxy::ipvs::IpvsOptions;

#[path = "../tests/common/plans.rs"]
mod plans;

const ROUNDS: usize = 21;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let n: usize = std::env::var("WEIR_SERVICES").map_or(1000, |v| v.parse().expect("number"));
    let node_ip = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 10));
    let plan = Plan {
        services: (0..n)
            .map(|i| {
                let (k, sp) = plans::bench_service("bench", i);
                (k, sp.into())
            })
            .collect(),
        node_port_addresses_v4: NodePortAddresses::List(BTreeSet::from([node_ip])),
        node_port_addresses_v6: NodePortAddresses::None,
        cluster_cidrs: vec!["10.244.0.0/16".parse().expect("CIDR")],
        masquerade_all: false,
        warnings: Vec::new(),
    };
    let opts = IpvsOptions::default();
    let mut last = render(&plan, IpFamily::V4, &[node_ip], &opts);
    let (mut rendering, mut comparing, mut diffing) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let desired = render(&plan, IpFamily::V4, &[node_ip], &opts);
        rendering.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let same = desired.services == last.services && desired.iptables == last.iptables;
        comparing.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let script = ipset_update(&last.ipsets, &desired.ipsets);
        diffing.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(same && script.is_empty(), "the same plan renders the same");
        last = desired;
    }
    let mut full = Vec::new();
    let mut rendered = None;
    for _ in 0..ROUNDS {
        let t = Instant::now();
        rendered = Some(Rendering::full(&plan, IpFamily::V4, &[node_ip], &opts));
        full.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let mut rendered = rendered.expect("rounds");
    // One endpoint of one service moves back and forth, as the scale bench's churn does.
    let key = plans::bench_service("bench", n / 2).0;
    let (mut plan_a, mut updating) = (plan.clone(), Vec::new());
    for round in 0..ROUNDS {
        let mut sp = (*plan.services[&key]).clone();
        if round % 2 == 0 {
            sp.cluster_endpoints[0].ip = IpAddr::V4(Ipv4Addr::new(10, 200, 0, 1));
        }
        plan_a.services.insert(key.clone(), sp.into());
        let t = Instant::now();
        let changes = rendered.update(&plan_a, [&key], &opts);
        updating.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(!changes.servers.is_empty(), "its virtual servers changed");
    }
    println!(
        "{n} services, {} virtual servers: render {:.2} ms, compare {:.3} ms, ipset diff {:.3} ms; \
         Rendering::full {:.2} ms, one-endpoint update {:.3} ms (medians of {ROUNDS})",
        last.services.len(),
        median(rendering),
        median(comparing),
        median(diffing),
        median(full),
        median(updating)
    );
}
