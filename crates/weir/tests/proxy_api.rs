//! `weir proxy` fed by the Kubernetes API (root only): the real binary in a throwaway network
//! namespace, watching weir's fake API server (the real list/watch protocol) on the
//! namespace's loopback, observed through real TCP connections to a ClusterIP, /healthz and
//! /metrics.

use std::time::Duration;

mod common;
use common::agent::{Agent, EXTRA, SOLO};
use common::runnable;
use weir_fakeapi::FakeApi;

/// An agent in its namespace, with the pods' echo server, and the fake API server on the
/// namespace's 127.0.0.1:6443 holding `objects`. The agent is not started.
fn setup(tag: &str, mode: &'static str, objects: &str) -> (Agent, FakeApi) {
    let mut a = Agent::with_manifest(&format!("api{tag}"), mode, "");
    a.use_manifests = false;
    a.args = vec![
        "--master=http://127.0.0.1:6443".into(),
        "--sync-period=1s".into(),
    ];
    a.serve_pods();
    let api = FakeApi::start(Some(&a.ns), "127.0.0.1:6443".parse().unwrap()).unwrap();
    api.set_faults(|f| f.bookmark_interval = Duration::from_millis(500));
    api.apply_yaml(objects).unwrap();
    (a, api)
}

fn metric(a: &Agent, line_start: &str) -> Option<String> {
    let (_, m) = a.http("10249/metrics");
    m.lines()
        .find(|l| l.starts_with(line_start))
        .map(|l| l.rsplit(' ').next().unwrap_or_default().to_string())
}

fn lifecycle(mode: &'static str) {
    let (mut a, api) = setup(&mode[..3], mode, SOLO);
    a.start();
    a.wait_for("solo through the API", || a.solo_answers());
    assert_eq!(
        metric(&a, "weir_source_objects{kind=\"Service\"}").as_deref(),
        Some("1")
    );
    let listed: f64 = metric(
        &a,
        "weir_source_last_successful_list_timestamp_seconds{kind=\"EndpointSlice\"}",
    )
    .unwrap()
    .parse()
    .unwrap();
    assert!(listed > 1.7e9, "{listed}");

    // Appears.
    api.apply_yaml(EXTRA).unwrap();
    a.wait_for("the new service", || a.answers("10.96.7.7", 80));
    // Changes: the service moves to port 81.
    api.apply_yaml(&EXTRA.replace("port: 80,", "port: 81,"))
        .unwrap();
    a.wait_for("the changed port", || a.answers("10.96.7.7", 81));
    assert!(!a.answers("10.96.7.7", 80), "the old port is gone");
    // Disappears (the slice first, then the service: the rules follow each step).
    assert!(api.delete("EndpointSlice", "default", "extra-1"));
    a.wait_for("no endpoint left", || !a.answers("10.96.7.7", 81));
    assert!(api.delete("Service", "default", "extra"));
    a.wait_for("the service gone from the rules", || {
        !a.rules().contains("10.96.7.7")
    });
    assert!(a.solo_answers(), "the other service untouched");
    a.wait_for("the object count", || {
        metric(&a, "weir_source_objects{kind=\"Service\"}").as_deref() == Some("1")
    });
}

#[test]
fn objects_appear_change_and_disappear_nftables() {
    if runnable() {
        lifecycle("nftables");
    }
}

#[test]
fn objects_appear_change_and_disappear_iptables() {
    if runnable() {
        lifecycle("iptables");
    }
}

/// A restart never applies a partial world: while the initial lists are held, nothing is
/// synced — the rules of the previous run stay exactly as they were and keep serving — and
/// /healthz says why.
#[test]
fn no_sync_before_the_initial_lists_complete() {
    if !runnable() {
        return;
    }
    let (mut a, api) = setup("hold", "nftables", SOLO);
    a.start();
    a.wait_for("solo", || a.solo_answers());
    a.kill();
    let before = a.rules();
    api.set_faults(|f| f.hold_lists = true);
    api.delete("Service", "default", "solo");
    a.spawn();
    a.wait_for("/healthz answering", || a.health().code != 0);
    std::thread::sleep(Duration::from_millis(1500));
    let h = a.health();
    assert_eq!(h.code, 503, "{h:?}");
    assert!(h.reason.contains("initial list"), "{h:?}");
    assert_eq!(a.rules(), before, "nothing synced while the lists are held");
    assert!(a.solo_answers(), "the previous run's rules keep serving");
    api.set_faults(|f| f.hold_lists = false);
    a.wait_for("the complete world synced", || {
        !a.rules().contains("10.96.9.9")
    });
    a.wait_for("/healthz 200", || a.health().code == 200);
}

