//! End-to-end tests of the NetworkPolicy lab (weir_lab::POLICY_TOPOLOGY, bridge mode, and
//! weir_lab::POLICY_ENI_TOPOLOGY, eni-shared mode): pods in three namespaces on two nodes,
//! five policies (a default deny, a podSelector+namespaceSelector allow, an ipBlock with an
//! except, an egress policy, an ipBlock for masqueraded NodePort traffic), `weir policy`,
//! `weir proxy` and the CNI on every node. Every row's EXPECTED is weir-policy's oracle on the
//! objects the lab wrote; the OBSERVED column is real TCP/UDP probes; one mismatch fails.
//! Then the policies are deleted: the oracle, reading the objects again, expects every row
//! allowed, and every row must now answer, so each denied row was the policy's drop and the
//! expectations follow the objects. Needs root, `ip` and `nft`.
//!
//! Each test uses its own lab name (tag + pid) and state directory; a guard runs `weir lab down`.

use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::*;

fn runnable_here() -> bool {
    weir_testkit::can_run(weir_testkit::missing(true, &["ip", "nft"]))
}

/// An embedded topology under this lab's name.
fn topology(lab: &Lab, text: &str, name: &str) -> std::path::PathBuf {
    let body = text.replacen(
        &format!("\nname: {name}\n"),
        &format!("\nname: {}\n", lab.name),
        1,
    );
    assert_ne!(body, text, "the topology names itself {name}");
    let path = lab.state.path().join("topology-input.yaml");
    std::fs::write(&path, body).unwrap();
    path
}

fn check(lab: &Lab) -> (bool, Vec<Value>) {
    let out = lab.weir(&["lab", "check", &lab.name, "--json"]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "check --json: {e}\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(
        json["policy_agents"]
            .as_array()
            .is_some_and(|a| a.len() == 2 && a.iter().all(|a| a["alive"] == true)),
        "{}",
        json["policy_agents"]
    );
    (
        out.status.success(),
        json["matrix"].as_array().unwrap().clone(),
    )
}

fn table(lab: &Lab) -> String {
    String::from_utf8_lossy(&lab.weir(&["lab", "check", &lab.name]).stdout).into_owned()
}

/// (kind, expected verdict) → how many rows.
fn count(rows: &[Value], kind: &str, verdict: &str) -> usize {
    rows.iter()
        .filter(|r| r["kind"] == kind && r["policy"] == verdict)
        .count()
}

/// The row from `from` (a pod, or the outside's address) to `to` over `proto`.
fn row<'a>(rows: &'a [Value], from: &str, to: &str, proto: &str) -> &'a Value {
    rows.iter()
        .find(|r| {
            (r["from"] == from || r["from_ip"] == from) && r["to"] == to && r["proto"] == proto
        })
        .unwrap_or_else(|| panic!("no row {from} -> {to} {proto}"))
}

/// Waits until no node's `table inet weir-policy` has a pod chain left (the agents followed
/// the deleted policies).
fn wait_unenforced(lab: &Lab) {
    let deadline = Instant::now() + weir_lab::startup_timeout(Duration::from_secs(20));
    for node in ["a", "b"] {
        loop {
            let out = lab.ok(&[
                "lab",
                "exec",
                &lab.name,
                node,
                "--",
                "nft",
                "list",
                "table",
                "inet",
                "weir-policy",
            ]);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            if !text.contains("chain ingress_") && !text.contains("chain egress_") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {node} still enforces:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn policy_lab(tag: &str, text: &str, name: &str, masquerade: &str) {
    if !runnable_here() {
        return;
    }
    weir_cni();
    let lab = Lab::new(tag);
    let topo = topology(&lab, text, name);
    lab.ok(&["lab", "up", topo.to_str().unwrap()]);
    let (ok, rows) = check(&lab);
    if !ok {
        eprintln!("{}", table(&lab));
    }
    for r in &rows {
        assert_eq!(r["ok"], true, "{r}");
        assert_eq!(r["observed"], r["policy"], "{r}");
    }
    assert!(ok);
    // Every kind the brief names has allowed and denied rows.
    for kind in [
        "same-node",
        "other-node",
        "own-node",
        "outside",
        "cluster-ip",
        "node-port",
    ] {
        assert!(count(&rows, kind, "allowed") > 0, "no allowed {kind} row");
        assert!(count(&rows, kind, "denied") > 0, "no denied {kind} row");
    }
    // ipBlock except: web's NodePort answers the outside's own address, not the excepted one.
    assert_eq!(
        row(&rows, "198.51.100.1", "web via a", "tcp")["observed"],
        "allowed"
    );
    assert_eq!(
        row(&rows, "198.51.100.200", "web via a", "tcp")["observed"],
        "denied"
    );
    // Masquerade: through node a, db sees node a's address (allowed by db-from-nodes); on
    // node b itself, the policy saw the outside's address before the masquerade (denied).
    let via_a = row(&rows, "198.51.100.1", "dbnp via a", "tcp");
    assert_eq!(via_a["seen_source"], masquerade, "{via_a}");
    assert_eq!(
        row(&rows, "198.51.100.1", "dbnp via b", "tcp")["observed"],
        "denied"
    );
    // Egress: tool reaches the outside on TCP 8080 only.
    assert_eq!(row(&rows, "tool", "outside", "tcp")["observed"], "allowed");
    assert_eq!(row(&rows, "tool", "outside", "udp")["observed"], "denied");

    // The policies deleted: the oracle now expects every row allowed, and every row answers.
    std::fs::remove_file(lab.lab_dir().join("manifests").join("policies.yaml")).unwrap();
    wait_unenforced(&lab);
    let (ok, open) = check(&lab);
    if !ok {
        eprintln!("{}", table(&lab));
    }
    assert_eq!(open.len(), rows.len());
    for r in &open {
        assert_eq!(
            (&r["policy"], &r["ok"]),
            (&"allowed".into(), &true.into()),
            "{r}"
        );
    }
    assert!(ok);
}

#[test]
fn policy_rows_pass_in_bridge_mode() {
    policy_lab("pol", weir_lab::POLICY_TOPOLOGY, "policy", "172.30.0.11");
}

#[test]
fn policy_rows_pass_in_eni_shared_mode() {
    policy_lab(
        "pole",
        weir_lab::POLICY_ENI_TOPOLOGY,
        "policyeni",
        "10.12.97.11",
    );
}
