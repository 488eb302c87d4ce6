//! The zone against the specification's record forms, table-style.

use std::path::Path;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{Name, RecordType};
use weir_model::Snapshot;

use crate::zone::{Answer, Zone, ZoneConfig};

/// The objects of every case below: a ClusterIP service (dual-stack, named and unnamed
/// ports), a headless service (hostname'd, hostname-less, not-ready endpoints; a second
/// slice), a headless one publishing not-ready addresses, one with no endpoints, and an
/// ExternalName.
pub(crate) const OBJECTS: &str = include_str!("../tests/fixtures/cluster.yaml");

pub(crate) fn snapshot(yaml: &str) -> Snapshot {
    let parsed = weir_source::parse_manifest(Path::new("test.yaml"), yaml);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    Snapshot::from_objects(&parsed.objects)
}

fn zone() -> Zone {
    let z = Zone::build(
        &snapshot(OBJECTS),
        &ZoneConfig::new("cluster.local").unwrap(),
    );
    assert!(z.warnings.is_empty(), "{:?}", z.warnings);
    z
}

/// (rcode, the answers' data as text sorted, authority record types).
fn ask(z: &Zone, name: &str, qtype: RecordType) -> (ResponseCode, Vec<String>, Vec<RecordType>) {
    match z.lookup(&Name::from_ascii(name).unwrap(), qtype) {
        Answer::Authoritative {
            rcode,
            answers,
            authority,
        } => {
            for r in &answers {
                // Owner names keep the query's spelling.
                assert_eq!(r.name.to_ascii(), name, "owner of {r}");
                assert_eq!(r.ttl, 5);
            }
            let mut data: Vec<String> = answers.iter().map(|r| r.data.to_string()).collect();
            data.sort();
            (
                rcode,
                data,
                authority.iter().map(|r| r.record_type()).collect(),
            )
        }
        Answer::NotInZone => panic!("{name} is not in the zone"),
    }
}

fn ok(data: &[&str]) -> (ResponseCode, Vec<String>, Vec<RecordType>) {
    let mut d: Vec<String> = data.iter().map(|s| s.to_string()).collect();
    d.sort();
    (ResponseCode::NoError, d, vec![])
}
const NODATA: (ResponseCode, Vec<String>, Vec<RecordType>) =
    (ResponseCode::NoError, vec![], vec![]);

fn nodata() -> (ResponseCode, Vec<String>, Vec<RecordType>) {
    (NODATA.0, NODATA.1, vec![RecordType::SOA])
}
fn nxdomain() -> (ResponseCode, Vec<String>, Vec<RecordType>) {
    (ResponseCode::NXDomain, vec![], vec![RecordType::SOA])
}

