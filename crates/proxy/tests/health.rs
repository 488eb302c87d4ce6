//! The health, metrics and healthCheckNodePort servers over real HTTP, probed with `curl` on
//! 127.0.0.1 (skipped when curl is missing). The namespace test also needs root.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::process::Command;
use std::sync::Arc;
use std::thread::sleep;
use std::time::Duration;

use weir_proxy::health::{HttpRuntime, ProxyHealth, ProxyServers, ServiceHealthServers};
use weir_proxy::metrics::ProxyMetrics;

struct Reply {
    code: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// `curl`, or the test is skipped (a failure under CI=true, naming it).
fn have_curl() -> bool {
    weir_testkit::can_run(weir_testkit::commands(&["curl"]))
}

/// `curl -i`; `None` when nothing answers (connection refused).
fn get_in(netns: Option<&str>, url: &str) -> Option<Reply> {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "curl"]);
            c
        }
        None => Command::new("curl"),
    };
    let out = cmd
        .args(["-sS", "-i", "--max-time", "10", url])
        .output()
        .unwrap();
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("headers end");
    let mut lines = head.lines();
    let code = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Some(Reply {
        code,
        headers,
        body: body.to_string(),
    })
}

fn get(url: &str) -> Option<Reply> {
    get_in(None, url)
}

fn json(r: &Reply) -> serde_json::Value {
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{e}: {:?}", r.body))
}

fn localhost0() -> Option<SocketAddr> {
    Some("127.0.0.1:0".parse().unwrap())
}

