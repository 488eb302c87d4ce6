//! What an operator migrating from the reference bridge + host-local plugins relies on, against
//! the real kernel: requested addresses and MACs reaching the pod, and the reference bridge keys
//! weir implements (promiscMode, portIsolation, forceAddress, the single-range form, resolvConf).
//! Needs root.

mod common;

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use common::{fetch, run_plugin, run_plugin_env, serve_once, unique, TestNs};
use weir_cni::bridge::host_veth_name;

fn plugin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_weir-cni"))
}

/// A bridge-mode network on bridge `br` in the node namespace, with `extra` top-level keys.
fn config(br: &str, subnet: &str, data_dir: &Path, extra: &str) -> String {
    format!(
        r#"{{"cniVersion":"1.1.0","name":"rk","type":"weir-cni","bridge":"{br}"{extra},
            "ipam":{{"type":"host-local","subnet":"{subnet}","dataDir":"{}"}}}}"#,
        data_dir.display()
    )
}

fn pod_ip(result: &serde_json::Value) -> IpAddr {
    let addr = result["ips"][0]["address"]
        .as_str()
        .expect("ips[0].address");
    addr.split('/').next().unwrap().parse().unwrap()
}

fn address_files(data_dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(data_dir.join("rk"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.parse::<IpAddr>().is_ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn requested_addresses_and_macs_reach_the_pod() {
    let p = unique("rq");
    let node = TestNs::new(&format!("{p}-node"));
    let pod1 = TestNs::new(&format!("{p}-p1"));
    let pod2 = TestNs::new(&format!("{p}-p2"));
    let pod3 = TestNs::new(&format!("{p}-p3"));
    let data = tempfile::tempdir().unwrap();
    let base = config("br-rq", "10.98.1.0/24", data.path(), "");

    // capabilities ips + mac, as podman --ip/--mac and Multus send them
    let conf1 = config(
        "br-rq",
        "10.98.1.0/24",
        data.path(),
        r#","runtimeConfig":{"ips":["10.98.1.77/24"],"mac":"02:77:00:00:00:01"}"#,
    );
    let r1 = run_plugin(
        &plugin(),
        &node,
        "ADD",
        "rq-one",
        Some(&pod1.path()),
        "eth0",
        &conf1,
    );
    let res1 = r1.ok().json();
    assert_eq!(res1["ips"][0]["address"], "10.98.1.77/24");
    assert_eq!(res1["interfaces"][2]["mac"], "02:77:00:00:00:01");
    let link = pod1.sh("ip -o link show eth0");
    assert!(link.contains("link/ether 02:77:00:00:00:01"), "{link}");
    assert!(pod1
        .sh("ip -o addr show eth0")
        .contains("inet 10.98.1.77/24"));

    // CNI_ARGS IP= and MAC=, as `ctr run --cni` and older runtimes pass them
    let r2 = run_plugin_env(
        &plugin(),
        &node,
        "ADD",
        "rq-two",
        Some(&pod2.path()),
        "eth0",
        &base,
        &[(
            "CNI_ARGS",
            "IgnoreUnknown=1;IP=10.98.1.78;MAC=02:77:00:00:00:02",
        )],
    );
    let res2 = r2.ok().json();
    assert_eq!(pod_ip(&res2), "10.98.1.78".parse::<IpAddr>().unwrap());
    assert!(pod2
        .sh("ip -o link show eth0")
        .contains("link/ether 02:77:00:00:00:02"));
    assert!(pod2
        .sh("ip -o addr show eth0")
        .contains("inet 10.98.1.78/24"));

    // the two pods talk over the bridge with the addresses they asked for
    let server = serve_once(&pod2, 7101, "pod-two");
    assert_eq!(
        fetch(&pod1, "10.98.1.78".parse().unwrap(), 7101).unwrap(),
        "pod-two"
    );
    server.join().unwrap();

    // an address another pod holds: code 104, and the failed ADD leaves nothing
    let taken = config(
        "br-rq",
        "10.98.1.0/24",
        data.path(),
        r#","args":{"cni":{"ips":["10.98.1.77"]}}"#,
    );
    let before = address_files(data.path());
    let r3 = run_plugin(
        &plugin(),
        &node,
        "ADD",
        "rq-three",
        Some(&pod3.path()),
        "eth0",
        &taken,
    );
    assert_eq!(r3.error_code(), 104, "{}", r3.stdout);
    assert!(r3.json()["msg"].as_str().unwrap().contains("10.98.1.77"));
    assert_eq!(address_files(data.path()), before);
    assert!(!node
        .sh("ip -o link show")
        .contains(&host_veth_name("rk", "rq-three", "eth0")));
    assert!(pod3.sh("ip -o link show eth0").is_empty());

    // an address outside the network: code 7, naming it
    let outside = config(
        "br-rq",
        "10.98.1.0/24",
        data.path(),
        r#","runtimeConfig":{"ips":["10.98.2.5"]}"#,
    );
    let r4 = run_plugin(
        &plugin(),
        &node,
        "ADD",
        "rq-three",
        Some(&pod3.path()),
        "eth0",
        &outside,
    );
    assert_eq!(r4.error_code(), 7, "{}", r4.stdout);
    assert!(r4.json()["msg"]
        .as_str()
        .unwrap()
        .contains("outside every range"));
    assert_eq!(address_files(data.path()), before);

    // requests matter to ADD only: a malformed one never blocks a DEL
    let malformed = config(
        "br-rq",
        "10.98.1.0/24",
        data.path(),
        r#","runtimeConfig":{"ips":["bogus"],"mac":"nope"}"#,
    );
    run_plugin_env(
        &plugin(),
        &node,
        "DEL",
        "rq-one",
        Some(&pod1.path()),
        "eth0",
        &malformed,
        &[("CNI_ARGS", "IP=also-bogus")],
    )
    .ok();
    run_plugin(
        &plugin(),
        &node,
        "DEL",
        "rq-two",
        Some(&pod2.path()),
        "eth0",
        &base,
    )
    .ok();
    assert!(address_files(data.path()).is_empty());
}

#[test]
fn reference_bridge_keys_take_effect() {
    let p = unique("rb");
    let node = TestNs::new(&format!("{p}-node"));
    let pod1 = TestNs::new(&format!("{p}-p1"));
    let pod2 = TestNs::new(&format!("{p}-p2"));
    let data = tempfile::tempdir().unwrap();
    let resolv = data.path().join("resolv.conf");
    std::fs::write(&resolv, "nameserver 10.96.0.10\nsearch svc.cluster.local\n").unwrap();

    // the bridge already holds an old gateway address in the subnet (the subnet's gateway moved)
    node.sh("ip link add br-rb type bridge && ip addr add 10.97.1.9/24 dev br-rb && ip link set br-rb up");
    let conf = format!(
        r#"{{"cniVersion":"1.0.0","name":"rk","type":"weir-cni","bridge":"br-rb",
            "promiscMode":true,"portIsolation":true,"forceAddress":true,"vlan":0,
            "macspoofchk":false,"isDefaultGateway":true,
            "ipam":{{"type":"host-local","subnet":"10.97.1.0/24","rangeStart":"10.97.1.100",
                    "rangeEnd":"10.97.1.110","gateway":"10.97.1.1","dataDir":"{}",
                    "resolvConf":"{}"}}}}"#,
        data.path().display(),
        resolv.display()
    );
    let res1 = run_plugin(
        &plugin(),
        &node,
        "ADD",
        "rb-one",
        Some(&pod1.path()),
        "eth0",
        &conf,
    )
    .ok()
    .json();
    let res2 = run_plugin(
        &plugin(),
        &node,
        "ADD",
        "rb-two",
        Some(&pod2.path()),
        "eth0",
        &conf,
    )
    .ok()
    .json();

    // single-range form: rangeStart is the first address handed out, gateway as configured
    assert_eq!(res1["ips"][0]["address"], "10.97.1.100/24");
    assert_eq!(res1["ips"][0]["gateway"], "10.97.1.1");
    assert_eq!(pod_ip(&res2), "10.97.1.101".parse::<IpAddr>().unwrap());
    // resolvConf → dns
    assert_eq!(
        res1["dns"],
        serde_json::json!({"nameservers":["10.96.0.10"],"search":["svc.cluster.local"]})
    );
    // forceAddress: the old address is gone, the gateway took its place
    let addrs = node.sh("ip -o -4 addr show br-rb");
    assert!(
        addrs.contains("10.97.1.1/24") && !addrs.contains("10.97.1.9/"),
        "{addrs}"
    );
    // promiscMode on the bridge, and (as in the reference) no hairpin with it
    let br = node.sh("ip -o link show br-rb");
    assert!(br.contains("PROMISC"), "{br}");
    let port = node.sh(&format!(
        "ip -d -o link show {}",
        host_veth_name("rk", "rb-one", "eth0")
    ));
    assert!(
        port.contains("isolated on") && port.contains("hairpin off"),
        "{port}"
    );

    // portIsolation: the pods reach the gateway but not each other
    let server = serve_once(&node, 7102, "node");
    assert_eq!(
        fetch(&pod1, "10.97.1.1".parse().unwrap(), 7102).unwrap(),
        "node"
    );
    server.join().unwrap();
    let _server = serve_once(&pod2, 7103, "pod-two");
    assert!(
        fetch(&pod1, "10.97.1.101".parse().unwrap(), 7103).is_err(),
        "isolated ports must not forward to each other"
    );
    // unblock the listener so its thread ends
    let _ = fetch(&pod2, "127.0.0.1".parse().unwrap(), 7103);

    for (id, pod) in [("rb-one", &pod1), ("rb-two", &pod2)] {
        run_plugin(
            &plugin(),
            &node,
            "DEL",
            id,
            Some(&pod.path()),
            "eth0",
            &conf,
        )
        .ok();
    }
}

#[test]
fn without_force_address_the_old_bridge_address_stays() {
    let p = unique("rf");
    let node = TestNs::new(&format!("{p}-node"));
    let pod = TestNs::new(&format!("{p}-p"));
    let data = tempfile::tempdir().unwrap();
    node.sh("ip link add br-rf type bridge && ip addr add 10.96.1.9/24 dev br-rf && ip link set br-rf up");
    let conf = config("br-rf", "10.96.1.0/24", data.path(), "");
    run_plugin(
        &plugin(),
        &node,
        "ADD",
        "rf",
        Some(&pod.path()),
        "eth0",
        &conf,
    )
    .ok();
    let addrs = node.sh("ip -o -4 addr show br-rf");
    assert!(
        addrs.contains("10.96.1.1/24") && addrs.contains("10.96.1.9/24"),
        "{addrs}"
    );
    let port = node.sh(&format!(
        "ip -d -o link show {}",
        host_veth_name("rk", "rf", "eth0")
    ));
    assert!(
        port.contains("isolated off") && port.contains("hairpin on"),
        "{port}"
    );
    assert!(!node.sh("ip -o link show br-rf").contains("PROMISC"));
    run_plugin(
        &plugin(),
        &node,
        "DEL",
        "rf",
        Some(&pod.path()),
        "eth0",
        &conf,
    )
    .ok();
}

#[test]
fn enabledad_keeps_duplicate_address_detection_on() {
    let p = unique("rd");
    let node = TestNs::new(&format!("{p}-node"));
    let pod1 = TestNs::new(&format!("{p}-p1"));
    let pod2 = TestNs::new(&format!("{p}-p2"));
    let data = tempfile::tempdir().unwrap();
    let conf = |extra: &str| {
        format!(
            r#"{{"cniVersion":"1.1.0","name":"rk","type":"weir-cni","bridge":"br-rd"{extra},
                "ipam":{{"type":"host-local","ranges":[[{{"subnet":"fd97::/120"}}]],"dataDir":"{}"}}}}"#,
            data.path().display()
        )
    };
    let dad = conf(r#","enabledad":true"#);
    run_plugin(
        &plugin(),
        &node,
        "ADD",
        "rd-one",
        Some(&pod1.path()),
        "eth0",
        &dad,
    )
    .ok();
    run_plugin(
        &plugin(),
        &node,
        "ADD",
        "rd-two",
        Some(&pod2.path()),
        "eth0",
        &conf(""),
    )
    .ok();
    let accept_dad = |ns: &TestNs| ns.sh("cat /proc/sys/net/ipv6/conf/eth0/accept_dad");
    assert_eq!(accept_dad(&pod1).trim(), "1", "enabledad: DAD stays on");
    assert_eq!(accept_dad(&pod2).trim(), "0", "weir's default: DAD off");
    run_plugin(
        &plugin(),
        &node,
        "DEL",
        "rd-one",
        Some(&pod1.path()),
        "eth0",
        &dad,
    )
    .ok();
    run_plugin(
        &plugin(),
        &node,
        "DEL",
        "rd-two",
        Some(&pod2.path()),
        "eth0",
        &conf(""),
    )
    .ok();
}
