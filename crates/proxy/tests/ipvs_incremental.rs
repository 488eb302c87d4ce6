//! ipvs mode's per-change rendering lands where a full rendering would: after any sequence of
//! service port changes, [`Rendering::update`] with the changed keys gives exactly the full
//! rendering of the new plan, and what it reports changed (virtual servers, ipset entries, the
//! iptables text) is exactly what differs. The plans share endpoints, ClusterIPs and health
//! check ports between services, so entries and virtual servers are held by several of them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use proptest::prelude::*;
use weir_model::{
    Endpoint, EndpointSet, Frontend, FrontendKind, IpFamily, Masquerade, NodePortAddresses, Plan,
    Protocol, ServicePortKey, ServicePortPlan, TopologyMode, Verdict,
};
use weir_proxy::ipvs::incremental::Rendering;
use weir_proxy::ipvs::render::{render, Desired, EntryChange};
use weir_proxy::ipvs::IpvsOptions;

const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 10);

fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

fn endpoint(i: u8, local: bool) -> Endpoint {
    Endpoint {
        ip: v4(10, 244, 0, i),
        port: 8080,
        is_local: local,
        ready: true,
        serving: true,
        terminating: false,
    }
}

/// One service port from a handful of small choices (small on purpose: collisions between
/// services are the interesting part).
fn service_port() -> impl Strategy<Value = (u8, ServicePortPlan)> {
    (
        0u8..4,                                                   // name
        (0u8..3, 80u16..82),                                      // ClusterIP, port
        prop::option::of((0u8..2, any::<bool>(), any::<bool>())), // LB: ip, source ranges, local
        any::<bool>(),                                            // NodePort
        prop::option::of(0u8..2),                                 // externalIP
        (0u8..3, any::<bool>()),                                  // verdict, short circuit
        prop::collection::btree_set(1u8..5, 0..4), // endpoints (shared between services)
        (
            prop::option::of(Just(10800u32)),
            prop::option::of(Just(30999u16)),
        ),
    )
        .prop_map(
            |(name, (cip, port), lb, node_port, external, (verdict, short), eps, (aff, hc))| {
                let verdict = match verdict {
                    0 => Verdict::Forward,
                    1 => Verdict::Drop,
                    _ => Verdict::Reject,
                };
                let local = lb.is_some_and(|(_, _, l)| l);
                let fe = |kind, addr, port| Frontend {
                    kind,
                    addr,
                    port,
                    endpoints: if local && kind != FrontendKind::ClusterIp {
                        EndpointSet::Local
                    } else {
                        EndpointSet::Cluster
                    },
                    verdict: if kind == FrontendKind::ClusterIp {
                        Verdict::Forward
                    } else {
                        verdict
                    },
                    masquerade: if local && kind != FrontendKind::ClusterIp {
                        Masquerade::Never
                    } else {
                        Masquerade::OffCluster
                    },
                    short_circuit: short && kind != FrontendKind::ClusterIp,
                    source_ranges: None,
                };
                let mut frontends =
                    vec![fe(FrontendKind::ClusterIp, Some(v4(10, 96, 0, cip)), port)];
                if let Some((ip, ranges, _)) = lb {
                    let mut f = fe(FrontendKind::LoadBalancer, Some(v4(192, 0, 2, ip)), port);
                    if ranges {
                        f.source_ranges = Some(vec!["203.0.113.0/24".parse().unwrap()]);
                    }
                    frontends.push(f);
                }
                if node_port {
                    frontends.push(fe(FrontendKind::NodePort, None, 30000 + u16::from(name)));
                }
                if let Some(ip) = external {
                    frontends.push(fe(
                        FrontendKind::ExternalIp,
                        Some(v4(198, 51, 100, ip)),
                        port,
                    ));
                }
                let cluster_endpoints: Vec<Endpoint> =
                    eps.iter().map(|&i| endpoint(i, i % 2 == 0)).collect();
                let local_endpoints = cluster_endpoints
                    .iter()
                    .filter(|e| e.is_local)
                    .cloned()
                    .collect();
                let sp = ServicePortPlan {
                    port,
                    frontends,
                    has_any_endpoints: !cluster_endpoints.is_empty(),
                    cluster_endpoints,
                    local_endpoints,
                    affinity_timeout: aff,
                    internal_policy_local: false,
                    external_policy_local: local,
                    health_check_node_port: hc,
                    topology: TopologyMode::None,
                };
                (name, sp)
            },
        )
}

