//! End-to-end tests of the `eni` lab topology (weir_lab::ENI_TOPOLOGY): pods of two nodes on
//! addressless secondary ENIs behind a VPC router with a source check, strict rp_filter on every
//! node interface, `weir proxy` on every node (or upstream kube-proxy's iptables or nftables rule
//! shapes, `--proxy-mode kube-proxy-*`). With weir's fix the whole matrix and every service
//! probe pass and nothing is dropped; with `eniFix: false` the brief's failure happens and the
//! counters show where. Needs root.
//!
//! Each test uses its own lab name (tag + pid) and state directory; a guard runs `weir lab down`.

use serde_json::Value;

mod common;
use common::*;

/// The embedded eni topology under this lab's name, with `eniFix` set.
fn topology(lab: &Lab, fix: bool) -> std::path::PathBuf {
    let body = weir_lab::ENI_TOPOLOGY
        .replacen("name: eni\n", &format!("name: {}\n", lab.name), 1)
        .replacen("eniFix: true", &format!("eniFix: {fix}"), 1);
    let path = lab.state.path().join("topology-input.yaml");
    std::fs::write(&path, body).unwrap();
    path
}

fn check(lab: &Lab) -> (bool, Value) {
    let out = lab.weir(&["lab", "check", &lab.name, "--json"]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "check --json: {e}\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.success(), json)
}

fn table(lab: &Lab) -> String {
    String::from_utf8_lossy(&lab.weir(&["lab", "check", &lab.name]).stdout).into_owned()
}

/// (service, kind, client) → the probe's result.
fn probe<'a>(json: &'a Value, service: &str, kind: &str, from: &str) -> &'a Value {
    json["services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["service"] == service && r["kind"] == kind && r["from"] == from)
        .unwrap_or_else(|| panic!("no {service} {kind} probe from {from}"))
}

fn rp_drops(json: &Value, node: &str) -> u64 {
    json["eni"]["rp_filter"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p[0] == node)
        .and_then(|p| p[1].as_u64())
        .unwrap()
}

