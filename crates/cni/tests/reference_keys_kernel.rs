//! What an operator migrating from the reference bridge + host-local plugins relies on, against
//! the real kernel: requested addresses and MACs reaching the pod, and the reference bridge keys
//! weir implements (promiscMode, portIsolation, forceAddress, the single-range form, resolvConf).
//! Needs root.

mod common;

use std::net::IpAddr;
use std::path::Path;

use common::{allocated_addresses, assert_connects, fetch, pod_ip, serve_once, Node, TestNs};
use weir_cni::bridge::host_veth_name;

/// A bridge-mode network on bridge `br` in the node namespace, with `extra` top-level keys.
fn config(br: &str, subnet: &str, data_dir: &Path, extra: &str) -> String {
    format!(
        r#"{{"cniVersion":"1.1.0","name":"rk","type":"weir-cni","bridge":"{br}"{extra},
            "ipam":{{"type":"host-local","subnet":"{subnet}","dataDir":"{}"}}}}"#,
        data_dir.display()
    )
}

/// `ip -d` details of container `id`'s host veth: its bridge port flags (isolated, hairpin).
fn bridge_port(node: &TestNs, id: &str) -> String {
    node.sh(&format!(
        "ip -d -o link show {}",
        host_veth_name("rk", id, "eth0")
    ))
}

/// The addresses the store holds for network "rk".
fn address_files(data_dir: &Path) -> Vec<String> {
    allocated_addresses(data_dir, "rk")
}