/// A dropped watch and an API server restart: the rules stay, the watches resume (from
/// their resourceVersion) and later changes are programmed.
#[test]
fn a_dropped_watch_and_a_server_restart_keep_the_rules_and_resume() {
    if !runnable() {
        return;
    }
    let (mut a, api) = setup("rst", "nftables", SOLO);
    a.start();
    a.wait_for("solo", || a.solo_answers());
    api.drop_connections();
    api.apply_yaml(EXTRA).unwrap();
    a.wait_for("a change after the dropped watch", || {
        a.answers("10.96.7.7", 80)
    });
    api.stop();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(a.solo_answers(), "rules kept while the server is down");
    api.restart().unwrap();
    assert!(api.delete("Service", "default", "extra"));
    a.wait_for("a change after the restart", || {
        !a.rules().contains("10.96.7.7")
    });
    assert!(a.solo_answers());
    let restarts: f64 = metric(&a, "weir_source_watch_restarts_total{kind=\"Service\"}")
        .unwrap_or_default()
        .parse()
        .unwrap_or(0.0);
    assert!(restarts >= 1.0, "restarts counted: {restarts}");
}

/// The watch's resourceVersion expired while the server was away (410 Gone): the agent
/// lists again and applies what changed in the gap, deletions included.
#[test]
fn an_expired_watch_relists_and_applies_deletions_from_the_gap() {
    if !runnable() {
        return;
    }
    let (mut a, api) = setup("gone", "nftables", SOLO);
    a.start();
    a.wait_for("solo", || a.solo_answers());
    api.stop();
    assert!(api.delete("EndpointSlice", "default", "solo-1"));
    assert!(api.delete("Service", "default", "solo"));
    api.apply_yaml(EXTRA).unwrap();
    api.compact();
    api.restart().unwrap();
    a.wait_for("the service deleted in the gap gone", || {
        !a.rules().contains("10.96.9.9")
    });
    a.wait_for("the service added in the gap", || {
        a.answers("10.96.7.7", 80)
    });
    assert!(
        a.log().contains("too old resource version"),
        "the 410 is logged:\n{}",
        a.log()
    );
}

/// The API server away for a while: the rules stay, /healthz says the source is stale and
/// why, and all is well again once it is back.
#[test]
fn an_unreachable_api_server_keeps_the_rules_and_healthz_says_stale() {
    if !runnable() {
        return;
    }
    let (mut a, api) = setup("away", "nftables", SOLO);
    a.start();
    a.wait_for("solo", || a.solo_answers());
    api.stop();
    a.wait_for("/healthz stale", || {
        let h = a.health();
        h.code == 503 && h.reason.contains("stale")
    });
    let h = a.health();
    assert!(h.reason.contains("API source"), "{h:?}");
    assert!(a.solo_answers(), "rules kept");
    api.restart().unwrap();
    a.wait_for("/healthz 200 again", || a.health().code == 200);
    api.apply_yaml(EXTRA).unwrap();
    a.wait_for("changes after the recovery", || a.answers("10.96.7.7", 80));
}

/// A watch connection that hangs (headers, then silence, not even bookmarks) is abandoned
/// after the watch timeout plus 5 s and resumed; the change made meanwhile is programmed.
#[test]
fn a_hanging_watch_is_abandoned_and_resumed() {
    if !runnable() {
        return;
    }
    let (mut a, api) = setup("hang", "nftables", SOLO);
    a.args.push("--api-watch-timeout=2s".into());
    a.start();
    a.wait_for("solo", || a.solo_answers());
    api.set_faults(|f| f.hang_watches = true);
    api.drop_connections();
    // Let every kind's re-watch reach the server and hang.
    std::thread::sleep(Duration::from_millis(1500));
    api.set_faults(|f| f.hang_watches = false);
    let hung_at = std::time::Instant::now();
    api.apply_yaml(EXTRA).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        !a.answers("10.96.7.7", 80),
        "the hung watch delivered nothing (else this test proves nothing)"
    );
    a.wait_for("the change, after the hung watch is given up", || {
        a.answers("10.96.7.7", 80)
    });
    eprintln!("programmed {:?} after the hang", hung_at.elapsed());
    assert!(a.solo_answers());
}
