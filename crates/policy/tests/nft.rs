//! nftables rendering: a reviewed golden of a small cluster, `nft -c` (check only, in a
//! network namespace of its own: nothing is loaded) on it and on random plans, and diffs
//! that move one plan's ruleset to the next's in one transaction.

mod common;

use std::path::PathBuf;
use std::process::Command;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use proptest::prelude::*;
use serde_json::json;
use weir_policy::nft::{self, Ruleset};
use weir_policy::{plan, Cluster};

fn pod(name: &str, node: &str, app: &str, ips: &[&str]) -> serde_json::Value {
    json!({
        "metadata": {"namespace": "shop", "name": name, "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "ports": [
            {"name": "http", "containerPort": 8080},
            {"name": "dns", "containerPort": 53, "protocol": "UDP"},
        ]}]},
        "status": {"phase": "Running", "podIPs": ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>()},
    })
}

fn cluster(pods: serde_json::Value, policies: serde_json::Value) -> Cluster {
    let namespaces: Vec<Namespace> =
        serde_json::from_value(json!([{"metadata": {"name": "shop", "labels": {"team": "x"}}}]))
            .unwrap();
    let pods: Vec<Pod> = serde_json::from_value(pods).unwrap();
    let policies: Vec<NetworkPolicy> = serde_json::from_value(policies).unwrap();
    Cluster::from_objects(&namespaces, &pods, &policies).0
}

fn policies() -> serde_json::Value {
    json!([
        {"metadata": {"namespace": "shop", "name": "web-from-lb"},
         "spec": {"podSelector": {"matchLabels": {"app": "web"}},
                  "ingress": [
                      {"from": [{"podSelector": {"matchLabels": {"app": "lb"}}},
                                {"ipBlock": {"cidr": "10.8.0.0/16", "except": ["10.8.1.0/24"]}},
                                {"ipBlock": {"cidr": "fd00:8::/32"}}],
                       "ports": [{"port": "http"}, {"port": 9000, "endPort": 9100},
                                 {"protocol": "SCTP"}]},
                      {"from": [{"namespaceSelector": {"matchLabels": {"team": "x"}},
                                 "podSelector": {"matchLabels": {"app": "probe"}}}]}]}},
        {"metadata": {"namespace": "shop", "name": "web-out"},
         "spec": {"podSelector": {"matchLabels": {"app": "web"}},
                  "policyTypes": ["Egress"],
                  "egress": [{"to": [{"podSelector": {"matchLabels": {"app": "db"}}}],
                              "ports": [{"port": "http"}]},
                             {"ports": [{"protocol": "UDP", "port": "dns"}, {"protocol": "UDP", "port": 53}]}]}},
        {"metadata": {"namespace": "shop", "name": "db-deny"},
         "spec": {"podSelector": {"matchLabels": {"app": "db"}}}},
        // A second isolating policy for web and db (free-0 stays open): the drop comments
        // name both.
        {"metadata": {"namespace": "shop", "name": "default-deny"},
         "spec": {"podSelector": {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["free"]}]},
                  "policyTypes": ["Ingress"]}},
    ])
}

fn before() -> Cluster {
    cluster(
        json!([
            pod("web-0", "n1", "web", &["10.0.0.1", "fd00::1"]),
            pod("web-1", "n1", "web", &["10.0.0.2"]),
            pod("db-0", "n1", "db", &["10.0.0.3"]),
            pod("free-0", "n1", "free", &["10.0.0.4"]),
            pod("lb-0", "n2", "lb", &["10.0.1.1", "fd00:1::1"]),
            pod("probe-0", "n2", "probe", &["10.0.1.2"]),
            pod("db-1", "n2", "db", &["10.0.1.3"]),
        ]),
        policies(),
    )
}

