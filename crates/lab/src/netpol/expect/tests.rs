use super::*;
use crate::matrix;
use crate::netpol::objects;
use crate::topology::Topology;
use weir_policy::k8s_openapi::api::core::v1::{Namespace, Pod};
use weir_policy::k8s_openapi::api::networking::v1::NetworkPolicy;

/// The simulated policy lab and the oracle's cluster of the objects it would write.
fn lab(topo: &Topology) -> (LabState, Cluster) {
    let state = LabState::simulated(topo);
    let (mut ns, mut pods, mut pols) = (Vec::new(), Vec::new(), Vec::new());
    for (_, docs) in objects::render(topo, &state) {
        for d in docs {
            match d["kind"].as_str() {
                Some("Namespace") => ns.push(serde_json::from_value::<Namespace>(d).unwrap()),
                Some("Pod") => pods.push(serde_json::from_value::<Pod>(d).unwrap()),
                _ => pols.push(serde_json::from_value::<NetworkPolicy>(d).unwrap()),
            }
        }
    }
    let (cluster, warnings) = Cluster::from_objects(&ns, &pods, &pols);
    assert!(warnings.is_empty(), "{warnings:?}");
    (state, cluster)
}

fn verdicts(probes: &[Probe], kind: Kind) -> Vec<String> {
    probes
        .iter()
        .filter(|p| p.kind == kind)
        .map(|p| {
            let v = p.policy.map_or("-", Verdict::as_str);
            let from = if p.bind {
                p.from_ip.to_string()
            } else {
                p.from.clone()
            };
            format!("{from}>{} {} {v}", p.to, p.proto.as_str())
        })
        .collect()
}

#[test]
fn the_open_matrix_gets_the_oracles_verdicts() {
    let (state, cluster) = lab(&Topology::policy_demo());
    let mut probes = matrix::plan(&state);
    expect(&cluster, &state, &mut probes);
    assert!(probes.iter().all(|p| p.policy.is_some()));
    let other = verdicts(&probes, Kind::OtherNode);
    let has = |row: &str| assert!(other.contains(&row.to_string()), "{row}: {other:#?}");
    has("web>db tcp allowed"); // db-clients: podSelector app=web
    has("web>db udp denied"); // ... TCP 8080 only
    has("tool>db tcp allowed"); // namespaceSelector team=dev + podSelector app=tool
    has("peer>web tcp denied"); // default-deny
    has("peer>tool tcp allowed"); // dev is not isolated for ingress
    has("tool>peer tcp denied"); // tool-egress: prod only
    has("db>web tcp denied");
    let same = verdicts(&probes, Kind::SameNode);
    assert!(same.contains(&"tool>web tcp denied".into()), "{same:#?}");
    assert!(same.contains(&"web>tool udp allowed".into()), "{same:#?}");
    let outside = verdicts(&probes, Kind::Outside);
    assert!(outside.contains(&"tool>outside tcp allowed".into())); // ipBlock 198.51.100.1/32
    assert!(outside.contains(&"tool>outside udp denied".into()));
    assert!(outside.contains(&"peer>outside udp allowed".into()));
    let own = verdicts(&probes, Kind::OwnNode);
    assert!(own.contains(&"tool>a tcp denied".into()), "{own:#?}"); // egress to its node
    assert!(own.contains(&"db>b tcp allowed".into()));
}

#[test]
fn service_rows_are_judged_after_dnat_and_before_masquerade() {
    let (state, cluster) = lab(&Topology::policy_demo());
    let rows = service_rows(&cluster, &state);
    assert_eq!(
        verdicts(&rows, Kind::ClusterIp),
        [
            "web>db tcp allowed",
            "tool>db tcp allowed",
            "peer>db tcp denied"
        ]
    );
    assert!(rows
        .iter()
        .filter(|p| p.kind == Kind::ClusterIp)
        .all(|p| p.port == 5432 && p.expect_answer == "db" && p.expect_source == Some(p.from_ip)));
    assert_eq!(
        verdicts(&rows, Kind::NodePort),
        [
            "198.51.100.1>web via a tcp allowed",
            "198.51.100.200>web via a tcp denied", // web-from-outside's except
            "198.51.100.1>dbnp via a tcp allowed",
            "198.51.100.1>dbnp via b tcp denied",
            "198.51.100.200>dbnp via a tcp allowed",
            "198.51.100.200>dbnp via b tcp denied",
        ]
    );
    let row = |to: &str, from: [u8; 4]| {
        rows.iter()
            .find(|p| p.to == to && p.from_ip == IpAddr::from(from))
            .unwrap()
    };
    // Local: the outside's address is kept.
    let web = row("web via a", [198, 51, 100, 200]);
    assert_eq!(web.expect_source, Some(IpAddr::from([198, 51, 100, 200])));
    assert_eq!(
        (web.to_ip, web.port),
        (IpAddr::from([172, 30, 0, 11]), 30080)
    );
    // Cluster, backend elsewhere: node a masquerades before the packet leaves; db-from-nodes
    // allows the underlay.
    let via_a = row("dbnp via a", [198, 51, 100, 1]);
    assert_eq!(via_a.expect_source, Some(IpAddr::from([172, 30, 0, 11])));
    // Cluster, backend on the node dialled: db sees cni0's address, but the policy saw the
    // outside's (the masquerade comes after the forward hook).
    let via_b = row("dbnp via b", [198, 51, 100, 1]);
    assert_eq!(via_b.expect_source, Some(IpAddr::from([10, 244, 2, 1])));
}

