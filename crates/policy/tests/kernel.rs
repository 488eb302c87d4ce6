//! The nftables backend against a real kernel (root): in a network namespace of the test's
//! own (`ip netns`, removed on drop, also after a panic), the whole table first, diffs after,
//! a rejected transaction that leaves everything as it was, the check that sees outside
//! changes, and a cleanup that takes only weir's table.

use std::process::Command;

use serde_json::json;
use weir_policy::backend::{Backend, SyncKind};
use weir_policy::k8s_openapi::api::core::v1::{Namespace, Pod};
use weir_policy::k8s_openapi::api::networking::v1::NetworkPolicy;
use weir_policy::kernel::{Nft, NftBackend, NftCommand, NftLibrary};
use weir_policy::{plan, Cluster, PolicyPlan};

struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("wpk-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap()
            .success();
        assert!(ok, "ip netns add {name}");
        Netns(name)
    }

    fn nft(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.0, "nft"])
            .args(args)
            .output()
            .unwrap();
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    fn nft_script(&self, script: &str) {
        let file = tempfile_path();
        std::fs::write(&file, script).unwrap();
        let r = self.nft(&["-f", file.to_str().unwrap()]);
        let _ = std::fs::remove_file(&file);
        r.unwrap();
    }

    fn command_backend(&self) -> NftBackend<NftCommand> {
        NftBackend::with_nft(NftCommand::with_prefix(&["ip", "netns", "exec", &self.0]))
    }

    /// libnftables in the test process, writing into this namespace.
    fn library_backend(&self) -> NftBackend<NftLibrary> {
        let netns = weir_kernel::NetNs::named(&self.0).expect("the test's namespace");
        NftBackend::with_nft(NftLibrary::in_netns(netns).expect("libnftables"))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

fn tempfile_path() -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "weir-policy-kernel-{}-{:?}.nft",
        std::process::id(),
        std::thread::current().id()
    ))
}

/// Pods a..e on n1 (10.0.0.1..), `isolated` of them selected by a default-deny policy with
/// one allow rule from app=x on TCP 80.
fn planned(isolated: &[&str]) -> PolicyPlan {
    let names = ["a", "b", "c", "d", "e"];
    let pods: Vec<Pod> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let app = if isolated.contains(n) { "iso" } else { "x" };
            serde_json::from_value(json!({
                "metadata": {"namespace": "shop", "name": n, "labels": {"app": app}},
                "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
                "status": {"phase": "Running", "podIP": format!("10.0.0.{}", i + 1)},
            }))
            .unwrap()
        })
        .collect();
    let policies: Vec<NetworkPolicy> = serde_json::from_value(json!([
        {"metadata": {"namespace": "shop", "name": "iso"},
         "spec": {"podSelector": {"matchLabels": {"app": "iso"}},
                  "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "x"}}}],
                               "ports": [{"port": 80}]}]}}
    ]))
    .unwrap();
    let ns: Vec<Namespace> =
        serde_json::from_value(json!([{"metadata": {"name": "shop"}}])).unwrap();
    plan(&Cluster::from_objects(&ns, &pods, &policies).0, "n1")
}

const OTHER: &str = "table inet other {\n\tchain c {\n\t\ttype filter hook forward priority 10; policy accept;\n\t\tcounter\n\t}\n}\n";

#[test]
fn whole_table_then_diffs_rejected_transactions_leave_all_as_it_was_checks_and_cleanup() {
    if !weir_testkit::can_run(weir_testkit::missing(true, &["nft", "ip"])) {
        return;
    }
    let ns = Netns::new("b");
    let b = ns.command_backend();
    the_backend_contract(&ns, b);
}

/// The same contract through libnftables in the process (what `weir policy` uses where the
/// library loads).
#[test]
fn the_in_process_library_keeps_the_same_contract() {
    let missing = (!weir_kernel::libnftables::available())
        .then(|| "libnftables.so.1 (package libnftables1)".to_string());
    let needs = weir_testkit::all([weir_testkit::missing(true, &["nft", "ip"]), missing]);
    if !weir_testkit::can_run(needs) {
        return;
    }
    let host_tables = || {
        let out = Command::new("nft")
            .args(["list", "tables"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let before = host_tables();
    let ns = Netns::new("l");
    let b = ns.library_backend();
    the_backend_contract(&ns, b);
    // The context wrote into the test's namespace only, whichever thread called it.
    assert_eq!(host_tables(), before, "the host's tables");
}

fn the_backend_contract<N: Nft>(ns: &Netns, mut b: NftBackend<N>) {
    ns.nft_script(OTHER);

    let one = planned(&["a", "b"]);
    assert_eq!(b.sync(&one).unwrap().kind, SyncKind::Full);
    assert!(b.intact().unwrap());
    let listed = ns.nft(&["list", "table", "inet", "weir-policy"]).unwrap();
    assert!(listed.contains("chain ingress_shop/a {"), "{listed}");

    let two = planned(&["a", "c"]);
    let r = b.sync(&two).unwrap();
    assert_eq!((r.kind, r.chains_written), (SyncKind::Diff, 3));
    assert!(b.intact().unwrap());
    let listed = ns.nft(&["list", "table", "inet", "weir-policy"]).unwrap();
    assert!(
        listed.contains("chain ingress_shop/c {") && !listed.contains("ingress_shop/b"),
        "{listed}"
    );
    assert_eq!(b.sync(&two).unwrap().kind, SyncKind::Noop);

    // Someone deletes an element the next diff deletes too: nft rejects the whole
    // transaction and the kernel holds exactly what it held before it.
    ns.nft(&[
        "delete",
        "element",
        "inet",
        "weir-policy",
        "ingress4",
        "{ 10.0.0.3 }",
    ])
    .unwrap();
    let before = ns.nft(&["list", "ruleset"]).unwrap();
    let three = planned(&["a", "d"]);
    let e = b.sync(&three).unwrap_err();
    assert!(e.to_string().contains("rules before it stay"), "{e}");
    assert_eq!(ns.nft(&["list", "ruleset"]).unwrap(), before);
    // The next sync writes the whole table, which repairs the outside change too.
    assert_eq!(b.sync(&three).unwrap().kind, SyncKind::Full);
    assert!(b.intact().unwrap());
    assert!(ns
        .nft(&["list", "ruleset"])
        .unwrap()
        .contains("table inet other"));

    // Outside changes the check sees.
    ns.nft(&[
        "add",
        "rule",
        "inet",
        "weir-policy",
        "ingress_shop/a",
        "accept",
    ])
    .unwrap();
    assert!(!b.intact().unwrap(), "a rule added");
    b.invalidate();
    b.sync(&three).unwrap();
    ns.nft(&["flush", "chain", "inet", "weir-policy", "forward"])
        .unwrap();
    assert!(!b.intact().unwrap(), "the base chain flushed");
    b.invalidate();
    b.sync(&three).unwrap();
    assert!(b.intact().unwrap());
    ns.nft(&["flush", "ruleset"]).unwrap();
    assert!(!b.intact().unwrap(), "nft flush ruleset");
    b.invalidate();
    assert_eq!(b.sync(&three).unwrap().kind, SyncKind::Full);
    assert!(b.intact().unwrap());

    // Cleanup takes weir's table and nothing else, and may run twice.
    ns.nft_script(OTHER);
    b.cleanup().unwrap();
    b.cleanup().unwrap();
    let tables = ns.nft(&["list", "tables"]).unwrap();
    assert_eq!(tables.trim(), "table inet other");
}
