//! `weir agent`, the one node agent (root only): the real binary in a throwaway network
//! namespace running the proxy, node routes and NetworkPolicy over one set of watches on
//! weir's fake API server (the real list/watch protocol), observed through the API server's
//! request log, real TCP connections to a ClusterIP, the kernel's routes and nftables, and
//! the agent's /healthz and /metrics.

use std::time::Duration;

mod common;
use common::agent::{Agent, EXTRA, SOLO};
use common::runnable;
use weir_fakeapi::FakeApi;

/// This node, a second node whose pod CIDR routes reach over host-gw, and what the policy
/// part reads: a namespace, a pod on this node and a default-deny.
const CLUSTER: &str = "apiVersion: v1
kind: Node
metadata: {name: node-a}
spec: {podCIDR: 10.244.9.0/24}
status: {addresses: [{type: InternalIP, address: 192.0.2.10}]}
---
apiVersion: v1
kind: Node
metadata: {name: node-b}
spec: {podCIDR: 10.244.7.0/24}
status: {addresses: [{type: InternalIP, address: 192.0.2.11}]}
---
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: shop, labels: {app: web}}
spec: {nodeName: node-a, containers: [{name: c}]}
status: {phase: Running, podIP: 10.244.9.20, podIPs: [{ip: 10.244.9.20}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: default-deny, namespace: shop}
spec: {podSelector: {}}
";

/// The agent in its namespace (an underlay link holding the node's address, so host-gw's
/// next hop is on-link), the pods' echo server, and the fake API server on the namespace's
/// 127.0.0.1:6443 holding the cluster. `status`: node routes' status file. Not started.
fn setup(tag: &str, status: Option<&str>) -> (Agent, FakeApi) {
    let mut a = Agent::with_manifest(tag, "nftables", "");
    a.command = "agent";
    a.use_manifests = false;
    let dir = a.dir.path().to_path_buf();
    let status = status.map_or_else(
        || dir.join("routes-status.json").display().to_string(),
        String::from,
    );
    a.args = vec![
        "--master=http://127.0.0.1:6443".into(),
        "--sync-period=1s".into(),
        "--backend=host-gw".into(),
        format!("--status={status}"),
        format!("--mtu-file={}", dir.join("mtu").display()),
    ];
    a.sh_ok(
        "ip link add uplink type veth peer name uplink-peer
         ip addr add 192.0.2.10/24 dev uplink
         ip link set uplink up
         ip link set uplink-peer up",
    );
    a.serve_pods();
    let api = FakeApi::start(Some(&a.ns), "127.0.0.1:6443".parse().unwrap()).unwrap();
    api.set_faults(|f| f.bookmark_interval = Duration::from_millis(500));
    api.apply_yaml(&format!("{SOLO}---\n{CLUSTER}")).unwrap();
    (a, api)
}

/// The API paths of `verb` requests ("list": no `watch=`; "watch"), without their queries.
fn requests(api: &FakeApi, watch: bool) -> Vec<String> {
    let mut paths: Vec<String> = api
        .requests()
        .iter()
        .filter(|r| r.starts_with("GET ") && r.contains("watch=true") == watch)
        .filter_map(|r| {
            let uri = r.strip_prefix("GET ")?;
            let path = uri.split('?').next()?;
            // The kinds' collections, not discovery or a single object.
            let collection = ["services", "endpointslices", "nodes", "namespaces", "pods"]
                .iter()
                .chain(&["networkpolicies"])
                .any(|c| path.ends_with(c));
            collection.then(|| path.to_string())
        })
        .collect();
    paths.sort();
    paths
}

#[test]
fn one_agent_lists_and_watches_each_kind_once_and_runs_every_part() {
    if !runnable() {
        return;
    }
    let (mut a, api) = setup("one", None);
    a.start(); // /healthz 200: every part is healthy
    a.wait_for("solo through the proxy part", || a.solo_answers());
    a.wait_for("host-gw route to node-b's pods", || {
        a.sh("ip route show 10.244.7.0/24")
            .contains("via 192.0.2.11")
    });
    a.wait_for("the policy part's table", || {
        a.sh("nft list table inet weir-policy 2>/dev/null")
            .contains("ingress_shop/web")
    });

    // Six kinds, each listed once and watched once (a watch is reopened only after its
    // server-side timeout, minutes away).
    let lists = requests(&api, false);
    assert_eq!(
        lists,
        [
            "/api/v1/namespaces",
            "/api/v1/nodes",
            "/api/v1/pods",
            "/api/v1/services",
            "/apis/discovery.k8s.io/v1/endpointslices",
            "/apis/networking.k8s.io/v1/networkpolicies",
        ],
        "{:#?}",
        api.requests()
    );
    assert_eq!(requests(&api, true), lists, "{:#?}", api.requests());

    let (code, body) = a.http("10256/healthz");
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains(r#""parts": {"policy":"ok","proxy":"ok","routes":"ok"}"#),
        "{body}"
    );
    let (_, metrics) = a.http("10249/metrics");
    for family in [
        "kubeproxy_sync_proxy_rules_duration_seconds",
        "weir_source_objects",
        "weir_routes_nodes_routed",
        "weir_policy_syncs",
    ] {
        assert!(metrics.contains(family), "{family} missing:\n{metrics}");
    }
    assert_eq!(metrics.matches("# EOF").count(), 1, "{metrics}");

    // A change of one kind reaches its part through the one watch.
    api.apply_yaml(EXTRA).unwrap();
    a.wait_for("the new service", || a.answers("10.96.7.7", 80));
    assert_eq!(requests(&api, true), lists, "no watch was reopened");
}

#[test]
fn a_part_that_stops_is_named_on_healthz_and_the_others_go_on() {
    if !runnable() {
        return;
    }
    // Node routes cannot write their status file: their loop ends at its first report.
    let (mut a, api) = setup("stop", Some("/proc/weir-no-such-dir/status.json"));
    a.spawn();
    // Routes may stop before the proxy's first sync: wait for both.
    a.wait_for(
        "healthz naming the stopped routes part, the proxy synced",
        || {
            let (code, body) = a.http("10256/healthz");
            code == 503
                && body.contains(r#""routes":"stopped: "#)
                && body.contains(r#""proxy":"ok""#)
        },
    );
    let (_, body) = a.http("10256/healthz");
    assert!(body.contains(r#""proxy":"ok""#), "{body}");
    assert!(body.contains(r#""policy":"ok""#), "{body}");
    assert!(a.running(), "the agent goes on");
    // The proxy still follows the API.
    a.wait_for("solo", || a.solo_answers());
    api.apply_yaml(EXTRA).unwrap();
    a.wait_for("the new service", || a.answers("10.96.7.7", 80));
    assert!(a.log().contains("stopped"), "{}", a.log());
}