fn key(name: u8, udp: bool) -> ServicePortKey {
    ServicePortKey {
        namespace: "default".into(),
        name: format!("s{name}").into(),
        port_name: "".into(),
        protocol: if udp { Protocol::Udp } else { Protocol::Tcp },
        family: IpFamily::V4,
    }
}

/// A step: set (or, with `None`, delete) some service ports.
fn step() -> impl Strategy<Value = Vec<(u8, bool, Option<ServicePortPlan>)>> {
    prop::collection::vec(
        (any::<bool>(), prop::option::weighted(0.8, service_port())),
        1..3,
    )
    .prop_map(|changes| {
        changes
            .into_iter()
            .enumerate()
            .map(|(i, (udp, sp))| match sp {
                Some((name, sp)) => (name, udp, Some(sp)),
                None => (i as u8, udp, None),
            })
            .collect()
    })
}

fn plan(services: &BTreeMap<ServicePortKey, Arc<ServicePortPlan>>) -> Plan {
    Plan {
        services: services.clone(),
        node_port_addresses_v4: NodePortAddresses::List(BTreeSet::from([IpAddr::V4(NODE_IP)])),
        node_port_addresses_v6: NodePortAddresses::None,
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        masquerade_all: false,
        warnings: Vec::new(),
    }
}

/// `ipset restore` lines applied to the sets' entries.
fn apply_entries(before: &Desired, changes: &[EntryChange]) -> BTreeMap<String, BTreeSet<String>> {
    let mut sets: BTreeMap<String, BTreeSet<String>> = before
        .ipsets
        .iter()
        .map(|(n, s)| (n.clone(), s.entries.clone()))
        .collect();
    for c in changes {
        let set = sets.get_mut(&c.set).expect("a known set");
        if c.add {
            assert!(set.insert(c.entry.clone()), "added twice: {c}");
        } else {
            assert!(set.remove(&c.entry), "deleted but absent: {c}");
        }
    }
    sets
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn updates_equal_full_renderings(steps in prop::collection::vec(step(), 1..8)) {
        let opts = IpvsOptions::default();
        let node_ips = [IpAddr::V4(NODE_IP)];
        let mut services = BTreeMap::new();
        let mut rendering = Rendering::full(&plan(&services), IpFamily::V4, &node_ips, &opts);
        for step in steps {
            let before = rendering.desired.clone();
            let mut keys = BTreeSet::new();
            for (name, udp, sp) in step {
                let k = key(name, udp);
                match sp {
                    Some(sp) => services.insert(k.clone(), Arc::new(sp)),
                    None => services.remove(&k),
                };
                keys.insert(k);
            }
            let p = plan(&services);
            let changes = rendering.update(&p, &keys, &opts);
            let full = render(&p, IpFamily::V4, &node_ips, &opts);
            prop_assert_eq!(&rendering.desired, &full);
            let differing: BTreeSet<_> = before
                .services
                .keys()
                .chain(full.services.keys())
                .filter(|k| before.services.get(k) != full.services.get(k))
                .copied()
                .collect();
            prop_assert_eq!(&changes.servers, &differing);
            let sets = apply_entries(&before, &changes.ipset);
            let want: BTreeMap<String, BTreeSet<String>> =
                full.ipsets.iter().map(|(n, s)| (n.clone(), s.entries.clone())).collect();
            prop_assert_eq!(sets, want);
            let mut addresses = before.addresses.clone();
            for &(a, add) in &changes.addresses {
                prop_assert!(if add { addresses.insert(a) } else { addresses.remove(&a) }, "{a} {add}");
            }
            prop_assert_eq!(&addresses, &full.addresses);
            prop_assert_eq!(changes.iptables_changed, before.iptables != full.iptables);
        }
    }
}