/// A port free now, below the kernel's ephemeral range (32768+), so that no other test's
/// outgoing connection takes it as its source port before the test binds it (an ephemeral
/// port was taken that way once in CI). Successive calls return different ports.
fn free_port() -> u16 {
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let base = 20_000 + (std::process::id() % 5_000) as u16;
    loop {
        let port = base + NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 5_000;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

fn start(health: &Arc<ProxyHealth>) -> (HttpRuntime, ProxyServers, Arc<ProxyMetrics>) {
    let rt = HttpRuntime::new().unwrap();
    let metrics = Arc::new(ProxyMetrics::new("nftables"));
    let servers = ProxyServers::start(
        &rt,
        localhost0(),
        localhost0(),
        health.clone(),
        metrics.clone(),
    )
    .unwrap();
    (rt, servers, metrics)
}

#[test]
fn healthz_is_503_before_the_first_sync_200_after_and_503_when_stale() {
    if !have_curl() {
        return;
    }
    let health = Arc::new(ProxyHealth::new(Duration::from_millis(200)));
    let (_rt, servers, _m) = start(&health);
    let base = format!("http://{}", servers.healthz_addr().unwrap());

    let r = get(&format!("{base}/healthz")).unwrap();
    assert_eq!(r.code, 503);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    let j = json(&r);
    assert_eq!(j["lastUpdated"], "0001-01-01 00:00:00 +0000 UTC");
    assert_eq!(j["nodeEligible"], true);
    assert_eq!(get(&format!("{base}/livez")).unwrap().code, 503);

    health.updated();
    let r = get(&format!("{base}/healthz")).unwrap();
    assert_eq!(r.code, 200, "{}", r.body);
    let j = json(&r);
    assert!(j["currentTime"].as_str().unwrap().ends_with(" +0000 UTC"));
    assert_eq!(get(&format!("{base}/livez")).unwrap().code, 200);

    // A change queued and not synced for longer than the timeout.
    health.queued_update();
    sleep(Duration::from_millis(500));
    assert_eq!(get(&format!("{base}/healthz")).unwrap().code, 503);
    assert_eq!(get(&format!("{base}/livez")).unwrap().code, 503);
    health.updated();
    assert_eq!(get(&format!("{base}/healthz")).unwrap().code, 200);

    assert_eq!(get(&format!("{base}/nothing")).unwrap().code, 404);
    // /metrics is on its own address, not here.
    assert_eq!(get(&format!("{base}/metrics")).unwrap().code, 404);
}

#[test]
fn a_pending_change_within_the_timeout_keeps_healthz_up() {
    if !have_curl() {
        return;
    }
    let health = Arc::new(ProxyHealth::new(Duration::from_secs(3600)));
    let (_rt, servers, _m) = start(&health);
    health.updated();
    health.queued_update();
    let r = get(&format!(
        "http://{}/healthz",
        servers.healthz_addr().unwrap()
    ))
    .unwrap();
    assert_eq!(r.code, 200);
}

#[test]
fn node_not_eligible_fails_healthz_but_not_livez() {
    if !have_curl() {
        return;
    }
    let health = Arc::new(ProxyHealth::new(Duration::from_secs(3600)));
    let (_rt, servers, _m) = start(&health);
    let base = format!("http://{}", servers.healthz_addr().unwrap());
    health.updated();
    health.set_node_eligible(false);
    let r = get(&format!("{base}/healthz")).unwrap();
    assert_eq!(r.code, 503);
    assert_eq!(json(&r)["nodeEligible"], false);
    let r = get(&format!("{base}/livez")).unwrap();
    assert_eq!(r.code, 200);
    assert!(json(&r).get("nodeEligible").is_none());
    health.set_node_eligible(true);
    assert_eq!(get(&format!("{base}/healthz")).unwrap().code, 200);
}

#[test]
fn metrics_are_served_with_kube_proxy_names() {
    if !have_curl() {
        return;
    }
    let health = Arc::new(ProxyHealth::new(Duration::from_secs(3600)));
    let (_rt, servers, metrics) = start(&health);
    assert_ne!(servers.metrics_addr(), servers.healthz_addr());
    // One 503 probe, then a sync.
    get(&format!(
        "http://{}/healthz",
        servers.healthz_addr().unwrap()
    ))
    .unwrap();
    metrics.observe_sync(weir_proxy::SyncKind::Full, Duration::from_millis(5));
    health.updated();
    let r = get(&format!(
        "http://{}/metrics",
        servers.metrics_addr().unwrap()
    ))
    .unwrap();
    assert_eq!(r.code, 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("application/openmetrics-text"));
    for name in [
        "kubeproxy_sync_proxy_rules_duration_seconds_bucket",
        "kubeproxy_sync_full_proxy_rules_duration_seconds_count 1",
        "kubeproxy_sync_partial_proxy_rules_duration_seconds",
        "kubeproxy_network_programming_duration_seconds",
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
        "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
        "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
        "kubeproxy_sync_proxy_rules_endpoint_changes_total",
        "kubeproxy_sync_proxy_rules_service_changes_pending",
        "kubeproxy_sync_proxy_rules_service_changes_total",
        "kubeproxy_proxy_healthz_total{code=\"503\"} 1",
        "weir_proxy_sync_failures_total",
        "kubeproxy_conntrack_reconciler_deleted_entries_total",
    ] {
        assert!(r.body.contains(name), "missing {name} in\n{}", r.body);
    }
    // /healthz is not on the metrics address when the two differ.
    let r = get(&format!(
        "http://{}/healthz",
        servers.metrics_addr().unwrap()
    ))
    .unwrap();
    assert_eq!(r.code, 404);
}

#[test]
fn one_address_for_both_serves_all_paths() {
    if !have_curl() {
        return;
    }
    let health = Arc::new(ProxyHealth::new(Duration::from_secs(3600)));
    health.updated();
    let rt = HttpRuntime::new().unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let metrics = Arc::new(ProxyMetrics::new("nftables"));
    let servers =
        ProxyServers::start(&rt, Some(addr), Some(addr), health.clone(), metrics).unwrap();
    assert_eq!(servers.metrics_addr(), Some(addr));
    for path in ["/healthz", "/livez", "/metrics"] {
        assert_eq!(
            get(&format!("http://{addr}{path}")).unwrap().code,
            200,
            "{path}"
        );
    }
    drop(servers);
    assert!(
        get(&format!("http://{addr}/healthz")).is_none(),
        "closed on drop"
    );
}

fn want(entries: &[(&str, u16, usize)]) -> BTreeMap<(String, String), (u16, usize)> {
    entries
        .iter()
        .map(|(name, port, n)| (("web".to_string(), name.to_string()), (*port, *n)))
        .collect()
}

#[test]
fn health_check_node_ports_follow_local_endpoints_and_close_on_removal() {
    if !have_curl() {
        return;
    }
    let health = Arc::new(ProxyHealth::new(Duration::from_secs(3600)));
    health.updated();
    let rt = HttpRuntime::new().unwrap();
    let mut hc = ServiceHealthServers::new(&rt, vec!["127.0.0.1".parse().unwrap()], health.clone());
    let (p1, p2) = (free_port(), free_port());
    let url = |p: u16| format!("http://127.0.0.1:{p}/");

    assert!(hc
        .sync(&want(&[("lb", p1, 2), ("other", p2, 0)]))
        .is_empty());
    let r = get(&url(p1)).unwrap();
    assert_eq!(r.code, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(r.header("x-load-balancing-endpoint-weight"), Some("2"));
    let j = json(&r);
    assert_eq!(j["service"]["namespace"], "web");
    assert_eq!(j["service"]["name"], "lb");
    assert_eq!(j["localEndpoints"], 2);
    assert_eq!(j["serviceProxyHealthy"], true);
    let r = get(&url(p2)).unwrap();
    assert_eq!(
        (r.code, json(&r)["localEndpoints"].as_u64()),
        (503, Some(0))
    );

    // The count flips the answer; the listener stays.
    hc.sync(&want(&[("lb", p1, 0), ("other", p2, 1)]));
    assert_eq!(get(&url(p1)).unwrap().code, 503);
    assert_eq!(get(&url(p2)).unwrap().code, 200);

    // An unhealthy proxy fails every check, and says so.
    let stale = Arc::new(ProxyHealth::new(Duration::from_secs(3600)));
    let mut hc_stale = ServiceHealthServers::new(&rt, vec!["127.0.0.1".parse().unwrap()], stale);
    let p3 = free_port();
    hc_stale.sync(&want(&[("lb", p3, 3)]));
    let r = get(&url(p3)).unwrap();
    assert_eq!(r.code, 503);
    assert_eq!(json(&r)["serviceProxyHealthy"], false);

    // Removal closes the port at once; a port change moves the listener.
    let p4 = free_port();
    hc.sync(&want(&[("other", p4, 1)]));
    assert!(get(&url(p1)).is_none(), "removed service still answers");
    assert!(get(&url(p2)).is_none(), "old port still answers");
    assert_eq!(get(&url(p4)).unwrap().code, 200);
    hc.sync(&BTreeMap::new());
    assert!(get(&url(p4)).is_none());
    assert!(hc.listening().is_empty());
}

#[test]
fn a_taken_port_is_reported_and_retried() {
    if !have_curl() {
        return;
    }
    let health = Arc::new(ProxyHealth::new(Duration::from_secs(3600)));
    health.updated();
    let rt = HttpRuntime::new().unwrap();
    let mut hc = ServiceHealthServers::new(&rt, vec!["127.0.0.1".parse().unwrap()], health);
    // Not an ephemeral port: see `free_port`.
    let squatter = TcpListener::bind(("127.0.0.1", free_port())).unwrap();
    let port = squatter.local_addr().unwrap().port();
    let errors = hc.sync(&want(&[("lb", port, 1)]));
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].error.kind(), std::io::ErrorKind::AddrInUse);
    drop(squatter);
    // Retried on the next syncs: a port just freed can stay busy for a moment on a machine
    // shared with other tests (seen once in CI), so a few syncs are allowed.
    let mut errors = hc.sync(&want(&[("lb", port, 1)]));
    for _ in 0..20 {
        if errors.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        errors = hc.sync(&want(&[("lb", port, 1)]));
    }
    assert!(errors.is_empty(), "the freed port {port}: {errors:?}");
    assert_eq!(get(&format!("http://127.0.0.1:{port}/")).unwrap().code, 200);
}

/// Listeners open in the network namespace of the thread that calls `start`/`sync`, while
/// the runtime's threads stay where they are.
#[test]
fn servers_open_inside_the_callers_network_namespace() {
    if !weir_testkit::can_run(weir_testkit::missing(true, &["curl", "ip"])) {
        return;
    }
    struct Ns(String);
    impl Drop for Ns {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }
    let ns = Ns(format!("wh-netns-{}", std::process::id()));
    assert!(Command::new("ip")
        .args(["netns", "add", &ns.0])
        .status()
        .unwrap()
        .success());
    assert!(Command::new("ip")
        .args(["-n", &ns.0, "link", "set", "lo", "up"])
        .status()
        .unwrap()
        .success());

    let health = Arc::new(ProxyHealth::new(Duration::from_secs(3600)));
    health.updated();
    let rt = HttpRuntime::new().unwrap();
    let netns = weir_kernel::NetNs::named(&ns.0).unwrap();
    let port = 31999;
    let (servers, hc) = netns
        .run(|| {
            let servers = ProxyServers::start(
                &rt,
                Some(format!("127.0.0.1:{port}").parse().unwrap()),
                None,
                health.clone(),
                Arc::new(ProxyMetrics::new("nftables")),
            )
            .unwrap();
            let mut hc = ServiceHealthServers::new(&rt, vec![], health.clone());
            assert!(hc.sync(&want(&[("lb", port + 1, 1)])).is_empty());
            (servers, hc)
        })
        .unwrap();
    let inside = |p: u16, path: &str| get_in(Some(&ns.0), &format!("http://127.0.0.1:{p}{path}"));
    assert_eq!(inside(port, "/healthz").unwrap().code, 200);
    assert_eq!(inside(port + 1, "/").unwrap().code, 200);
    // Wildcard health check listeners are dual-stack.
    if std::path::Path::new("/proc/sys/net/ipv6").exists() {
        let r = get_in(Some(&ns.0), &format!("http://[::1]:{}/", port + 1)).unwrap();
        assert_eq!(r.code, 200);
    }
    // Nothing of ours in the test's own namespace.
    let outside = get(&format!("http://127.0.0.1:{port}/healthz"));
    assert!(
        outside.is_none_or(|r| !r.body.contains("nodeEligible")),
        "served in the wrong namespace"
    );
    drop(hc);
    assert!(inside(port + 1, "/").is_none());
    drop(servers);
}