#[test]
fn the_eni_variant_masquerades_to_the_underlay_address() {
    let (state, cluster) = lab(&Topology::policy_eni_demo());
    let rows = service_rows(&cluster, &state);
    let via_a = rows
        .iter()
        .find(|p| p.to == "dbnp via a" && p.from_ip == IpAddr::from([198, 51, 100, 1]))
        .unwrap();
    assert_eq!(via_a.expect_source, Some(IpAddr::from([10, 12, 97, 11])));
    assert_eq!(via_a.policy, Some(Verdict::Allowed));
    // A local pod behind an addressless host veth sees eth0's address.
    let via_b = rows
        .iter()
        .find(|p| p.to == "dbnp via b" && p.from_ip == IpAddr::from([198, 51, 100, 1]))
        .unwrap();
    assert_eq!(via_b.expect_source, Some(IpAddr::from([10, 12, 97, 12])));
    assert_eq!(via_b.policy, Some(Verdict::Denied));
}

#[test]
fn endpoints_by_address() {
    let (state, cluster) = lab(&Topology::policy_demo());
    let at = |ip: [u8; 4]| endpoint(&cluster, &state, IpAddr::from(ip));
    assert!(matches!(at([10, 244, 1, 2]), Endpoint::Pod { pod, .. } if &*pod.name == "web"));
    assert!(matches!(at([172, 30, 0, 12]), Endpoint::Node { node, .. } if &*node == "b"));
    assert!(matches!(at([10, 244, 1, 1]), Endpoint::Node { node, .. } if &*node == "a"));
    assert!(matches!(at([198, 51, 100, 1]), Endpoint::Outside(_)));
    // An address no pod holds (yet) is the outside's, as the agents would see it.
    assert!(matches!(at([10, 244, 1, 99]), Endpoint::Outside(_)));
}

#[test]
fn a_dual_stack_lab_judges_both_families() {
    let text = crate::topology::POLICY_TOPOLOGY.replacen(
        "\nserviceCIDR: 10.96.0.0/16\n",
        "\nserviceCIDR: 10.96.0.0/16\nipv6: {}\n",
        1,
    );
    let (state, cluster) = lab(&Topology::parse(&text).unwrap());
    // Pods carry both addresses, and a node's IPv6 addresses are the node's.
    let at = |ip: &str| endpoint(&cluster, &state, ip.parse().unwrap());
    assert!(matches!(at("fd00:10:244:1::2"), Endpoint::Pod { .. }));
    assert!(matches!(at("fd00:172:30::b"), Endpoint::Node { .. }));
    assert!(matches!(at("fd00:10:244:1::1"), Endpoint::Node { .. }));
    let mut probes = matrix::plan(&state);
    expect(&cluster, &state, &mut probes);
    let v6: Vec<&Probe> = probes.iter().filter(|p| p.to_ip.is_ipv6()).collect();
    assert_eq!(v6.len() * 2, probes.len(), "each row once per family");
    let same = |v4: &Probe| {
        v6.iter()
            .find(|p| p.from == v4.from && p.to == v4.to && p.proto == v4.proto)
            .map(|p| p.policy)
    };
    // Pod rows: the same verdict in both families (the policies select by label).
    for p in probes.iter().filter(|p| p.to_ip.is_ipv4()) {
        if matches!(p.kind, Kind::SameNode | Kind::OtherNode | Kind::OwnNode) {
            assert_eq!(same(p), Some(p.policy), "{p:?}");
        }
    }
    // Service rows over IPv6: ClusterIP after DNAT as in IPv4; the NodePort rows are denied
    // because both ingress ipBlocks are IPv4 only.
    let rows = service_rows(&cluster, &state);
    let six: Vec<Probe> = rows.iter().filter(|p| p.to_ip.is_ipv6()).cloned().collect();
    assert_eq!(
        verdicts(&six, Kind::ClusterIp),
        [
            "web>db tcp allowed",
            "tool>db tcp allowed",
            "peer>db tcp denied"
        ]
    );
    assert_eq!(
        verdicts(&six, Kind::NodePort),
        [
            "fd00:198:51:100::1>web via a tcp denied",
            "fd00:198:51:100::1>dbnp via a tcp denied",
            "fd00:198:51:100::1>dbnp via b tcp denied",
        ]
    );
    let via_a = six.iter().find(|p| p.to == "dbnp via a").unwrap();
    assert_eq!(via_a.expect_source, Some("fd00:172:30::b".parse().unwrap()));
    let via_b = six.iter().find(|p| p.to == "dbnp via b").unwrap();
    assert_eq!(
        via_b.expect_source,
        Some("fd00:10:244:2::1".parse().unwrap())
    );
}
