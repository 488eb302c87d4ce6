//! What the dual-stack lab tests share (lab_dualstack on this kernel, proxy_ipvs_vm in the
//! VM): `weir lab check --json`'s rows by family, and the assertion that every probe passed in
//! both families with every IPv6 row there.

use std::collections::BTreeMap;

use serde_json::Value;

pub fn s(v: &Value, k: &str) -> String {
    v[k].as_str().unwrap_or_default().to_string()
}

pub fn is_v6(v: &Value, k: &str) -> bool {
    s(v, k)
        .parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_ipv6())
}

/// (kind → count) of the rows whose destination is IPv6 / IPv4.
pub fn kinds(rows: &[Value], v6: bool) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for r in rows.iter().filter(|r| is_v6(r, "to_ip") == v6) {
        *m.entry(s(r, "kind")).or_default() += 1;
    }
    m
}

pub fn failures(rows: &[Value]) -> Vec<String> {
    rows.iter()
        .filter(|r| r["ok"] != true)
        .map(|r| {
            format!(
                "{} {} → {} {} ({}): {}",
                s(r, "service"),
                s(r, "from"),
                s(r, "to_ip"),
                s(r, "kind"),
                s(r, "proto"),
                s(r, "error")
            )
        })
        .collect()
}

/// Every probe of check's JSON `v` passed; the matrix (4 pods) has its 80 rows, every IPv4
/// row with its IPv6 twin (pod → outside masqueraded to the node's IPv6 address); the
/// services have an IPv6 twin of every row but LoadBalancer IPs and health checks, answered
/// from IPv6 sources, with the client's source kept on NodePorts of policy Local (but in
/// `userspace` `mode`).
pub fn assert_every_probe_in_both_families(v: &Value, mode: &str) {
    let matrix = v["matrix"].as_array().unwrap().clone();
    let services = v["services"].as_array().unwrap().clone();
    let mut bad = failures(&matrix);
    bad.extend(failures(&services));
    assert!(
        bad.is_empty(),
        "{} probes failed:\n{}",
        bad.len(),
        bad.join("\n")
    );

    // The matrix: every IPv4 row has its IPv6 twin, one family per probe.
    assert_eq!(matrix.len(), 80);
    assert_eq!(kinds(&matrix, true), kinds(&matrix, false));
    for r in matrix.iter().filter(|r| is_v6(r, "to_ip")) {
        assert!(is_v6(r, "from_ip") && is_v6(r, "seen_source"), "{r}");
        if s(r, "kind") == "outside" {
            // Masqueraded to the node's IPv6 underlay address.
            let node = if s(r, "from").starts_with('a') {
                "b"
            } else {
                "c"
            };
            assert_eq!(s(r, "seen_source"), format!("fd00:172:30::{node}"), "{r}");
        }
    }
    // The services: IPv6 twins of every row but LoadBalancer IPs and health checks.
    let mut want = kinds(&services, false);
    for k in ["load-balancer", "pod-load-balancer", "health-check"] {
        want.remove(k);
    }
    assert_eq!(kinds(&services, true), want);
    for r in services.iter().filter(|r| is_v6(r, "to_ip")) {
        assert!(is_v6(r, "from_ip"), "{r}");
        for a in r["answers"].as_array().unwrap() {
            assert!(is_v6(a, "source"), "{r}");
        }
        // The client's source kept (a user-space proxy connects from the node instead).
        if s(r, "kind") == "node-port-local"
            && mode != "userspace"
            && !r["answers"].as_array().unwrap().is_empty()
        {
            assert_eq!(s(&r["answers"][0], "source"), "fd00:198:51:100::1", "{r}");
        }
    }
}
