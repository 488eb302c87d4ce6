//! Cluster DNS in the lab (topology `dns: true`): `weir dns` on the first node behind the DNS
//! Service ClusterIP (serviceCIDR host 10, kubeadm's convention: 10.96.0.10), routed by the
//! nodes' proxies like any Service; NSD in the outside world serving an external zone that
//! `weir dns` forwards to; every pod namespace gets the resolv.conf the kubelet writes for
//! dnsPolicy ClusterFirst, as `/etc/netns/<netns>/resolv.conf` (which `ip netns exec` mounts over
//! `/etc/resolv.conf`). [`plan`] and [`run`] are the name checks `weir lab check` adds.
//!
//! Files: `<lab>/dns/` (NSD's config and zone, weir dns's upstream file, `dns.json`), the
//! per-namespace `/etc/netns/<netns>/resolv.conf` (removed by [`remove_netns_etc`]).
//!
//! One job a module: [`state`] (the fixture's names and addresses, the recorded state),
//! [`objects`](mod@objects) (its Kubernetes objects), [`resolv`] (the pods' resolv.conf),
//! [`nsd`] (the outside's server), [`servers`] (`weir dns` itself), [`up`](mod@up) (starting
//! it all), [`node_local`] (the per-node caches), [`parse`] and [`tools`] (dig, getent,
//! dnsperf, nft counters), [`checks`] (the name checks).

pub mod checks;
pub mod node_local;
pub mod nsd;
pub mod objects;
pub mod parse;
pub mod resolv;
pub mod servers;
pub mod state;
pub mod tools;
pub mod up;

pub use checks::{plan, render, run, run_one, summary, NameCheck, NameResult, Via};
pub use node_local::node_local_up;
pub use nsd::external_zone;
pub use objects::objects;
pub use parse::{parse_counter, parse_dig, parse_dnsperf, parse_getent, DigAnswer, Perf};
pub use resolv::{netns_etc, remove_netns_etc, resolv_conf};
pub use servers::{restart_server, server_args};
pub use state::{
    load, DnsState, EXTERNAL_NAME, EXTERNAL_SERVICE, EXTERNAL_ZONE, HEADLESS, NODE_LOCAL_IP,
    TARGET_SERVICE, ZONE,
};
pub use tools::{count_queries, dig, dnsperf, getent};
pub use up::up;
pub use weir_dns::node_local::notrack_table;