#[test]
fn records_per_the_specification() {
    use RecordType::*;
    let z = zone();
    let cases: Vec<(&str, RecordType, _)> = vec![
        // 2.3.1 ClusterIP A/AAAA.
        ("web.shop.svc.cluster.local.", A, ok(&["10.96.0.20"])),
        ("web.shop.svc.cluster.local.", AAAA, ok(&["fd00:96::20"])),
        // Case-insensitive; the answer keeps the query's case.
        ("WEB.Shop.SVC.cluster.LOCAL.", A, ok(&["10.96.0.20"])),
        // 2.3.2 SRV for named ports only, target the service name.
        (
            "_http._tcp.web.shop.svc.cluster.local.",
            SRV,
            ok(&["0 100 80 web.shop.svc.cluster.local."]),
        ),
        (
            "_dns._udp.web.shop.svc.cluster.local.",
            SRV,
            ok(&["0 100 53 web.shop.svc.cluster.local."]),
        ),
        ("_dns._tcp.web.shop.svc.cluster.local.", SRV, nxdomain()),
        // 2.3.3 PTR of the cluster IPs.
        (
            "20.0.96.10.in-addr.arpa.",
            PTR,
            ok(&["web.shop.svc.cluster.local."]),
        ),
        (
            "0.2.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.0.d.f.ip6.arpa.",
            PTR,
            ok(&["web.shop.svc.cluster.local."]),
        ),
        // 2.4.1 headless: one A per ready endpoint (both slices), none for not-ready.
        (
            "db.shop.svc.cluster.local.",
            A,
            ok(&["10.244.1.5", "10.244.2.6"]),
        ),
        ("db.shop.svc.cluster.local.", AAAA, ok(&["fd00:244::9"])),
        ("db-0.db.shop.svc.cluster.local.", A, ok(&["10.244.1.5"])),
        // Hostname-less endpoint: the dashed address.
        (
            "10-244-2-6.db.shop.svc.cluster.local.",
            A,
            ok(&["10.244.2.6"]),
        ),
        (
            "db-9.db.shop.svc.cluster.local.",
            AAAA,
            ok(&["fd00:244::9"]),
        ),
        ("db-2.db.shop.svc.cluster.local.", A, nxdomain()),
        // 2.4.2 headless SRV: one per ready endpoint, the endpoint's hostname and port.
        (
            "_pg._tcp.db.shop.svc.cluster.local.",
            SRV,
            ok(&[
                "0 100 5432 db-0.db.shop.svc.cluster.local.",
                "0 100 5432 10-244-2-6.db.shop.svc.cluster.local.",
                "0 100 5432 db-9.db.shop.svc.cluster.local.",
            ]),
        ),
        // 2.4.3 PTR of endpoint IPs → the endpoint's name.
        (
            "5.1.244.10.in-addr.arpa.",
            PTR,
            ok(&["db-0.db.shop.svc.cluster.local."]),
        ),
        // publishNotReadyAddresses keeps not-ready endpoints.
        ("peers.shop.svc.cluster.local.", A, ok(&["10.244.3.3"])),
        // A headless service without ready endpoints exists: NODATA.
        ("empty.shop.svc.cluster.local.", A, nodata()),
        // 2.5 ExternalName → CNAME, whatever type is asked.
        ("ext.shop.svc.cluster.local.", A, ok(&["db.example.com."])),
        (
            "ext.shop.svc.cluster.local.",
            CNAME,
            ok(&["db.example.com."]),
        ),
        // 2.2 schema version.
        ("dns-version.cluster.local.", TXT, ok(&["1.0.1"])),
        // Apex SOA and NS.
        ("cluster.local.", NS, ok(&["ns.dns.cluster.local."])),
        (
            "cluster.local.",
            SOA,
            ok(&["ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 5"]),
        ),
        // NODATA vs NXDOMAIN: an A-only name asked for AAAA; empty non-terminals.
        ("_http._tcp.web.shop.svc.cluster.local.", A, nodata()),
        ("db-0.db.shop.svc.cluster.local.", AAAA, nodata()),
        ("shop.svc.cluster.local.", A, nodata()),
        ("svc.cluster.local.", A, nodata()),
        ("nope.shop.svc.cluster.local.", A, nxdomain()),
        ("web.other.svc.cluster.local.", A, nxdomain()),
        ("web.shop.cluster.local.", A, nxdomain()),
    ];
    for (name, qtype, want) in cases {
        assert_eq!(ask(&z, name, qtype), want, "{name} {qtype}");
    }
}

#[test]
fn namespaces_with_services_are_known() {
    let z = zone();
    assert!(z.has_namespace("shop") && z.has_namespace("SHOP"));
    assert!(!z.has_namespace("com") && !z.has_namespace("a.b"));
}

#[test]
fn names_outside_the_zone_are_not_ours() {
    let z = zone();
    for name in [
        "example.com.",
        "cluster.local.example.com.",
        "1.1.1.1.in-addr.arpa.",
        "local.",
    ] {
        assert_eq!(
            z.lookup(&Name::from_ascii(name).unwrap(), RecordType::A),
            Answer::NotInZone,
            "{name}"
        );
    }
    // A query without the trailing dot is still the absolute name.
    let (rc, data, _) = ask_relative(&z, "web.shop.svc.cluster.local");
    assert_eq!(
        (rc, data),
        (ResponseCode::NoError, vec!["10.96.0.20".to_string()])
    );
}

