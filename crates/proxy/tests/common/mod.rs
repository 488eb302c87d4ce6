//! Fixtures and helpers the proxy's test binaries share.
#![allow(dead_code)]

pub mod lab;

use std::path::{Path, PathBuf};
use std::process::Command;

use weir_model::{plan, Plan, ProxyConfig, Snapshot};
use weir_source::ManifestDir;

/// `tests/<p>` of this crate.
pub fn dir(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join(p)
}

/// The plan of fixture directory `tests/fixtures/<fixture>` for node-a (dual-stack cluster).
pub fn load(fixture: &str) -> Plan {
    load_with(fixture, vec![])
}

pub fn load_with(fixture: &str, nodeport_addresses: Vec<ipnet::IpNet>) -> Plan {
    let mut d = ManifestDir::new(dir(&format!("fixtures/{fixture}")));
    let r = d.scan();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let cfg = ProxyConfig {
        node_name: "node-a".into(),
        cluster_cidrs: vec![
            "10.244.0.0/16".parse().unwrap(),
            "fd00:244::/48".parse().unwrap(),
        ],
        nodeport_addresses,
        ..Default::default()
    };
    plan(&Snapshot::from_objects(&d.objects()), &cfg)
}

/// Compares with tests/golden/<name>; `WEIR_UPDATE_GOLDEN=1` rewrites it.
pub fn golden(name: &str, actual: &str) {
    let path = dir("golden").join(name);
    if std::env::var_os("WEIR_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap();
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        expected == actual,
        "golden {name} differs; rerun with WEIR_UPDATE_GOLDEN=1 and review:\n{actual}"
    );
}

/// Runs a shell script in a fresh network namespace (nothing outside it changes):
/// (success, stdout + stderr).
pub fn in_netns(script: &str) -> (bool, String) {
    let out = Command::new("unshare")
        .args(["--net", "sh", "-ec", script])
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}
