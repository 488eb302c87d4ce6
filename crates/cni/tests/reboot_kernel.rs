//! The reboot reconciliation through the plugin, against the real kernel: the first GC after a
//! reboot releases only what is provably from an earlier boot and never an attachment it was told
//! is valid (issue 7, defect 6). Needs root.

mod common;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use common::{run_plugin, unique, TestNs};
use weir_cni::bridge::host_veth_name;

fn plugin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_weir-cni"))
}

/// This boot's start by the wall clock, minus a day: how a file from an earlier boot looks.
fn before_this_boot() -> SystemTime {
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let btime: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    SystemTime::UNIX_EPOCH + Duration::from_secs(btime) - Duration::from_secs(86_400)
}

fn age(path: &Path) {
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(before_this_boot())
        .unwrap();
}

#[test]
fn the_first_gc_after_a_reboot_keeps_valid_attachments() {
    let p = unique("rg");
    let node = TestNs::new(&format!("{p}-node"));
    let pod = TestNs::new(&format!("{p}-p"));
    let data = tempfile::tempdir().unwrap();
    let conf = format!(
        r#"{{"cniVersion":"1.1.0","name":"rg","type":"weir-cni","bridge":"br-rg",
            "ipam":{{"type":"host-local","subnet":"10.95.1.0/24","dataDir":"{}"}}}}"#,
        data.path().display()
    );
    let res = run_plugin(
        &plugin(),
        &node,
        "ADD",
        "live",
        Some(&pod.path()),
        "eth0",
        &conf,
    )
    .ok()
    .json();
    let live: IpAddr = res["ips"][0]["address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();

    // Make the store look as if weir last ran in an earlier boot, with a dead pod's allocation
    // and the live pod's file both dated before this boot.
    let dir = data.path().join("rg");
    std::fs::write(dir.join("weir-boot-id"), "an-earlier-boot").unwrap();
    std::fs::write(dir.join("10.95.1.50"), "dead\r\neth0").unwrap();
    for f in [
        "weir-boot-id".to_string(),
        "10.95.1.50".into(),
        live.to_string(),
    ] {
        age(&dir.join(f));
    }

    let gc = conf.replacen(
        '{',
        r#"{"cni.dev/valid-attachments":[{"containerID":"live","ifname":"eth0"}],"#,
        1,
    );
    run_plugin(&plugin(), &node, "GC", "", None, "", &gc).ok();

    assert!(
        !dir.join("10.95.1.50").exists(),
        "the dead pod's address is released"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join(live.to_string())).unwrap(),
        "live\r\neth0",
        "the valid attachment keeps its address"
    );
    let veth = host_veth_name("rg", "live", "eth0");
    assert!(
        node.sh(&format!("ip -o link show {veth}")).contains(&veth),
        "and its interface"
    );
    run_plugin(
        &plugin(),
        &node,
        "DEL",
        "live",
        Some(&pod.path()),
        "eth0",
        &conf,
    )
    .ok();
}
