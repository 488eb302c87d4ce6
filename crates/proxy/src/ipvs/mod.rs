//! ipvs mode: kube-proxy's ipvs layout (`pkg/proxy/ipvs/proxier.go`), so `ipvsadm -Ln`,
//! `ipset list` and `iptables-save` of a weir node read like a kube-proxy node's.
//!
//! What kube-proxy's ipvs proxier puts in a node, and weir with it:
//!
//! * every ClusterIP, externalIP and LoadBalancer ingress IP bound (/32, /128) to the
//!   `kube-ipvs0` dummy (left down), so packets to them reach LOCAL_IN where IPVS sits;
//! * one IPVS virtual server per frontend — ClusterIP:port, externalIP:port, LB IP:port and
//!   `<node IP>:<nodePort>` for every node address — with the scheduler of
//!   `--ipvs-scheduler` (default rr), sessionAffinity ClientIP as persistence with its
//!   timeout, and a masquerading (NAT) real server of weight 1 per endpoint (only local ones
//!   where the traffic policy is Local — or, with no local one, every cluster endpoint, as
//!   kube-proxy since kubernetes#97081, with outside clients dropped in filter
//!   `KUBE-PROXY-FIREWALL` as the other modes drop them);
//! * ipsets: `KUBE-CLUSTER-IP`, `KUBE-LOOP-BACK` (endpoint,port,endpoint: hairpin),
//!   `KUBE-EXTERNAL-IP(-LOCAL)`, `KUBE-LOAD-BALANCER(-LOCAL, -FW, -SOURCE-IP, -SOURCE-CIDR)`,
//!   `KUBE-NODE-PORT(-LOCAL)-TCP/UDP` (bitmap:port), `KUBE-NODE-PORT(-LOCAL)-SCTP-HASH`,
//!   `KUBE-HEALTH-CHECK-NODE-PORT`, `KUBE-IPVS-IPS`;
//! * iptables, which only mark for masquerade and filter (IPVS does the DNAT): nat
//!   `KUBE-SERVICES`, `KUBE-NODE-PORT`, `KUBE-LOAD-BALANCER`, `KUBE-MARK-MASQ`,
//!   `KUBE-POSTROUTING`; filter `KUBE-FORWARD`, `KUBE-NODE-PORT`, `KUBE-PROXY-FIREWALL`,
//!   `KUBE-SOURCE-RANGES-FIREWALL`, `KUBE-IPVS-FILTER`, `KUBE-IPVS-OUT-FILTER`;
//! * sysctls: `net.ipv4.vs.conntrack=1` (so netfilter's MASQUERADE sees IPVS connections),
//!   `expire_nodest_conn=1` and `expire_quiescent_template=1` (connections and persistence
//!   templates of removed or weight-0 real servers end instead of hanging), `ip_forward=1`
//!   (and `net.ipv6.conf.all.forwarding=1` once the node serves an IPv6 virtual server:
//!   replies of masqueraded real servers cross FORWARD; left alone on IPv4-only nodes, where
//!   turning it on would stop the acceptance of router advertisements), and `conn_reuse_mode=0` only on kernels older than 5.9 — from 5.9 the default (1) no
//!   longer drops the first SYN of a reused port for a second, and 0 would keep sending new
//!   connections to terminating real servers;
//! * graceful termination: a real server that leaves gets weight 0 (no new connections) and
//!   is deleted once its active and inactive connection counts reach zero (TCP) or at once
//!   (UDP, SCTP: `expire_nodest_conn` ends their flows on the next packet); weir adds a
//!   timeout after which it is deleted anyway.
//!
//! Modules:
//! * [`netlink`]: IPVS over generic netlink (encoders pure and byte-tested, plus a client).
//! * [`ipset`]: ipset entries added and deleted over nfnetlink (the same, for partial syncs).
mod apply;
pub mod diff;
pub mod incremental;
pub mod ipset;
pub mod netlink;
pub mod render;
pub use apply::{conn_reuse_mode, node_port_ips, IpvsBackend};
pub use render::{check_scheduler, IpvsOptions, SCHEDULERS};