fn with_the_fix(tag: &str, mode: &str) {
    if !runnable() {
        return;
    }
    weir_cni();
    let lab = Lab::new(tag);
    let topo = topology(&lab, true);
    lab.ok(&["lab", "up", topo.to_str().unwrap(), "--proxy-mode", mode]);
    let (ok, json) = check(&lab);
    if !ok {
        eprintln!("{}", table(&lab));
    }
    for r in json["matrix"].as_array().unwrap() {
        assert_eq!(r["ok"], true, "{r}");
    }
    for r in json["services"].as_array().unwrap() {
        assert_eq!(r["ok"], true, "{r}");
    }
    assert!(ok);
    // the brief's path: pod a1 -> LB IP whose only backend is on node b, masqueraded to the
    // ENI's own address (10.12.192.17), not eth0's
    let edge = probe(&json, "edge", "pod-load-balancer", "a1");
    let sources: Vec<&str> = edge["answers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["source"].as_str().unwrap())
        .collect();
    assert!(sources.iter().all(|s| *s == "10.12.192.17"), "{sources:?}");
    // outside -> NodePort -> pod on node a (policy Local): the client's address is kept
    let shop = probe(&json, "shop", "node-port-local", "outside");
    assert_eq!(shop["answers"][0]["source"], "198.51.100.1", "{shop}");
    // strict rp_filter and the VPC source check dropped nothing
    assert_eq!(rp_drops(&json, "a"), 0, "{}", json["eni"]);
    assert_eq!(rp_drops(&json, "b"), 0, "{}", json["eni"]);
    assert_eq!(json["eni"]["source_check"], 0, "{}", json["eni"]);
    let rp = lab.weir(&[
        "lab",
        "exec",
        &lab.name,
        "a",
        "--",
        "sysctl",
        "-n",
        "net.ipv4.conf.eth0.rp_filter",
        "net.ipv4.conf.eth1.rp_filter",
    ]);
    assert_eq!(String::from_utf8_lossy(&rp.stdout), "1\n1\n");
    assert_kube_proxy_shapes(&lab, mode, &json);
}

/// With a kube-proxy kind no `weir proxy` runs: the rules the probes went through are the static
/// kube-proxy-shaped ones.
fn assert_kube_proxy_shapes(lab: &Lab, mode: &str, json: &Value) {
    let ruleset = |args: &[&str]| {
        let mut all = vec!["lab", "exec", &lab.name, "a", "--"];
        all.extend_from_slice(args);
        String::from_utf8_lossy(&lab.ok(&all).stdout).into_owned()
    };
    match mode {
        "kube-proxy-iptables" => {
            assert_eq!(
                json["proxies"],
                serde_json::json!([]),
                "{}",
                json["proxies"]
            );
            let nat = ruleset(&["iptables-save", "-t", "nat"]);
            assert!(
                nat.contains("-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000"),
                "{nat}"
            );
            assert!(nat.contains("-j KUBE-EXT-"), "{nat}");
        }
        "kube-proxy-nftables" => {
            assert_eq!(
                json["proxies"],
                serde_json::json!([]),
                "{}",
                json["proxies"]
            );
            let t = ruleset(&["nft", "list", "table", "ip", "kube-proxy"]);
            assert!(t.contains("map service-ips"), "{t}");
            assert!(t.contains("masquerade fully-random"), "{t}");
        }
        _ => {}
    }
}

#[test]
fn eni_lab_with_the_fix_passes_everything_nftables() {
    with_the_fix("eon", "nftables");
}

#[test]
fn eni_lab_with_the_fix_passes_everything_iptables() {
    with_the_fix("eoi", "iptables");
}

#[test]
fn eni_lab_with_the_fix_passes_everything_kube_proxy_iptables() {
    with_the_fix("ekpi", "kube-proxy-iptables");
}

#[test]
fn eni_lab_with_the_fix_passes_everything_kube_proxy_nftables() {
    with_the_fix("ekpn", "kube-proxy-nftables");
}

#[test]
fn eni_lab_without_the_fix_fails_as_the_brief_says() {
    without_the_fix("eoff", "nftables");
}

#[test]
fn eni_lab_without_the_fix_fails_as_the_brief_says_kube_proxy_iptables() {
    without_the_fix("eoffi", "kube-proxy-iptables");
}

#[test]
fn eni_lab_without_the_fix_fails_as_the_brief_says_kube_proxy_nftables() {
    without_the_fix("eoffn", "kube-proxy-nftables");
}

fn without_the_fix(tag: &str, mode: &str) {
    if !runnable() {
        return;
    }
    weir_cni();
    let lab = Lab::new(tag);
    let topo = topology(&lab, false);
    let up = lab.ok(&["lab", "up", topo.to_str().unwrap(), "--proxy-mode", mode]);
    assert!(
        String::from_utf8_lossy(&up.stderr).contains("weir's fix removed"),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    // The namespaces are new, so every drop counted below happened during this check.
    let (ok, json) = check(&lab);
    assert!(!ok);
    eprintln!("{}", table(&lab));
    // pod -> pod, node, outside: unaffected
    for r in json["matrix"].as_array().unwrap() {
        assert_eq!(r["ok"], true, "{r}");
    }
    // pod a1 -> LB IP with its backend on node b: times out; the SYN left the ENI with eth0's
    // address and the VPC's source check dropped it
    let edge = probe(&json, "edge", "pod-load-balancer", "a1");
    assert_eq!(edge["ok"], false);
    assert!(
        edge["error"].as_str().unwrap().contains("timed out"),
        "{edge}"
    );
    assert!(
        json["eni"]["source_check"].as_u64().unwrap() > 0,
        "{}",
        json["eni"]
    );
    // outside -> NodePort -> pod on node a: the request fails node a's strict reverse-path check
    let shop = probe(&json, "shop", "node-port-local", "outside");
    assert_eq!(shop["ok"], false);
    assert!(
        shop["error"].as_str().unwrap().contains("timed out"),
        "{shop}"
    );
    assert!(rp_drops(&json, "a") > 0, "{}", json["eni"]);
    // pod a1 -> node b's NodePort, backend b2 on node b: the request arrives on b's eth0 with a
    // pod source and is DNATed to b2, and without the connection mark b's reverse-path check
    // follows "from b2 lookup 1003" to the ENI and drops it
    let np = json["services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["service"] == "edge" && r["kind"] == "pod-node-port" && r["via"] == "node b")
        .expect("edge pod-node-port via node b");
    assert_eq!(np["ok"], false, "{np}");
    assert!(rp_drops(&json, "b") > 0, "{}", json["eni"]);
    // what an operator sees on node a: no address on the ENI, the pod rules, no fwmark rule
    let exec = |args: &[&str]| {
        let mut all = vec!["lab", "exec", &lab.name, "a", "--"];
        all.extend_from_slice(args);
        String::from_utf8_lossy(&lab.ok(&all).stdout).into_owned()
    };
    assert!(!exec(&["ip", "-4", "addr", "show", "dev", "eth1"]).contains("inet "));
    let rules = exec(&["ip", "rule"]);
    assert!(rules.contains("from 10.12.192.18 lookup 1003"), "{rules}");
    assert!(!rules.contains("fwmark 0x80"), "{rules}");
}
