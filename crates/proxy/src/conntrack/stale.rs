//! Which UDP conntrack entries a plan change makes stale (pure).
//!
//! UDP has no connection end, so conntrack keeps an entry alive as long as packets keep coming,
//! and every packet of an existing entry follows the entry, not the (new) rules:
//! * an endpoint that went away keeps receiving a client's datagrams through the DNAT recorded
//!   in the entry, until the client stops for the UDP timeout (often never, e.g. a DNS
//!   resolver reusing its source port);
//! * datagrams sent to a frontend while it had nowhere to forward can leave an entry without
//!   DNAT, which keeps bypassing the DNAT rule once an endpoint appears.
//!
//! Facts from kube-proxy (pkg/proxy/conntrack): when a UDP service port gains its first endpoint,
//! entries to the service IP:port (and, for NodePorts, to the node port) are deleted; for each
//! UDP endpoint removed, entries to the service IPs/node port whose reply source is that
//! endpoint. weir works per frontend, and matches the endpoint's port too, so an endpoint that
//! only changed its port is handled and nothing else on that IP is touched.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use weir_model::{Frontend, FrontendKind, IpFamily, Plan, Protocol, ServicePortPlan, Verdict};

use super::ConntrackFilter;

/// The filters of the entries to delete after the kernel was moved from `old` to `new`.
///
/// Run the deletion only once the rules of `new` are in place; otherwise the next datagram
/// recreates the entry through the old rules. Sorted and without duplicates.
pub fn stale_udp_flows(old: &Plan, new: &Plan) -> Vec<ConntrackFilter> {
    let mut out = BTreeSet::new();

    // Frontends that forward now but did not before (or did not exist).
    for (key, now) in &new.services {
        if key.protocol != Protocol::Udp {
            continue;
        }
        let before = old.services.get(key);
        if before.is_some_and(|b| Arc::ptr_eq(b, now)) {
            continue; // unchanged (the planner shares unchanged ports' Arcs)
        }
        for fe in now.frontends.iter().filter(|fe| forwards(fe, now)) {
            let forwarded_before = before.is_some_and(|b| {
                b.frontends
                    .iter()
                    .any(|o| same_destination(o, fe) && forwards(o, b))
            });
            if !forwarded_before {
                out.insert(destination(key.family, fe, None));
            }
        }
    }

    // Endpoints that are gone, through every frontend that could have reached them.
    for (key, before) in &old.services {
        if key.protocol != Protocol::Udp {
            continue;
        }
        let now = new.services.get(key);
        if now.is_some_and(|n| Arc::ptr_eq(n, before)) {
            continue;
        }
        let alive = now.map(|sp| endpoint_addrs(sp)).unwrap_or_default();
        for ep in endpoint_addrs(before).difference(&alive) {
            for fe in &before.frontends {
                out.insert(destination(key.family, fe, Some(*ep)));
            }
        }
    }
    out.into_iter().collect()
}

/// New datagrams to this frontend are DNATed to some endpoint (for a short-circuited Local
/// frontend, at least those from pods and from the node itself).
fn forwards(fe: &Frontend, sp: &ServicePortPlan) -> bool {
    fe.verdict == Verdict::Forward || (fe.short_circuit && !sp.cluster_endpoints.is_empty())
}

fn same_destination(a: &Frontend, b: &Frontend) -> bool {
    a.kind == b.kind && a.addr == b.addr && a.port == b.port
}

/// Every endpoint any frontend of the port may use. Topology or traffic-policy changes that
/// move an endpoint out of one list but keep it in the other do not count as removal.
fn endpoint_addrs(sp: &ServicePortPlan) -> BTreeSet<(IpAddr, u16)> {
    sp.cluster_endpoints
        .iter()
        .chain(&sp.local_endpoints)
        .map(|e| (e.ip, e.port))
        .collect()
}

