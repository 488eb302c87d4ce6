//! weir-dns: the cluster DNS server (`weir dns`).
//!
//! Layers, each usable alone:
//! * [`zone`]: the pure Kubernetes DNS zone — [`Zone::build`] from a [`weir_model::Snapshot`],
//!   then [`Zone::lookup`]`(name, type) -> `[`Answer`]; no I/O.
//! * [`respond`]: a request [`Message`](hickory_proto::op::Message) and an answer → the
//!   response message and its bytes sized for the transport (EDNS0, TC bit). Pure.
//! * [`forward`]: upstreams from a resolv.conf-style file, failover, and a bounded cache.
//! * [`metrics`]: Prometheus counters of responses, the cache, upstreams and the zone.
//! * [`hosts`], [`rewrite`]: static host entries and name rewrites (pure).
//! * [`node_local`]: the NOTRACK table of `--node-local` and its removal (pure).
//! * [`search`]: recognising a pod's first search-path expansion and the names its resolver
//!   would try next (pure; the server's autopath option uses it).
//! * [`wire`]: the zone's answers precomputed as wire bytes, and the request fast path.
//! * [`udp`]: SO_REUSEPORT sockets and recvmmsg/sendmmsg batches.
//! * [`server`]: the serving loops (UDP threads, TCP and forwarding on tokio) over a
//!   [`ZoneHandle`] that the caller swaps atomically when objects change.

pub mod agent;
mod cookie;
pub mod forward;
pub mod hosts;
pub mod metrics;
pub mod node_local;
pub mod respond;
pub mod rewrite;
pub mod search;
pub mod server;
mod tcp_slots;
pub mod udp;
pub mod wire;
pub mod zone;

pub use forward::{parse_resolv_conf, ForwardError, Forwarder, ForwarderConfig, Prefetch};
pub use hickory_proto::rr::Name;
pub use hosts::Hosts;
pub use metrics::DnsMetrics;
pub use rewrite::{NameMatch, Rewrite};
pub use server::{
    keep_large_blocks_mapped, serve, serve_blocking, Handler, ServerConfig, ZoneHandle,
};
pub use zone::{pod_address, Answer, PodRecords, Zone, ZoneConfig, SCHEMA_VERSION};

#[cfg(test)]
mod zone_tests;

/// `text` as a fully qualified DNS name (`example.com` and `example.com.` alike), or why not.
pub fn parse_name(text: &str) -> Result<Name, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty name".into());
    }
    let mut name = Name::from_ascii(t).map_err(|e| format!("{t:?} is not a DNS name: {e}"))?;
    name.set_fqdn(true);
    Ok(name)
}