fn ask_relative(z: &Zone, name: &str) -> (ResponseCode, Vec<String>, Vec<RecordType>) {
    match z.lookup(&Name::from_ascii(name).unwrap(), RecordType::A) {
        Answer::Authoritative {
            rcode,
            answers,
            authority,
        } => (
            rcode,
            answers.iter().map(|r| r.data.to_string()).collect(),
            authority.iter().map(|r| r.record_type()).collect(),
        ),
        Answer::NotInZone => panic!("not in zone"),
    }
}

#[test]
fn external_name_target_outside_the_zone_is_reported_for_chasing() {
    let z = zone();
    let ext = Name::from_ascii("ext.shop.svc.cluster.local.").unwrap();
    let a = z.lookup(&ext, RecordType::A);
    assert_eq!(
        a.cname_outside(&z, RecordType::A),
        Some(Name::from_ascii("db.example.com.").unwrap())
    );
    // Asked for the CNAME itself (or ANY): nothing to chase (this once sent a CNAME query
    // for the target upstream and delayed the answer by an upstream timeout).
    let c = z.lookup(&ext, RecordType::CNAME);
    assert_eq!(c.cname_outside(&z, RecordType::CNAME), None);
    assert_eq!(c.cname_outside(&z, RecordType::ANY), None);
    let web = Name::from_ascii("web.shop.svc.cluster.local.").unwrap();
    let a = z.lookup(&web, RecordType::A);
    assert_eq!(a.cname_outside(&z, RecordType::A), None);
}

#[test]
fn bad_objects_are_skipped_with_a_warning_and_the_rest_served() {
    let yaml = r#"
apiVersion: v1
kind: Service
metadata: {name: good, namespace: a}
spec: {clusterIP: 10.96.1.1}
---
apiVersion: v1
kind: Service
metadata: {name: bad-ext, namespace: a}
spec: {type: ExternalName, externalName: "a..b"}
"#;
    let mut objects = snapshot(yaml);
    // The manifest parser rejects a bad clusterIP itself; an API source might not.
    let mut bad = weir_model::k8s_openapi::api::core::v1::Service::default();
    bad.metadata.name = Some("bad-ip".into());
    bad.metadata.namespace = Some("a".into());
    bad.spec = Some(weir_model::k8s_openapi::api::core::v1::ServiceSpec {
        cluster_ip: Some("10.96.1.x".into()),
        ..Default::default()
    });
    objects.insert(bad.into());
    let z = Zone::build(&objects, &ZoneConfig::new("cluster.local").unwrap());
    assert_eq!(z.warnings.len(), 2, "{:?}", z.warnings);
    assert_eq!(
        ask(&z, "good.a.svc.cluster.local.", RecordType::A),
        ok(&["10.96.1.1"])
    );
    // The broken ClusterIP service still exists (NODATA), its clusterIP is not served.
    assert_eq!(
        ask(&z, "bad-ip.a.svc.cluster.local.", RecordType::A),
        nodata()
    );
}

#[test]
fn ttl_and_zone_are_configurable() {
    let mut cfg = ZoneConfig::new("Corp.Example").unwrap();
    cfg.ttl = 30;
    cfg.ns_addresses = vec!["10.96.0.10".parse().unwrap()];
    let z = Zone::build(&snapshot(OBJECTS), &cfg);
    let a = z.lookup(
        &Name::from_ascii("web.shop.svc.corp.example.").unwrap(),
        RecordType::A,
    );
    let Answer::Authoritative { answers, .. } = a else {
        panic!("not in zone")
    };
    assert_eq!(answers[0].ttl, 30);
    assert_eq!(
        ask_relative(&z, "ns.dns.corp.example.").1,
        vec!["10.96.0.10".to_string()]
    );
    assert!(ZoneConfig::new(".").is_err());
    assert!(ZoneConfig::new("a..b").is_err());
}