/// Entries sent to `fe` (optionally: answered by `endpoint`).
fn destination(
    family: IpFamily,
    fe: &Frontend,
    endpoint: Option<(IpAddr, u16)>,
) -> ConntrackFilter {
    ConntrackFilter {
        family,
        protocol: Protocol::Udp,
        // NodePorts are matched on the port alone, whatever node address was used
        // (as kube-proxy does): the node-port address set may have changed too.
        orig_dst: match fe.kind {
            FrontendKind::NodePort => None,
            _ => fe.addr,
        },
        orig_dst_port: Some(fe.port),
        reply_src: endpoint.map(|e| e.0),
        reply_src_port: endpoint.map(|e| e.1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_model::{Endpoint, EndpointSet, Masquerade, ServicePortKey, TopologyMode};

    fn key(name: &str, protocol: Protocol) -> ServicePortKey {
        ServicePortKey {
            namespace: "default".into(),
            name: name.into(),
            port_name: "".into(),
            protocol,
            family: IpFamily::V4,
        }
    }

    fn ep(ip: &str, port: u16) -> Endpoint {
        Endpoint {
            ip: ip.parse().unwrap(),
            port,
            is_local: false,
            ready: true,
            serving: true,
            terminating: false,
        }
    }

    fn fe(kind: FrontendKind, addr: Option<&str>, port: u16, forward: bool) -> Frontend {
        Frontend {
            kind,
            addr: addr.map(|a| a.parse().unwrap()),
            port,
            endpoints: EndpointSet::Cluster,
            verdict: if forward {
                Verdict::Forward
            } else {
                Verdict::Reject
            },
            masquerade: Masquerade::OffCluster,
            short_circuit: false,
            source_ranges: None,
        }
    }

    /// A UDP DNS-like service: ClusterIP 10.96.0.10:53, external IP 192.0.2.10:53, NodePort 30053.
    fn svc(endpoints: &[(&str, u16)]) -> ServicePortPlan {
        let fwd = !endpoints.is_empty();
        ServicePortPlan {
            port: 53,
            frontends: vec![
                fe(FrontendKind::ClusterIp, Some("10.96.0.10"), 53, fwd),
                fe(FrontendKind::ExternalIp, Some("192.0.2.10"), 53, fwd),
                fe(FrontendKind::NodePort, None, 30053, fwd),
            ],
            cluster_endpoints: endpoints.iter().map(|(i, p)| ep(i, *p)).collect(),
            local_endpoints: vec![],
            affinity_timeout: None,
            internal_policy_local: false,
            external_policy_local: false,
            health_check_node_port: None,
            topology: TopologyMode::None,
            has_any_endpoints: fwd,
        }
    }

    fn plan(services: Vec<(ServicePortKey, ServicePortPlan)>) -> Plan {
        Plan {
            services: services.into_iter().map(|(k, v)| (k, v.into())).collect(),
            ..Default::default()
        }
    }

    fn f(dst: Option<&str>, port: u16, reply: Option<(&str, u16)>) -> ConntrackFilter {
        ConntrackFilter {
            family: IpFamily::V4,
            protocol: Protocol::Udp,
            orig_dst: dst.map(|d| d.parse().unwrap()),
            orig_dst_port: Some(port),
            reply_src: reply.map(|r| r.0.parse().unwrap()),
            reply_src_port: reply.map(|r| r.1),
        }
    }

    fn sorted(mut v: Vec<ConntrackFilter>) -> Vec<ConntrackFilter> {
        v.sort();
        v
    }

    #[test]
    fn first_endpoint_clears_every_frontend_destination() {
        let old = plan(vec![(key("dns", Protocol::Udp), svc(&[]))]);
        let new = plan(vec![(
            key("dns", Protocol::Udp),
            svc(&[("10.244.1.5", 5353)]),
        )]);
        assert_eq!(
            stale_udp_flows(&old, &new),
            sorted(vec![
                f(Some("10.96.0.10"), 53, None),
                f(Some("192.0.2.10"), 53, None),
                f(None, 30053, None),
            ])
        );
    }

    #[test]
    fn a_new_service_with_endpoints_clears_its_destinations_too() {
        let new = plan(vec![(
            key("dns", Protocol::Udp),
            svc(&[("10.244.1.5", 53)]),
        )]);
        assert_eq!(stale_udp_flows(&Plan::default(), &new).len(), 3);
    }

    #[test]
    fn removed_endpoint_clears_only_flows_it_answers() {
        let old = plan(vec![(
            key("dns", Protocol::Udp),
            svc(&[("10.244.1.5", 53), ("10.244.2.5", 53)]),
        )]);
        let new = plan(vec![(
            key("dns", Protocol::Udp),
            svc(&[("10.244.2.5", 53)]),
        )]);
        assert_eq!(
            stale_udp_flows(&old, &new),
            sorted(vec![
                f(Some("10.96.0.10"), 53, Some(("10.244.1.5", 53))),
                f(Some("192.0.2.10"), 53, Some(("10.244.1.5", 53))),
                f(None, 30053, Some(("10.244.1.5", 53))),
            ])
        );
    }

    #[test]
    fn removed_service_clears_flows_to_all_its_endpoints() {
        let old = plan(vec![(
            key("dns", Protocol::Udp),
            svc(&[("10.244.1.5", 53), ("10.244.2.5", 53)]),
        )]);
        assert_eq!(stale_udp_flows(&old, &Plan::default()).len(), 6);
    }

    #[test]
    fn endpoint_port_change_counts_as_removal() {
        let old = plan(vec![(
            key("dns", Protocol::Udp),
            svc(&[("10.244.1.5", 53)]),
        )]);
        let new = plan(vec![(
            key("dns", Protocol::Udp),
            svc(&[("10.244.1.5", 5353)]),
        )]);
        let got = stale_udp_flows(&old, &new);
        assert_eq!(got.len(), 3);
        assert!(got.iter().all(|f| f.reply_src_port == Some(53)));
    }

    #[test]
    fn tcp_and_unchanged_services_need_nothing() {
        let old = plan(vec![
            (key("web", Protocol::Tcp), svc(&[("10.244.1.5", 80)])),
            (key("dns", Protocol::Udp), svc(&[("10.244.1.5", 53)])),
        ]);
        let new = plan(vec![
            (key("web", Protocol::Tcp), svc(&[])),
            (key("dns", Protocol::Udp), svc(&[("10.244.1.5", 53)])),
        ]);
        assert!(stale_udp_flows(&old, &new).is_empty());
        assert!(stale_udp_flows(&new, &new).is_empty());
    }

    #[test]
    fn endpoint_moving_between_lists_is_not_removal() {
        let mut before = svc(&[("10.244.1.5", 53)]);
        before.local_endpoints = vec![];
        let mut after = svc(&[]);
        after.frontends = before.frontends.clone();
        after.local_endpoints = vec![ep("10.244.1.5", 53)];
        let old = plan(vec![(key("dns", Protocol::Udp), before)]);
        let new = plan(vec![(key("dns", Protocol::Udp), after)]);
        assert!(stale_udp_flows(&old, &new).is_empty());
    }

    #[test]
    fn added_frontend_address_is_cleared() {
        let old = plan(vec![(
            key("dns", Protocol::Udp),
            svc(&[("10.244.1.5", 53)]),
        )]);
        let mut with_lb = svc(&[("10.244.1.5", 53)]);
        with_lb.frontends.push(fe(
            FrontendKind::LoadBalancer,
            Some("198.51.100.7"),
            53,
            true,
        ));
        let new = plan(vec![(key("dns", Protocol::Udp), with_lb)]);
        assert_eq!(
            stale_udp_flows(&old, &new),
            vec![f(Some("198.51.100.7"), 53, None)]
        );
    }
}
