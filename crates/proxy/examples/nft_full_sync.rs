//! Profiles the nftables backend's full sync alone, without the agent or an object source:
//! N services × 10 endpoints (every 10th also a NodePort, as the agent bench generates them)
//! synced into a fresh network namespace, then synced again by a second backend over the
//! first one's rules (a restart resync). The backend logs its phases. Root only.
//!
//! ```sh
//! cargo build --release -p weir-proxy --example nft_full_sync
//! WEIR_SERVICES=10000 WEIR_ROUNDS=3 target/release/examples/nft_full_sync
//! ```

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::time::Instant;

use weir_kernel::NetNs;
use weir_model::{
    Endpoint, FrontendKind, IpFamily, NodePortAddresses, Plan, Protocol, ServicePortKey,
    ServicePortPlan, TopologyMode,
};
use weir_proxy::backend::Backend;
use weir_proxy::nft::{NftBackend, NftOptions};

#[path = "../tests/common/plans.rs"]
mod plans;
use plans::{add, frontend};

fn service(i: usize) -> (ServicePortKey, ServicePortPlan) {
    let key = ServicePortKey {
        namespace: "bench".into(),
        name: format!("svc-{i:05}"),
        port_name: String::new(),
        protocol: Protocol::Tcp,
        family: IpFamily::V4,
    };
    let mut frontends = vec![frontend(
        FrontendKind::ClusterIp,
        Some(IpAddr::V4(add(Ipv4Addr::new(10, 96, 0, 1), i))),
        80,
    )];
    if i.is_multiple_of(10) && i / 10 < 2768 {
        frontends.push(frontend(
            FrontendKind::NodePort,
            None,
            30000 + (i / 10) as u16,
        ));
    }
    let cluster_endpoints = (0..10)
        .map(|j| Endpoint {
            ip: IpAddr::V4(add(Ipv4Addr::new(10, 128, 0, 1), i * 10 + j)),
            port: 8080,
            node_name: Some("other".into()),
            zone: None,
            is_local: false,
            ready: true,
            serving: true,
            terminating: false,
        })
        .collect();
    let sp = ServicePortPlan {
        port: 80,
        frontends,
        cluster_endpoints,
        local_endpoints: Vec::new(),
        affinity_timeout: None,
        internal_policy_local: false,
        external_policy_local: false,
        health_check_node_port: None,
        topology: TopologyMode::None,
        has_any_endpoints: true,
    };
    (key, sp)
}

/// CPU time of the calling thread (user and system: the kernel runs a netlink batch in the
/// sender's context), in ms. On a shared machine it varies far less than wall time.
fn thread_cpu_ms() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6
}

fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let n: usize = std::env::var("WEIR_SERVICES").map_or(10_000, |v| v.parse().expect("number"));
    let rounds: usize = std::env::var("WEIR_ROUNDS").map_or(1, |v| v.parse().expect("number"));
    let plan = Plan {
        services: (0..n)
            .map(|i| {
                let (k, sp) = service(i);
                (k, sp.into())
            })
            .collect(),
        node_port_addresses_v4: NodePortAddresses::List(BTreeSet::from([IpAddr::V4(
            Ipv4Addr::new(10, 0, 0, 10),
        )])),
        node_port_addresses_v6: NodePortAddresses::None,
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        masquerade_all: false,
        warnings: Vec::new(),
    };
    for round in 0..rounds {
        let name = format!("nftsync-ex-{}-{round}", std::process::id());
        let ok = Command::new("ip").args(["netns", "add", &name]).status();
        assert!(
            ok.map(|s| s.success()).unwrap_or(false),
            "ip netns add {name}"
        );
        let ns = NetNs::named(&name).expect("open netns");
        let result = ns.run(|| {
            let mut first = NftBackend::new(NftOptions::default());
            let (t, cpu) = (Instant::now(), thread_cpu_ms());
            first.sync(&plan).expect("first sync");
            let cold = (t.elapsed(), thread_cpu_ms() - cpu);
            let mut second = NftBackend::new(NftOptions::default());
            let (t, cpu) = (Instant::now(), thread_cpu_ms());
            second.sync(&plan).expect("restart resync");
            (cold, (t.elapsed(), thread_cpu_ms() - cpu))
        });
        let _ = Command::new("ip").args(["netns", "del", &name]).status();
        let (cold, resync) = result.expect("enter netns");
        println!(
            "round {round}: {n} services: first full sync {:.0} ms (thread CPU {:.0} ms), \
             restart resync {:.0} ms (thread CPU {:.0} ms)",
            cold.0.as_secs_f64() * 1e3,
            cold.1,
            resync.0.as_secs_f64() * 1e3,
            resync.1
        );
    }
}
