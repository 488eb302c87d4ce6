//! The eni lab under upstream kube-proxy's **ipvs**-mode rule shapes (`--proxy-mode
//! kube-proxy-ipvs`: `kube-ipvs0` holding every ClusterIP and LB IP, the KUBE-* ipsets, IPVS
//! virtual servers with masqueraded real servers, ipvs mode's KUBE-* nat rules), with the VPC's
//! source check on and strict rp_filter. This machine's kernel has no IPVS and no `dummy`, so the
//! whole lab runs inside the qemu VM (weir-vmtest, Debian's kernel), with this build's `weir` and
//! `weir-cni`. Skips with a clear message where qemu cannot run (docs/vm.md).
//!
//! Both tests share one VM boot and take turns in it, each with its own lab name and state dir.

use serde_json::Value;

mod common;
use common::vm_lab;

/// Brings the eni lab up in the VM with kube-proxy's ipvs shapes, runs `weir lab check --json`,
/// takes the lab down. Returns check's success, its JSON and everything the script printed to
/// stderr (the `up` progress, `ipvsadm -Ln` of node a).
fn lab_in_vm(tag: &str, fix: bool) -> Option<(bool, Value, String)> {
    let (vm, _turn) = vm_lab::vm_turn()?;
    let name = format!("{tag}{}", std::process::id());
    let topology = weir_lab::ENI_TOPOLOGY
        .replacen("name: eni\n", &format!("name: {name}\n"), 1)
        .replacen("eniFix: true", &format!("eniFix: {fix}"), 1);
    let run = vm_lab::run(
        vm,
        &name,
        &topology,
        "kube-proxy-ipvs",
        "ip netns exec wl-$LAB-a ipvsadm -Ln >&2
ip netns exec wl-$LAB-a ip -4 addr show dev kube-ipvs0 >&2",
    );
    Some((run.check_ok, run.json, run.log))
}

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

fn failures(json: &Value) -> Vec<String> {
    ["matrix", "services"]
        .iter()
        .flat_map(|k| json[k].as_array().unwrap().iter())
        .filter(|r| r["ok"] != true)
        .map(|r| r.to_string())
        .collect()
}

#[test]
fn eni_lab_with_the_fix_passes_everything_kube_proxy_ipvs() {
    let Some((ok, json, log)) = lab_in_vm("evi", true) else {
        return;
    };
    let failed = failures(&json);
    assert!(failed.is_empty(), "{}\n{log}", failed.join("\n"));
    assert!(ok, "{log}");
    assert!(log.contains("kube-ipvs0"), "{log}");
    // the brief's path: pod a1 -> LB IP (IPVS on node a) -> b2 on node b
    // masqueraded to the ENI's own address (10.12.192.17), so it leaves the ENI with a source
    // the VPC accepts and the reply returns to the ENI
    let edge = probe(&json, "edge", "pod-load-balancer", "a1");
    let sources: Vec<&str> = edge["answers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["source"].as_str().unwrap())
        .collect();
    assert!(sources.iter().all(|s| *s == "10.12.192.17"), "{sources:?}");
    assert_eq!(rp_drops(&json, "a"), 0, "{}", json["eni"]);
    assert_eq!(rp_drops(&json, "b"), 0, "{}", json["eni"]);
    assert_eq!(json["eni"]["source_check"], 0, "{}", json["eni"]);
}

#[test]
fn eni_lab_without_the_fix_fails_as_the_brief_says_kube_proxy_ipvs() {
    let Some((ok, json, log)) = lab_in_vm("evoff", false) else {
        return;
    };
    assert!(!ok, "{log}");
    eprintln!("failed without the fix:\n{}", failures(&json).join("\n"));
    let edge = probe(&json, "edge", "pod-load-balancer", "a1");
    assert_eq!(edge["ok"], false, "{edge}");
    assert!(
        edge["error"].as_str().unwrap().contains("timed out"),
        "{edge}"
    );
    // IPVS's post-DNAT routing sent the SYN out of the addressless ENI with eth0's address
    // (masqueraded there): the VPC's source check dropped it
    assert!(
        json["eni"]["source_check"].as_u64().unwrap() > 0,
        "{}",
        json["eni"]
    );
    eprintln!("eni counters: {}", json["eni"]);
}
