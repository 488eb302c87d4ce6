//! The lab's DNS fixture: its names and addresses, and what a running lab's DNS is
//! (`<lab>/dns/dns.json`).

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::state::LabDir;

/// The cluster domain.
pub const ZONE: &str = "cluster.local";

/// The external zone NSD serves in the outside world.
pub const EXTERNAL_ZONE: &str = "example.test";

/// The external name the checks resolve through the forwarder; its address is the outside's.
pub const EXTERNAL_NAME: &str = "www.example.test";

/// The headless service over `web`'s backends (hostnames = pod names, as a StatefulSet's).
pub const HEADLESS: &str = "web-headless";

/// The ExternalName service, pointing at [`EXTERNAL_NAME`].
pub const EXTERNAL_SERVICE: &str = "ext";

/// The service whose ClusterIP, SRV record and backends the checks look up.
pub const TARGET_SERVICE: &str = "web";

pub(super) const DNS_NAMESPACE: &str = "kube-system";

pub(super) const DNS_SERVICE: &str = "kube-dns";

/// How long `weir dns` and NSD may take to answer after starting.
pub(super) const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// The node-local cache's address on every node (NodeLocal DNSCache's default).
pub const NODE_LOCAL_IP: Ipv4Addr = Ipv4Addr::new(169, 254, 20, 10);

/// What `weir lab check` needs to know about a lab's DNS (`<lab>/dns/dns.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DnsState {
    pub cluster_ip: Ipv4Addr,
    /// The node `weir dns` runs on (host network) and the address it listens on.
    pub node: String,
    pub server_ip: Ipv4Addr,
    pub server_pid: u32,
    pub nsd_pid: u32,
    /// `dns: node-local`: every node runs a cache on [`NODE_LOCAL_IP`], which the pods'
    /// resolv.conf names instead of the ClusterIP.
    #[serde(default)]
    pub node_local: bool,
}

impl DnsState {
    /// The address pods' resolv.conf names (kubelet `--cluster-dns`).
    pub fn nameserver(&self) -> Ipv4Addr {
        if self.node_local {
            NODE_LOCAL_IP
        } else {
            self.cluster_ip
        }
    }
}

pub(super) fn dns_dir(dir: &LabDir) -> PathBuf {
    dir.dir.join("dns")
}

/// The lab's DNS state, if the lab runs DNS.
pub fn load(dir: &LabDir) -> Option<DnsState> {
    let text = std::fs::read_to_string(dns_dir(dir).join("dns.json")).ok()?;
    serde_json::from_str(&text).ok()
}