#[test]
fn pod_records_disabled_and_insecure() {
    use crate::zone::{pod_address, PodRecords};
    use RecordType::*;
    let names = [
        "10-244-1-2.shop.pod.cluster.local.",
        "pod.cluster.local.",
        "shop.pod.cluster.local.",
    ];
    // Disabled (the default): no pod names at all.
    let z = zone();
    for n in names {
        assert_eq!(ask(&z, n, A), nxdomain(), "{n}");
    }

    let mut cfg = ZoneConfig::new("cluster.local").unwrap();
    cfg.pods = PodRecords::Insecure;
    let z = Zone::build(&snapshot(OBJECTS), &cfg);
    assert_eq!(ask(&z, names[0], A), ok(&["10.244.1.2"]));
    // Any namespace, case-insensitively; the address only as the type it is.
    assert_eq!(
        ask(&z, "10-244-1-2.No-Such-Ns.POD.cluster.local.", A),
        ok(&["10.244.1.2"])
    );
    assert_eq!(ask(&z, names[0], AAAA), nodata());
    assert_eq!(
        ask(&z, "fd00-244--9.shop.pod.cluster.local.", AAAA),
        ok(&["fd00:244::9"])
    );
    assert_eq!(ask(&z, "fd00-244--9.shop.pod.cluster.local.", A), nodata());
    // The parents exist without records.
    assert_eq!(ask(&z, names[1], A), nodata());
    assert_eq!(ask(&z, names[2], A), nodata());
    // Not an address, or too deep: NXDOMAIN.
    for n in [
        "10-244-1.shop.pod.cluster.local.",
        "10-244-1-256.shop.pod.cluster.local.",
        "web.shop.pod.cluster.local.",
        "x.10-244-1-2.shop.pod.cluster.local.",
        "10-244-1-2.shop.pods.cluster.local.",
    ] {
        assert_eq!(ask(&z, n, A), nxdomain(), "{n}");
    }
    // Services are unaffected.
    assert_eq!(
        ask(&z, "web.shop.svc.cluster.local.", A),
        ask(&zone(), "web.shop.svc.cluster.local.", A)
    );
    assert_eq!(pod_address("1-2-3-4"), Some("1.2.3.4".parse().unwrap()));
    assert_eq!(pod_address("--1"), Some("::1".parse().unwrap()));
    assert_eq!(pod_address("01-2-3-4"), None);
    assert_eq!(pod_address(""), None);
}

/// Verified pod names: an address answers only in the namespace of a running Pod holding it
/// (either of its IPs); another namespace, an address nobody holds, and a finished Pod's
/// address are NXDOMAIN. Without Pods in the snapshot nothing verifies.
#[test]
fn pod_records_verified_answer_only_addresses_a_pod_in_the_namespace_holds() {
    use crate::zone::PodRecords;
    use RecordType::*;
    let pods = "
apiVersion: v1
kind: Pod
metadata: {name: api-0, namespace: shop}
status: {phase: Running, podIP: 10.244.1.2, podIPs: [{ip: 10.244.1.2}, {ip: 'fd00:244::9'}]}
---
apiVersion: v1
kind: Pod
metadata: {name: job, namespace: shop}
status: {phase: Succeeded, podIP: 10.244.1.3}
";
    let mut cfg = ZoneConfig::new("cluster.local").unwrap();
    cfg.pods = PodRecords::Verified;
    let z = Zone::build(&snapshot(&format!("{OBJECTS}\n---\n{pods}")), &cfg);
    assert_eq!(
        ask(&z, "10-244-1-2.shop.pod.cluster.local.", A),
        ok(&["10.244.1.2"])
    );
    assert_eq!(
        ask(&z, "10-244-1-2.SHOP.pod.cluster.local.", A),
        ok(&["10.244.1.2"])
    );
    assert_eq!(
        ask(&z, "fd00-244--9.shop.pod.cluster.local.", AAAA),
        ok(&["fd00:244::9"])
    );
    assert_eq!(
        ask(&z, "10-244-1-2.shop.pod.cluster.local.", AAAA),
        nodata()
    );
    for n in [
        "10-244-1-2.other.pod.cluster.local.",
        "10-244-1-4.shop.pod.cluster.local.",
        "10-244-1-3.shop.pod.cluster.local.",
    ] {
        assert_eq!(ask(&z, n, A), nxdomain(), "{n}");
    }
    let z = Zone::build(&snapshot(OBJECTS), &cfg);
    assert_eq!(ask(&z, "10-244-1-2.shop.pod.cluster.local.", A), nxdomain());
}
