//! Bringing the lab's DNS up: NSD outside, `weir dns` on the first node behind the DNS
//! Service, the node-local caches, and the pods' resolv.conf.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::node_local::node_local_up;
use super::nsd::{external_zone, nsd_conf};
use super::objects::objects;
use super::resolv::{netns_etc, resolv_conf};
use super::servers::start_server;
use super::state::{dns_dir, DnsState, EXTERNAL_NAME, EXTERNAL_ZONE, READY_TIMEOUT, ZONE};
use super::tools::dig;
use crate::addr::dns_cluster_ip;
use crate::manifests::NAMESPACE;
use crate::process::spawn_in;
use crate::state::{LabDir, LabState};
use crate::topology::Dns;

/// Starts NSD (outside) and `weir dns` (first node), writes the DNS objects and the pods'
/// resolv.conf files, and waits until a pod gets an answer through the ClusterIP. With
/// `Dns::NodeLocal`, then starts the node-local caches ([`node_local_up`]) and the pods'
/// resolv.conf names [`NODE_LOCAL_IP`].
pub fn up(
    weir: &Path,
    dir: &LabDir,
    state: &LabState,
    service_cidr: ipnet::Ipv4Net,
    mode: Dns,
) -> anyhow::Result<DnsState> {
    let d = dns_dir(dir);
    std::fs::create_dir_all(&d)?;
    let out_ns = crate::names::outside(&state.lab);
    let node = state
        .nodes
        .first()
        .ok_or_else(|| anyhow::anyhow!("dns needs a node"))?;

    // The upstream: NSD on the outside's address.
    std::fs::write(
        d.join(format!("{EXTERNAL_ZONE}.zone")),
        external_zone(state.outside),
    )?;
    std::fs::write(d.join("nsd.conf"), nsd_conf(&d, state.outside))?;
    let nsd_pid = spawn_in(
        &out_ns,
        Path::new("nsd"),
        &[
            "-d".into(),
            "-c".into(),
            d.join("nsd.conf").display().to_string(),
        ],
        &d.join("nsd.out"),
    )
    .context("start nsd (Debian package nsd)")?;

    // The objects, then the server.
    let cip = dns_cluster_ip(service_cidr);
    let docs: Vec<String> = objects(cip, node.underlay_ip, state)
        .iter()
        .map(|v| weir_source::yaml::to_string(v).expect("JSON values serialize as YAML"))
        .collect();
    crate::manifests::write(
        &dir.manifests(),
        &[(
            "dns.yaml".into(),
            format!("# written by weir lab\n{}", docs.join("---\n")),
        )],
    )?;
    std::fs::write(
        d.join("upstream.conf"),
        format!("nameserver {}\n", state.outside),
    )?;
    let server_pid = start_server(weir, dir, &node.netns, node.underlay_ip, false)?;
    let mut dns = DnsState {
        cluster_ip: cip,
        node: node.name.clone(),
        server_ip: node.underlay_ip,
        server_pid,
        nsd_pid,
        node_local: false,
    };
    std::fs::write(d.join("dns.json"), serde_json::to_vec_pretty(&dns)?)?;

    // Ready: NSD answers in the outside, and a pod's query through the ClusterIP is answered.
    let started = Instant::now();
    let probe_ns = state.pods.first().map(|p| p.netns.clone());
    loop {
        let nsd_ok = dig(&out_ns, state.outside, EXTERNAL_NAME, "A").status == "NOERROR";
        let dns_ok = match &probe_ns {
            Some(ns) => dig(ns, cip, &format!("dns-version.{ZONE}"), "TXT").status == "NOERROR",
            None => true,
        };
        if nsd_ok && dns_ok {
            if mode == Dns::NodeLocal {
                node_local_up(weir, dir, state)?;
                dns.node_local = true;
                std::fs::write(d.join("dns.json"), serde_json::to_vec_pretty(&dns)?)?;
            }
            for pod in &state.pods {
                let etc = netns_etc(&pod.netns);
                std::fs::create_dir_all(&etc)?;
                std::fs::write(
                    etc.join("resolv.conf"),
                    resolv_conf(dns.nameserver(), NAMESPACE),
                )?;
            }
            return Ok(dns);
        }
        if started.elapsed() > READY_TIMEOUT {
            bail!(
                "cluster DNS not ready after {} s (nsd answers: {nsd_ok}, weir dns via {cip}: \
                 {dns_ok}); logs: {}, {}",
                READY_TIMEOUT.as_secs(),
                dir.dir.join("logs/dns.log").display(),
                d.join("nsd.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
