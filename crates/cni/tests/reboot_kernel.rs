//! The reboot reconciliation through the plugin, against the real kernel: the first GC after a
//! reboot releases only what is provably from an earlier boot and never an attachment it was told
//! is valid (issue 7, defect 6). Needs root.

mod common;

use std::path::Path;
use std::time::{Duration, SystemTime};

use common::{pod_ip, with_valid_attachments, Node};
use weir_cni::bridge::host_veth_name;

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
    let node = Node::new("rg");
    let pod = node.pod("p");
    let cni = node.cni();
    let conf = format!(
        r#"{{"cniVersion":"1.1.0","name":"rg","type":"weir-cni","bridge":"br-rg",
            "ipam":{{"type":"host-local","subnet":"10.95.1.0/24","dataDir":"{}"}}}}"#,
        node.data().display()
    );
    let live = pod_ip(&cni.add("live", &pod, &conf).ok().json());

    // Make the store look as if weir last ran in an earlier boot, with a dead pod's allocation
    // and the live pod's file both dated before this boot.
    let dir = node.data().join("rg");
    std::fs::write(dir.join("weir-boot-id"), "an-earlier-boot").unwrap();
    std::fs::write(dir.join("10.95.1.50"), "dead\r\neth0").unwrap();
    for f in [
        "weir-boot-id".to_string(),
        "10.95.1.50".into(),
        live.to_string(),
    ] {
        age(&dir.join(f));
    }

    let gc = with_valid_attachments(&conf, &[("live", "eth0")]);
    cni.network("GC", &gc).ok();

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
    cni.del("live", &pod, &conf).ok();
}