#[test]
fn requested_addresses_and_macs_reach_the_pod() {
    let node = Node::new("rq");
    let (pod1, pod2, pod3) = (node.pod("p1"), node.pod("p2"), node.pod("p3"));
    let cni = node.cni();
    let net = |extra: &str| config("br-rq", "10.98.1.0/24", node.data(), extra);
    let base = net("");

    // capabilities ips + mac, as podman --ip/--mac and Multus send them
    let conf1 = net(r#","runtimeConfig":{"ips":["10.98.1.77/24"],"mac":"02:77:00:00:00:01"}"#);
    let res1 = cni.add("rq-one", &pod1, &conf1).ok().json();
    assert_eq!(res1["ips"][0]["address"], "10.98.1.77/24");
    assert_eq!(res1["interfaces"][2]["mac"], "02:77:00:00:00:01");
    let link = pod1.sh("ip -o link show eth0");
    assert!(link.contains("link/ether 02:77:00:00:00:01"), "{link}");
    assert!(pod1
        .sh("ip -o addr show eth0")
        .contains("inet 10.98.1.77/24"));

    // CNI_ARGS IP= and MAC=, as `ctr run --cni` and older runtimes pass them
    let res2 = node
        .cni()
        .with_env(
            "CNI_ARGS",
            "IgnoreUnknown=1;IP=10.98.1.78;MAC=02:77:00:00:00:02",
        )
        .add("rq-two", &pod2, &base)
        .ok()
        .json();
    assert_eq!(pod_ip(&res2), "10.98.1.78".parse::<IpAddr>().unwrap());
    assert!(pod2
        .sh("ip -o link show eth0")
        .contains("link/ether 02:77:00:00:00:02"));
    assert!(pod2
        .sh("ip -o addr show eth0")
        .contains("inet 10.98.1.78/24"));

    // the two pods talk over the bridge with the addresses they asked for
    assert_connects(&pod1, &pod2, "10.98.1.78", 7101);

    // an address another pod holds: code 104, and the failed ADD leaves nothing
    let taken = net(r#","args":{"cni":{"ips":["10.98.1.77"]}}"#);
    let before = address_files(node.data());
    let r3 = cni.add("rq-three", &pod3, &taken);
    assert_eq!(r3.error_code(), 104, "{}", r3.stdout);
    assert!(r3.json()["msg"].as_str().unwrap().contains("10.98.1.77"));
    assert_eq!(address_files(node.data()), before);
    assert!(!node
        .links()
        .contains(&host_veth_name("rk", "rq-three", "eth0")));
    assert!(pod3.sh("ip -o link show eth0").is_empty());

    // an address outside the network: code 7, naming it
    let outside = net(r#","runtimeConfig":{"ips":["10.98.2.5"]}"#);
    let r4 = cni.add("rq-three", &pod3, &outside);
    assert_eq!(r4.error_code(), 7, "{}", r4.stdout);
    assert!(r4.json()["msg"]
        .as_str()
        .unwrap()
        .contains("outside every range"));
    assert_eq!(address_files(node.data()), before);

    // requests matter to ADD only: a malformed one never blocks a DEL
    let malformed = net(r#","runtimeConfig":{"ips":["bogus"],"mac":"nope"}"#);
    node.cni()
        .with_env("CNI_ARGS", "IP=also-bogus")
        .del("rq-one", &pod1, &malformed)
        .ok();
    cni.del("rq-two", &pod2, &base).ok();
    assert!(address_files(node.data()).is_empty());
}

#[test]
fn reference_bridge_keys_take_effect() {
    let node = Node::new("rb");
    let (pod1, pod2) = (node.pod("p1"), node.pod("p2"));
    let cni = node.cni();
    let resolv = node.data().join("resolv.conf");
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
        node.data().display(),
        resolv.display()
    );
    let res1 = cni.add("rb-one", &pod1, &conf).ok().json();
    let res2 = cni.add("rb-two", &pod2, &conf).ok().json();

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
    let port = bridge_port(&node, "rb-one");
    assert!(
        port.contains("isolated on") && port.contains("hairpin off"),
        "{port}"
    );

    // portIsolation: the pods reach the gateway but not each other
    assert_connects(&pod1, &node, "10.97.1.1", 7102);
    let _server = serve_once(&pod2, 7103, "pod-two");
    assert!(
        fetch(&pod1, "10.97.1.101".parse().unwrap(), 7103).is_err(),
        "isolated ports must not forward to each other"
    );
    // unblock the listener so its thread ends
    let _ = fetch(&pod2, "127.0.0.1".parse().unwrap(), 7103);

    for (id, pod) in [("rb-one", &pod1), ("rb-two", &pod2)] {
        cni.del(id, pod, &conf).ok();
    }
}

#[test]
fn without_force_address_the_old_bridge_address_stays() {
    let node = Node::new("rf");
    let pod = node.pod("p");
    let cni = node.cni();
    node.sh("ip link add br-rf type bridge && ip addr add 10.96.1.9/24 dev br-rf && ip link set br-rf up");
    let conf = config("br-rf", "10.96.1.0/24", node.data(), "");
    cni.add("rf", &pod, &conf).ok();
    let addrs = node.sh("ip -o -4 addr show br-rf");
    assert!(
        addrs.contains("10.96.1.1/24") && addrs.contains("10.96.1.9/24"),
        "{addrs}"
    );
    let port = bridge_port(&node, "rf");
    assert!(
        port.contains("isolated off") && port.contains("hairpin on"),
        "{port}"
    );
    assert!(!node.sh("ip -o link show br-rf").contains("PROMISC"));
    cni.del("rf", &pod, &conf).ok();
}

#[test]
fn enabledad_keeps_duplicate_address_detection_on() {
    let node = Node::new("rd");
    let (pod1, pod2) = (node.pod("p1"), node.pod("p2"));
    let cni = node.cni();
    let conf = |extra: &str| {
        format!(
            r#"{{"cniVersion":"1.1.0","name":"rk","type":"weir-cni","bridge":"br-rd"{extra},
                "ipam":{{"type":"host-local","ranges":[[{{"subnet":"fd97::/120"}}]],"dataDir":"{}"}}}}"#,
            node.data().display()
        )
    };
    let (dad, default) = (conf(r#","enabledad":true"#), conf(""));
    cni.add("rd-one", &pod1, &dad).ok();
    cni.add("rd-two", &pod2, &default).ok();
    let accept_dad = |ns: &TestNs| ns.sh("cat /proc/sys/net/ipv6/conf/eth0/accept_dad");
    assert_eq!(accept_dad(&pod1).trim(), "1", "enabledad: DAD stays on");
    assert_eq!(accept_dad(&pod2).trim(), "0", "weir's default: DAD off");
    cni.del("rd-one", &pod1, &dad).ok();
    cni.del("rd-two", &pod2, &default).ok();
}
