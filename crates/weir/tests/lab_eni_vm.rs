//! The eni lab under upstream kube-proxy's **ipvs**-mode rule shapes (`--proxy-mode
//! kube-proxy-ipvs`: `kube-ipvs0` holding every ClusterIP and LB IP, the KUBE-* ipsets, IPVS
//! virtual servers with masqueraded real servers, ipvs mode's KUBE-* nat rules), with the VPC's
//! source check on and strict rp_filter. This machine's kernel has no IPVS and no `dummy`, so the
//! whole lab runs inside the qemu VM (weir-vmtest, Debian's kernel), with this build's `weir` and
//! `weir-cni`. Skips with a clear message where qemu cannot run (docs/vm.md).
//!
//! Both tests share one VM boot and run in parallel, each with its own lab name and state dir.

use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::*;

/// Brings the eni lab up in the VM with kube-proxy's ipvs shapes, runs `weir lab check --json`,
/// takes the lab down. Returns check's success, its JSON and everything the script printed to
/// stderr (the `up` progress, `ipvsadm -Ln` of node a).
/// One lab at a time in the VM: it has one emulated CPU, and two labs probing at once made
/// the lab's 1 s reject/no-answer windows miss (seen once at load ~17).
static ONE_LAB_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn lab_in_vm(tag: &str, fix: bool) -> Option<(bool, Value, String)> {
    let vm = weir_vmtest::shared_or_skip()?;
    let _turn = ONE_LAB_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let cni = weir_cni();
    let name = format!("{tag}{}", std::process::id());
    let topology = weir_lab::ENI_TOPOLOGY
        .replacen("name: eni\n", &format!("name: {name}\n"), 1)
        .replacen("eniFix: true", &format!("eniFix: {fix}"), 1);
    let script = format!(
        "set -e
export WEIR_LAB_STATE=/tmp/wl-state-{name} WEIR_CNI={cni}
mkdir -p $WEIR_LAB_STATE
trap '{WEIR} lab down {name} >/dev/null 2>&1 || true' EXIT
cat > $WEIR_LAB_STATE/topology-input.yaml <<'TOPOLOGY'
{topology}TOPOLOGY
{WEIR} lab up $WEIR_LAB_STATE/topology-input.yaml --proxy-mode kube-proxy-ipvs >&2
set +e
{WEIR} lab check {name} --json
echo \"check status $?\" >&2
ip netns exec wl-{name}-a ipvsadm -Ln >&2
ip netns exec wl-{name}-a ip -4 addr show dev kube-ipvs0 >&2
exit 0
",
        cni = cni.display()
    );
    let started = Instant::now();
    let out = vm
        .run_timeout(&script, Duration::from_secs(150))
        .expect("the VM answers");
    eprintln!(
        "timing: {tag}: lab up + check + down in the VM {:?}",
        started.elapsed()
    );
    let (stdout, stderr) = (out.stdout, out.stderr);
    assert_eq!(out.status, 0, "script failed:\n{stderr}\n{stdout}");
    let json: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("check --json: {e}\nstdout:\n{stdout}\nstderr:\n{stderr}"));
    // `lab up`'s progress (with per-step timings), check's status, ipvsadm -Ln: shown with
    // --nocapture, and in every assertion message below
    eprintln!("{tag}:\n{stderr}");
    Some((stderr.contains("check status 0"), json, stderr))
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
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
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
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
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
