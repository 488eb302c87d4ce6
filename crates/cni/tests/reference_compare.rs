//! Side by side with the reference: the same ADD / CHECK / DEL sequence through weir-cni and through
//! Debian's containernetworking-plugins `bridge` + `host-local`, each in its own node namespace,
//! comparing what each leaves in the namespaces (names that are meant to differ, like the host veth
//! and MACs, are normalised away).

mod common;

use std::path::{Path, PathBuf};

use common::{run_plugin, unique, TestNs};
use serde_json::Value;

const REFERENCE_BRIDGE: &str = "/usr/lib/cni/bridge";

fn weir_config(data: &Path) -> String {
    format!(
        r#"{{"cniVersion":"1.0.0","name":"cmp","type":"weir-cni","bridge":"cni0","mtu":1400,
            "isGateway":true,"hairpinMode":true,
            "ipam":{{"type":"weir-ipam","ranges":[[{{"subnet":"10.98.1.0/24"}}]],"dataDir":"{}",
                    "routes":[{{"dst":"0.0.0.0/0"}}]}}}}"#,
        data.display()
    )
}

fn reference_config(data: &Path) -> String {
    format!(
        r#"{{"cniVersion":"1.0.0","name":"cmp","type":"bridge","bridge":"cni0","mtu":1400,
            "isGateway":true,"hairpinMode":true,
            "ipam":{{"type":"host-local","ranges":[[{{"subnet":"10.98.1.0/24"}}]],"dataDir":"{}",
                    "routes":[{{"dst":"0.0.0.0/0"}}]}}}}"#,
        data.display()
    )
}

fn ip_json(ns: &TestNs, args: &str) -> Value {
    let out = ns.sh(&format!("ip -j {args}"));
    serde_json::from_str(&out).unwrap_or(Value::Array(vec![]))
}

/// What a namespace holds, reduced to what both plugins are meant to agree on.
fn snapshot(node: &TestNs, pod: &TestNs) -> Value {
    let pod_links: Vec<Value> = ip_json(pod, "addr show")
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["ifname"] != "lo")
        .map(|l| {
            let mut addrs: Vec<String> = l["addr_info"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|a| a["family"] == "inet")
                .map(|a| format!("{}/{}", a["local"].as_str().unwrap(), a["prefixlen"]))
                .collect();
            addrs.sort();
            serde_json::json!({"name": l["ifname"], "mtu": l["mtu"], "up": l["operstate"] == "UP", "addrs": addrs})
        })
        .collect();
    let mut pod_routes: Vec<String> = ip_json(pod, "route show")
        .as_array()
        .unwrap()
        .iter()
        .map(|r| format!("{} via {} dev {}", r["dst"], r["gateway"], r["dev"]))
        .collect();
    pod_routes.sort();
    let bridge_addrs: Vec<String> = ip_json(node, "addr show dev cni0")
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|l| l["addr_info"].as_array().cloned().unwrap_or_default())
        .filter(|a| a["family"] == "inet")
        .map(|a| format!("{}/{}", a["local"].as_str().unwrap(), a["prefixlen"]))
        .collect();
    let ports: Vec<Value> = ip_json(node, "-d link show master cni0")
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            serde_json::json!({
                "kind": l["linkinfo"]["info_kind"],
                "mtu": l["mtu"],
                "hairpin": l["linkinfo"]["info_slave_data"]["hairpin"],
                "up": l["operstate"] == "UP",
            })
        })
        .collect();
    serde_json::json!({
        "pod_links": pod_links,
        "pod_routes": pod_routes,
        "bridge_addrs": bridge_addrs,
        "bridge_ports": ports,
        "ip_forward": node.sh("cat /proc/sys/net/ipv4/ip_forward").trim(),
    })
}

/// ADD, snapshot, CHECK, DEL, snapshot; returns the ADD result and both snapshots.
fn run_sequence(plugin: &Path, config: &str, tag: &str) -> (Value, Value, Value) {
    let node = TestNs::new(&format!("{}-n{tag}", unique("cmp")));
    let pod = TestNs::new(&format!("{}-p{tag}", unique("cmp")));
    let add = run_plugin(
        plugin,
        &node,
        "ADD",
        "cmp-pod",
        Some(&pod.path()),
        "eth0",
        config,
    );
    let result = add.ok().json();
    let after_add = snapshot(&node, &pod);
    let with_prev = config.replacen('{', &format!("{{\"prevResult\":{result},"), 1);
    run_plugin(
        plugin,
        &node,
        "CHECK",
        "cmp-pod",
        Some(&pod.path()),
        "eth0",
        &with_prev,
    )
    .ok();
    run_plugin(
        plugin,
        &node,
        "DEL",
        "cmp-pod",
        Some(&pod.path()),
        "eth0",
        &with_prev,
    )
    .ok();
    let after_del = snapshot(&node, &pod);
    (result, after_add, after_del)
}

/// The parts of a result both must agree on.
fn result_shape(r: &Value) -> Value {
    serde_json::json!({
        "cniVersion": r["cniVersion"],
        "interfaces": r["interfaces"].as_array().unwrap().len(),
        "pod_interface": r["interfaces"][2]["name"],
        "ips": r["ips"],
        "has_sandbox": r["interfaces"][2]["sandbox"].as_str().is_some_and(|s| !s.is_empty()),
    })
}

#[test]
fn weir_and_reference_leave_the_same_namespaces() {
    if !Path::new(REFERENCE_BRIDGE).exists() {
        panic!("{REFERENCE_BRIDGE} is missing: install containernetworking-plugins (the README's set-up does)");
    }
    let weir_data = tempfile::tempdir().unwrap();
    let ref_data = tempfile::tempdir().unwrap();
    let weir = PathBuf::from(env!("CARGO_BIN_EXE_weir-cni"));
    let (w_res, w_add, w_del) = run_sequence(&weir, &weir_config(weir_data.path()), "w");
    let (r_res, r_add, r_del) = run_sequence(
        Path::new(REFERENCE_BRIDGE),
        &reference_config(ref_data.path()),
        "r",
    );

    assert_eq!(
        result_shape(&w_res),
        result_shape(&r_res),
        "ADD results differ"
    );
    assert_eq!(w_add, r_add, "namespaces after ADD differ");
    assert_eq!(w_del, r_del, "namespaces after DEL differ");
    // And the snapshots say something: an address on the pod, a port on the bridge, then neither.
    assert_eq!(w_add["pod_links"][0]["addrs"][0], "10.98.1.2/24");
    assert_eq!(w_add["bridge_ports"].as_array().unwrap().len(), 1);
    assert_eq!(w_del["bridge_ports"].as_array().unwrap().len(), 0);
    assert_eq!(w_del["pod_links"].as_array().unwrap().len(), 0);
}