/// web-1 is gone and its address reused by a new db pod; lb-0 moved address; db-0 freed.
fn after() -> Cluster {
    let mut policies = policies();
    policies
        .as_array_mut()
        .unwrap()
        .retain(|p| p["metadata"]["name"] != "db-deny");
    policies.as_array_mut().unwrap().push(json!(
        {"metadata": {"namespace": "shop", "name": "db-deny"},
         "spec": {"podSelector": {"matchLabels": {"app": "db"}, "matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["x"]}]},
                  "ingress": [{"from": [{"podSelector": {}}]}]}}));
    cluster(
        json!([
            pod("web-0", "n1", "web", &["10.0.0.1", "fd00::1"]),
            pod("db-2", "n1", "db", &["10.0.0.2"]),
            pod("db-0", "n1", "free", &["10.0.0.3"]),
            pod("free-0", "n1", "free", &["10.0.0.4"]),
            pod("lb-0", "n2", "lb", &["10.0.1.5", "fd00:1::1"]),
            pod("probe-0", "n2", "probe", &["10.0.1.2"]),
            pod("db-1", "n2", "db", &["10.0.1.3"]),
        ]),
        policies,
    )
}

/// Compares with the reviewed file; `UPDATE_GOLDEN=1` rewrites it.
fn golden(name: &str, text: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, text).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(
        text,
        want,
        "{} differs (UPDATE_GOLDEN=1 to accept)",
        path.display()
    );
}

/// `nft -c -f` in a fresh network namespace: the kernel checks the transaction and aborts
/// it, and the host's ruleset is never involved. `None` when the check cannot run here.
fn nft_check(script: &str) -> Option<Result<(), String>> {
    if !weir_testkit::can_run(weir_testkit::missing(true, &["nft", "unshare"])) {
        return None;
    }
    let file = std::env::temp_dir().join(format!(
        "weir-policy-{}-{:?}.nft",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::write(&file, script).unwrap();
    let out = Command::new("unshare")
        .args(["-n", "nft", "-c", "-f"])
        .arg(&file)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    Some(if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    })
}

#[test]
fn the_table_is_as_reviewed_and_nft_accepts_it() {
    let plan = plan(&before(), "n1");
    let text = nft::render(&plan);
    golden("before.nft", &text);
    if let Some(result) = nft_check(&text) {
        result.unwrap();
    }
}

#[test]
fn the_diff_changes_only_what_differs_and_nft_accepts_it_after_the_table() {
    let (old, new) = (plan(&before(), "n1"), plan(&after(), "n1"));
    let script = nft::render_diff(&old, &new);
    golden("before-to-after.nft", &script);
    golden("after.nft", &nft::render(&new));
    let mut moved = Ruleset::from_plan(&old);
    moved.apply(&moved.diff(&Ruleset::from_plan(&new)));
    assert_eq!(moved, Ruleset::from_plan(&new));
    assert_eq!(nft::render_diff(&new, &new), "");
    if let Some(result) = nft_check(&format!("{}{script}", nft::render(&old))) {
        result.unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Any two random plans: the diff moves the first ruleset to the second, and nft takes
    /// the first table followed by the diff as one valid transaction.
    #[test]
    fn diffs_between_random_plans_apply(a in common::cluster(), b in common::cluster()) {
        let objects = |g: &common::ClusterGen| {
            let (n, p, q) = g.objects();
            Cluster::from_objects(&n, &p, &q).0
        };
        let (old, new) = (plan(&objects(&a), "node-a"), plan(&objects(&b), "node-a"));
        let (old_rules, new_rules) = (Ruleset::from_plan(&old), Ruleset::from_plan(&new));
        let diff = old_rules.diff(&new_rules);
        let mut moved = old_rules.clone();
        moved.apply(&diff);
        prop_assert_eq!(&moved, &new_rules);
        let script = format!("{}{}", nft::render(&old), nft::render_ruleset_diff(&diff));
        if let Some(result) = nft_check(&script) {
            prop_assert!(result.is_ok(), "{}\n{}", result.unwrap_err(), script);
        }
    }
}
