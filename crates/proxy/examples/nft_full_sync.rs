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
use weir_model::{NodePortAddresses, Plan, ServicePortKey, ServicePortPlan};
use weir_proxy::backend::Backend;
use weir_proxy::nft::{NftBackend, NftOptions};

#[path = "../tests/common/plans.rs"]
mod plans;

fn service(i: usize) -> (ServicePortKey, ServicePortPlan) {
    plans::bench_service("bench", i)
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
