//! `weir proxy` as a process (root only): the real binary in a throwaway network namespace,
//! fed by a manifest directory, observed through the kernel (`nft`, `iptables-save`) and its
//! HTTP endpoints (`curl`).

use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::agent::{Agent, SOLO};
use common::{runnable, WEIR};

const EXTRA: &str = "apiVersion: v1
kind: Service
metadata: {name: extra, namespace: default}
spec:
  clusterIP: 10.96.7.7
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: extra-1
  namespace: default
  labels: {kubernetes.io/service-name: extra}
  annotations: {endpoints.kubernetes.io/last-change-trigger-time: \"TRIGGER\"}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
  - {addresses: [10.244.7.7], nodeName: node-b}
";

fn agent_lifecycle(mode: &'static str) {
    let mut a = Agent::new(&mode[..3], mode);
    a.start();
    // Programmed: web's ClusterIP (nftables: in the dispatch map; iptables: KUBE-SERVICES).
    a.wait_for("web's ClusterIP", || a.rules().contains("10.96.0.10"));
    // The healthCheckNodePort of the eTP Local service with a local endpoint answers 200.
    let (code, body) = a.http("32000/");
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains("\"localEndpoints\": 1") || body.contains("\"localEndpoints\":1"),
        "{body}"
    );
    let (_, metrics) = a.http("10249/metrics");
    assert!(
        metrics.contains("kubeproxy_sync_proxy_rules_duration_seconds_count"),
        "{metrics}"
    );

    // A new file is picked up; a broken one is reported with its name and changes nothing.
    // Its slice says the change happened an hour ago: the network-programming latency
    // (kube-proxy's meaning) counts from there.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let hour_ago = weir_model::k8s_openapi::jiff::Timestamp::from_second(now - 3600).unwrap();
    std::fs::write(
        a.manifests().join("extra.yaml"),
        EXTRA.replace("TRIGGER", &hour_ago.to_string()),
    )
    .unwrap();
    a.wait_for("the new service", || a.rules().contains("10.96.7.7"));
    let (_, metrics) = a.http("10249/metrics");
    let sum: f64 = metrics
        .lines()
        .find(|l| l.starts_with("kubeproxy_network_programming_duration_seconds_sum"))
        .and_then(|l| l.split_whitespace().last()?.parse().ok())
        .unwrap_or(0.0);
    assert!(sum >= 3600.0, "{metrics}");
    std::fs::write(
        a.manifests().join("broken.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: {name: x, namespace: default}\nspec:\n  ports: [{port: banana}]\n",
    )
    .unwrap();
    a.wait_for("the error report", || a.log().contains("broken.yaml"));
    let report = a.log();
    let line = report.lines().find(|l| l.contains("broken.yaml")).unwrap();
    assert!(
        line.contains("Service/default/x") && line.contains("spec.ports"),
        "{line}"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(a.rules().contains("10.96.7.7") && a.rules().contains("10.96.0.10"));
    // Reported once, not on every poll (and not twice per scan).
    let reports = a
        .log()
        .lines()
        .filter(|l| l.contains("broken.yaml"))
        .count();
    assert_eq!(reports, 1, "{}", a.log());
    assert_eq!(a.http("10256/healthz").0, 200);

    // A Node drained by the cluster autoscaler fails /healthz (LBs stop sending) but not /livez.
    let services = a.manifests().join("services.yaml");
    let original = std::fs::read_to_string(&services).unwrap();
    let tainted = original.replacen(
        "status:\n  addresses:",
        "spec:\n  taints: [{key: ToBeDeletedByClusterAutoscaler, effect: NoSchedule}]\nstatus:\n  addresses:",
        1,
    );
    assert_ne!(tainted, original);
    std::fs::write(&services, tainted).unwrap();
    a.wait_for("healthz 503", || a.http("10256/healthz").0 == 503);
    assert_eq!(a.http("10256/livez").0, 200);
    std::fs::write(&services, original).unwrap();
    a.wait_for("healthz 200 again", || a.http("10256/healthz").0 == 200);

    // Editing the good file back out removes the service's rules.
    std::fs::remove_file(a.manifests().join("extra.yaml")).unwrap();
    a.wait_for("the service removed", || !a.rules().contains("10.96.7.7"));

    // A killed agent leaves its rules; a new one takes over without losing them.
    a.kill();
    let kept = a.rules();
    assert!(kept.contains("10.96.0.10"));
    a.start();
    assert!(a.rules().contains("10.96.0.10"));
    if mode == "iptables" {
        // Jump rules are not duplicated by a restart.
        let save = a.sh("iptables-save -t nat");
        let jumps = save
            .lines()
            .filter(|l| l.starts_with("-A PREROUTING") && l.contains("KUBE-SERVICES"))
            .count();
        assert_eq!(jumps, 1, "{save}");
    }

    // `weir proxy cleanup` removes everything.
    a.kill();
    let out = Command::new("ip")
        .args(["netns", "exec", &a.ns, WEIR, "proxy", "cleanup"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rules = a.rules();
    assert!(
        !rules.contains("10.96.0.10") && !rules.contains("KUBE-SVC"),
        "{rules}"
    );
}

#[test]
fn nftables_agent_follows_manifests_survives_bad_input_and_restarts() {
    if runnable() {
        agent_lifecycle("nftables");
    }
}

#[test]
fn iptables_agent_follows_manifests_survives_bad_input_and_restarts() {
    if runnable() {
        agent_lifecycle("iptables");
    }
}

/// Seed-style manifests: a NodePort service and its endpoint (a pod of `Agent::serve_pods`), and
/// no Node object.
const SEED: &str = "apiVersion: v1
kind: Service
metadata: {name: seed, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.5.5
  ports: [{port: 80, targetPort: 8080, nodePort: 30080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: seed-1, namespace: default, labels: {kubernetes.io/service-name: seed}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
  - {addresses: [10.244.0.5], nodeName: node-a}
";

/// Whether the seed service answers a real TCP connection on its ClusterIP.
fn cluster_ip(a: &Agent) -> bool {
    a.answers("10.96.5.5", 80)
}

/// Whether the seed service answers on its NodePort at the node's address.
fn node_port(a: &Agent) -> bool {
    a.answers("192.168.0.10", 30080)
}

#[test]
fn iptables_mode_serves_node_ports_on_local_addresses_without_a_node_object() {
    if !runnable() {
        return;
    }
    let mut a = Agent::with_manifest("npi", "iptables", SEED);
    a.serve_pods();
    a.start();
    a.wait_for("the ClusterIP", || cluster_ip(&a));
    // kube-proxy's iptables default: every local address (`-m addrtype --dst-type LOCAL`).
    assert!(node_port(&a), "{}\n{}", a.rules(), a.log());
    assert!(!a.log().contains("not served"), "{}", a.log());
}

#[test]
fn nftables_mode_says_why_node_ports_are_not_served_without_node_addresses() {
    if !runnable() {
        return;
    }
    let mut a = Agent::with_manifest("npn", "nftables", SEED);
    a.args = vec!["--sync-period=1s".into()];
    a.serve_pods();
    a.start();
    a.wait_for("the ClusterIP", || cluster_ip(&a));
    // kube-proxy's nftables default is the node's primary IPs, unknown here: no NodePort,
    // and the log says why and what to do: once, not again at every sync (several by now).
    assert!(!node_port(&a));
    std::thread::sleep(Duration::from_millis(2500));
    let log = a.log();
    let said = "Service default/seed: NodePort 30080 not served";
    assert!(
        log.contains(said) && log.contains("--nodeport-addresses"),
        "{log}"
    );
    assert_eq!(log.matches(said).count(), 1, "{log}");
    // Given addresses, it is served.
    a.kill();
    a.args = vec!["--nodeport-addresses=192.168.0.0/24".into()];
    a.start();
    a.wait_for("the NodePort", || node_port(&a));
}

/// Flushes with no object change: the periodic check (every --sync-period) repairs them.
fn flushes_are_repaired_on_the_timer(mode: &'static str, flushes: &[&str]) {
    let mut a = Agent::with_manifest(&format!("fl{}", &mode[..3]), mode, SEED);
    a.args = vec!["--sync-period=1s".into()];
    a.serve_pods();
    a.start();
    a.wait_for("the ClusterIP", || cluster_ip(&a));
    for flush in flushes {
        let start = Instant::now();
        // Stopped meanwhile, so that it cannot repair the flush before the check.
        a.frozen(|| {
            a.sh(flush);
            assert!(!cluster_ip(&a), "`{flush}` did not break the service");
        });
        a.wait_for(&format!("repair of `{flush}`"), || cluster_ip(&a));
        let took = start.elapsed();
        // Since the flush: at most one --sync-period plus a sync; the 1 s curl timeout of
        // the check that the flush broke the service is in there too.
        assert!(
            took < Duration::from_secs(5),
            "`{flush}` repaired after {took:?}"
        );
        eprintln!("{mode}: `{flush}` repaired after {took:?}");
    }
    // Said in the log (by the periodic check or by the sync that noticed first).
    assert!(a.log().contains("behind its back"), "{}", a.log());
    assert_eq!(a.http("10256/healthz").0, 200);

    // kube-proxy's spelling of cleanup.
    a.kill();
    let out = Command::new("ip")
        .args(["netns", "exec", &a.ns, WEIR, "proxy", "--cleanup"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rules = a.rules();
    assert!(!rules.contains("10.96.5.5"), "{rules}");
    assert!(!cluster_ip(&a));
}

#[test]
fn iptables_agent_repairs_outside_flushes_on_its_timer() {
    if runnable() {
        flushes_are_repaired_on_the_timer(
            "iptables",
            &["iptables -t nat -F", "iptables -t nat -F KUBE-SERVICES"],
        );
    }
}

#[test]
fn nftables_agent_repairs_outside_flushes_on_its_timer() {
    if runnable() {
        flushes_are_repaired_on_the_timer(
            "nftables",
            &[
                "nft flush table inet weir",
                "nft flush chain inet weir services",
            ],
        );
    }
}

#[test]
fn full_resync_runs_every_full_sync_period() {
    if !runnable() {
        return;
    }
    let mut a = Agent::with_manifest("fsp", "nftables", SEED);
    a.args = vec!["--sync-period=1s".into(), "--full-sync-period=1s".into()];
    a.start();
    // Nothing changes, yet the rules are rewritten: the first sync and at least two more.
    let full_syncs = || a.log().matches("kind=Full").count();
    a.wait_for("two periodic full resyncs", || full_syncs() >= 3);
    assert!(!a.log().contains("behind its back"), "{}", a.log());
}

/// Defect 1 of issue 8: a missing manifest directory, at start or while running, never
/// becomes an empty world; /healthz says why (503), /livez stays 200, the ClusterIP answers.
fn missing_directory(mode: &'static str) {
    let mut a = Agent::new(&format!("md{}", &mode[..3]), mode);
    a.serve_solo();
    a.start();
    a.wait_for("solo programmed", || a.solo_answers());

    // Restart with the directory renamed away.
    a.kill();
    let away = a.dir.path().join("manifests.away");
    std::fs::rename(a.manifests(), &away).unwrap();
    a.spawn();
    a.wait_for("healthz 503 naming the directory", || {
        let (code, body) = a.http("10256/healthz");
        code == 503 && body.contains("manifests") && body.contains("cannot read")
    });
    assert_eq!(
        a.http("10256/livez").0,
        200,
        "alive, only waiting for its source"
    );
    std::thread::sleep(Duration::from_millis(800)); // ~8 polls
    assert_eq!(a.http("10256/healthz").0, 503);
    let rules = a.rules();
    assert!(
        rules.contains("10.96.9.9") && rules.contains("10.96.0.10"),
        "{rules}"
    );
    assert!(a.solo_answers(), "the kernel's rules were kept");
    a.wait_for("the agent saying why it does not sync", || {
        a.log()
            .contains("not syncing yet, the rules in the kernel are kept: manifest source failing")
    });
    let log = a.log();
    let error = |l: &&str| l.contains("manifests: directory: cannot read");
    assert_eq!(
        log.lines()
            .filter(error)
            .filter(|l| !l.contains("not syncing"))
            .count(),
        1,
        "the missing directory is reported once, not every poll:\n{log}"
    );
    // The directory comes back: synced and healthy.
    std::fs::rename(&away, a.manifests()).unwrap();
    a.wait_for("healthz 200", || a.http("10256/healthz").0 == 200);
    assert!(a.solo_answers());

    // It vanishes while running: the last view stays, health says so; back again: healthy.
    std::fs::rename(a.manifests(), &away).unwrap();
    a.wait_for("healthz 503 while the directory is gone", || {
        let (code, body) = a.http("10256/healthz");
        code == 503 && body.contains("serving the last complete view")
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(a.rules().contains("10.96.9.9"));
    assert!(a.solo_answers());
    assert_eq!(a.http("10256/livez").0, 200);
    let (_, metrics) = a.http("10249/metrics");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("weir_source_scan_failures_total ") && !l.ends_with(" 0")),
        "{metrics}"
    );
    std::fs::rename(&away, a.manifests()).unwrap();
    a.wait_for("healthz 200 again", || a.http("10256/healthz").0 == 200);
}

#[test]
fn nftables_agent_keeps_rules_and_reports_not_ready_without_its_manifest_directory() {
    if runnable() {
        missing_directory("nftables");
    }
}

#[test]
fn iptables_agent_keeps_rules_and_reports_not_ready_without_its_manifest_directory() {
    if runnable() {
        missing_directory("iptables");
    }
}

/// Defect 5 of issue 8: a file broken while weir was down is served from its last-known-good
/// copy after a restart (logged); a file deleted on purpose is not resurrected. A FIFO among
/// the manifests (defect 3) does not stop the watcher meanwhile.
#[test]
fn nftables_agent_serves_last_known_good_copies_after_a_restart() {
    if !runnable() {
        return;
    }
    let mut a = Agent::new("lkg", "nftables");
    a.serve_solo();
    a.start();
    a.wait_for("solo programmed", || a.solo_answers());
    a.kill();
    let solo = a.manifests().join("solo.yaml");
    std::fs::write(&solo, SOLO.replace("kind: Service", "kind: [Service")).unwrap();
    a.start();
    assert!(a.solo_answers(), "served from the last good copy");
    let log = a.log();
    assert!(
        log.lines().any(|l| l.contains("last-known-good")
            && l.contains("Service/default/solo")
            && l.contains("solo.yaml")),
        "{log}"
    );
    let fifo = a.manifests().join("pipe.yaml");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    a.wait_for("the FIFO reported", || {
        a.log().contains("pipe.yaml: file: a FIFO")
    });
    // Deleted on purpose: gone, and still gone after a restart.
    std::fs::remove_file(&solo).unwrap();
    a.wait_for("solo removed", || !a.rules().contains("10.96.9.9"));
    a.kill();
    a.start();
    std::thread::sleep(Duration::from_millis(300));
    assert!(!a.rules().contains("10.96.9.9"));
    assert!(!a.solo_answers());
}
