//! The dual-stack lab on the real kernel (issue 22): weir_lab::DUAL_STACK_TOPOLOGY brought up
//! with each proxy mode this kernel has (nftables, iptables, userspace; ipvs needs the qemu
//! VM: `dual_stack_lab_ipvs_in_the_vm` in proxy_ipvs_vm.rs makes the same assertions), and
//! `weir lab check`: every probe of the connectivity matrix and of the services passes in both
//! families, and the IPv6 rows are there — pod → pod on the same and the other node, pod → own
//! node, pod → outside (masqueraded to the node's IPv6 address), and for every Service its IPv6
//! ClusterIP, hairpin, host network, NodePorts on each node's IPv6 address from the outside and
//! from a pod, and the Service without endpoints. Needs root.
//!
//! Each test has its own lab name (tag + pid) and state directory; `weir lab down` runs on drop,
//! also after a panic.

use std::path::PathBuf;

use serde_json::Value;

mod common;
use common::dualstack::{assert_every_probe_in_both_families, failures, kinds};
use common::*;

/// The dual-stack demo topology under this lab's name, with `overlay` (host-gw or vxlan).
fn topology(lab: &Lab, overlay: &str) -> PathBuf {
    let yaml = weir_lab::DUAL_STACK_TOPOLOGY
        .replacen("name: dual", &format!("name: {}", lab.name), 1)
        .replacen("cni: weir", &format!("cni: weir\noverlay: {overlay}"), 1);
    let path = lab.state.path().join("topology-input.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

fn dual_stack(tag: &str, mode: &str, overlay: &str) {
    if !runnable() {
        return;
    }
    weir_cni();
    let lab = Lab::new(tag);
    let topo = topology(&lab, overlay);
    lab.ok(&["lab", "up", topo.to_str().unwrap(), "--proxy-mode", mode]);

    // What the lab made: both families on pods and nodes, routes to the other node's IPv6
    // podCIDR from `weir routes`, Node objects with both podCIDRs.
    let state = weir_lab::LabState::load(&lab.lab_dir().join("state.json")).unwrap();
    assert_eq!(
        state.outside6.map(|a| a.to_string()).as_deref(),
        Some("fd00:198:51:100::1")
    );
    let a1 = state.pods.iter().find(|p| p.name == "a1").unwrap();
    assert_eq!(
        a1.ip6.map(|a| a.to_string()).as_deref(),
        Some("fd00:10:244:1::2")
    );
    let route = std::process::Command::new("ip")
        .args([
            "-n",
            &format!("wl-{}-a", lab.name),
            "-6",
            "route",
            "show",
            "fd00:10:244:2::/64",
        ])
        .output()
        .unwrap();
    let route = String::from_utf8_lossy(&route.stdout).into_owned();
    match overlay {
        "vxlan" => assert!(route.contains("dev weir.1"), "{route}"),
        _ => assert!(route.contains("via fd00:172:30::c dev eth0"), "{route}"),
    }
    let nodes = std::fs::read_to_string(lab.lab_dir().join("manifests/nodes.yaml")).unwrap();
    assert!(
        nodes.contains("fd00:10:244:1::/64") && nodes.contains("fd00:172:30::b"),
        "{nodes}"
    );

    let out = lab.weir(&["lab", "check", &lab.name, "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "lab check --json: {e}\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_every_probe_in_both_families(&v, mode);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn dual_stack_lab_every_probe_in_both_families_nftables() {
    dual_stack("dsn", "nftables", "host-gw");
}

#[test]
fn dual_stack_lab_every_probe_in_both_families_iptables() {
    dual_stack("dsi", "iptables", "host-gw");
}

#[test]
fn dual_stack_lab_every_probe_in_both_families_userspace() {
    dual_stack("dsu", "userspace", "host-gw");
}

#[test]
fn dual_stack_lab_every_probe_in_both_families_vxlan_nftables() {
    dual_stack("dsv", "nftables", "vxlan");
}

/// A node joins a running dual-stack lab (`weir lab add-node`) and leaves again: its IPv6
/// address, podCIDR and pod come from the same derivation, every node routes it in both
/// families, and every probe (the new pod's IPv6 rows too) passes before and after.
#[test]
fn dual_stack_lab_node_joins_and_leaves() {
    if !runnable() {
        return;
    }
    weir_cni();
    let lab = Lab::new("dsj");
    let topo = topology(&lab, "host-gw");
    lab.ok(&["lab", "up", topo.to_str().unwrap()]);
    lab.ok(&[
        "lab",
        "add-node",
        &lab.name,
        "c",
        "--pod-cidr",
        "10.244.3.0/24",
        "--pods",
        "c1",
    ]);
    let state = weir_lab::LabState::load(&lab.lab_dir().join("state.json")).unwrap();
    let c1 = state.pods.iter().find(|p| p.name == "c1").unwrap();
    assert_eq!(
        c1.ip6.map(|a| a.to_string()).as_deref(),
        Some("fd00:10:244:3::2")
    );
    let check = |rows: usize| {
        let out = lab.weir(&["lab", "check", &lab.name, "--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let matrix = v["matrix"].as_array().unwrap();
        let mut bad = failures(matrix);
        bad.extend(failures(v["services"].as_array().unwrap()));
        assert!(bad.is_empty(), "{}", bad.join("\n"));
        assert_eq!(matrix.len(), rows);
        assert_eq!(kinds(matrix, true), kinds(matrix, false));
        assert!(out.status.success());
    };
    // 5 pods × (4 other pods + own node + outside) × 2 protocols × 2 families.
    check(120);
    lab.ok(&["lab", "remove-node", &lab.name, "c"]);
    check(80);
}
