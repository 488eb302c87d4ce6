//! weir-cni in bridge mode against the real kernel: namespaces for a node and its pods, the real
//! binary exec'd with the CNI protocol. Needs root.

mod common;

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use common::{eventually, fetch, run_plugin, serve_once, unique, TestNs};
use weir_cni::bridge::host_veth_name;

fn plugin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_weir-cni"))
}

fn config(version: &str, subnet: &str, data_dir: &Path, extra: &str) -> String {
    format!(
        r#"{{"cniVersion":"{version}","name":"kt","type":"weir-cni","bridge":"cni0","mtu":1400,
            "ipMasq":true,"clusterCIDR":"10.99.0.0/16"{extra},
            "ipam":{{"type":"weir-ipam","ranges":[[{{"subnet":"{subnet}"}}]],"dataDir":"{}",
                    "routes":[{{"dst":"0.0.0.0/0"}}]}}}}"#,
        data_dir.display()
    )
}

fn pod_ip(result: &serde_json::Value) -> IpAddr {
    let addr = result["ips"][0]["address"]
        .as_str()
        .expect("ips[0].address");
    addr.split('/').next().unwrap().parse().unwrap()
}

fn allocation_files(data_dir: &Path) -> Vec<String> {
    let dir = data_dir.join("kt");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.retain(|n| n.parse::<IpAddr>().is_ok());
    names.sort();
    names
}

#[test]
fn add_check_del_roundtrip_with_traffic() {
    let p = unique("rt");
    let node = TestNs::new(&format!("{p}-node"));
    let pod1 = TestNs::new(&format!("{p}-p1"));
    let pod2 = TestNs::new(&format!("{p}-p2"));
    let data = tempfile::tempdir().unwrap();
    let conf = config("1.1.0", "10.99.1.0/24", data.path(), "");

    let r1 = run_plugin(
        &plugin(),
        &node,
        "ADD",
        "pod-one",
        Some(&pod1.path()),
        "eth0",
        &conf,
    );
    let res1 = r1.ok().json();
    let r2 = run_plugin(
        &plugin(),
        &node,
        "ADD",
        "pod-two",
        Some(&pod2.path()),
        "eth0",
        &conf,
    );
    let res2 = r2.ok().json();

    // The result follows the spec: bridge, host veth, pod interface (with sandbox and 1.1's mtu).
    assert_eq!(res1["cniVersion"], "1.1.0");
    assert_eq!(res1["interfaces"][0]["name"], "cni0");
    assert_eq!(
        res1["interfaces"][1]["name"],
        host_veth_name("pod-one", "eth0")
    );
    assert_eq!(res1["interfaces"][2]["name"], "eth0");
    assert_eq!(
        res1["interfaces"][2]["sandbox"],
        pod1.path().display().to_string()
    );
    assert_eq!(res1["interfaces"][2]["mtu"], 1400);
    assert_eq!(res1["ips"][0]["interface"], 2);
    assert_eq!(res1["ips"][0]["gateway"], "10.99.1.1");
    let (ip1, ip2) = (pod_ip(&res1), pod_ip(&res2));
    assert_ne!(ip1, ip2);

    // What the kernel holds.
    let links = node.sh("ip -o link show");
    assert!(links.contains("cni0"), "{links}");
    let veth = host_veth_name("pod-one", "eth0");
    let veth_info = node.sh(&format!("ip -d -o link show {veth}"));
    assert!(
        veth_info.contains("master cni0")
            && veth_info.contains("hairpin on")
            && veth_info.contains("mtu 1400"),
        "{veth_info}"
    );
    assert!(node.sh("ip -o addr show cni0").contains("10.99.1.1/24"));
    assert!(pod1
        .sh("ip route show default")
        .contains("via 10.99.1.1 dev eth0"));
    assert_eq!(node.sh("cat /proc/sys/net/ipv4/ip_forward").trim(), "1");
    let set = node.sh("nft list set inet weir-cni pods4");
    assert!(
        set.contains(&ip1.to_string()) && set.contains(&ip2.to_string()),
        "{set}"
    );

    // Pod to pod over the bridge, and pod to node (gateway).
    let server = serve_once(&pod2, 7001, "pod-two");
    assert_eq!(fetch(&pod1, ip2, 7001).unwrap(), "pod-two");
    server.join().unwrap();
    let server = serve_once(&node, 7002, "node");
    assert_eq!(
        fetch(&pod1, "10.99.1.1".parse().unwrap(), 7002).unwrap(),
        "node"
    );
    server.join().unwrap();

    // CHECK passes with the prevResult ADD returned.
    let with_prev = conf.replacen('{', &format!("{{\"prevResult\":{},", res1), 1);
    run_plugin(
        &plugin(),
        &node,
        "CHECK",
        "pod-one",
        Some(&pod1.path()),
        "eth0",
        &with_prev,
    )
    .ok();

    // DEL removes the veth, the address and the masquerade element; a second DEL is still success.
    run_plugin(
        &plugin(),
        &node,
        "DEL",
        "pod-one",
        Some(&pod1.path()),
        "eth0",
        &conf,
    )
    .ok();
    // The pod is cut off at once (host end down, address free); the veth is deleted right after.
    eventually("the veth is deleted", || {
        !node.sh("ip -o link show").contains(&veth)
    });
    assert!(!node
        .sh("nft list set inet weir-cni pods4")
        .contains(&ip1.to_string()));
    assert_eq!(allocation_files(data.path()), vec![ip2.to_string()]);
    run_plugin(
        &plugin(),
        &node,
        "DEL",
        "pod-one",
        Some(&pod1.path()),
        "eth0",
        &conf,
    )
    .ok();
    // DEL with the namespace already gone is success too.
    drop(pod2);
    run_plugin(
        &plugin(),
        &node,
        "DEL",
        "pod-two",
        Some(Path::new("/run/netns/gone-already")),
        "eth0",
        &conf,
    )
    .ok();
    assert!(allocation_files(data.path()).is_empty());
}

#[test]
fn check_notices_what_was_broken() {
    let p = unique("ck");
    let node = TestNs::new(&format!("{p}-node"));
    let pod = TestNs::new(&format!("{p}-p"));
    let data = tempfile::tempdir().unwrap();
    let conf = config("1.0.0", "10.99.2.0/24", data.path(), "");
    let res = run_plugin(
        &plugin(),
        &node,
        "ADD",
        "ck",
        Some(&pod.path()),
        "eth0",
        &conf,
    )
    .ok()
    .json();
    assert!(
        res["interfaces"][2].get("mtu").is_none(),
        "mtu is a 1.1 field"
    );
    let with_prev = conf.replacen('{', &format!("{{\"prevResult\":{res},"), 1);
    run_plugin(
        &plugin(),
        &node,
        "CHECK",
        "ck",
        Some(&pod.path()),
        "eth0",
        &with_prev,
    )
    .ok();

    pod.sh("ip route del default");
    let r = run_plugin(
        &plugin(),
        &node,
        "CHECK",
        "ck",
        Some(&pod.path()),
        "eth0",
        &with_prev,
    );
    assert_eq!(r.error_code(), 103, "{}", r.stdout);
    assert!(r.json()["msg"].as_str().unwrap().contains("route"));

    node.sh(&format!(
        "ip link set {} nomaster",
        host_veth_name("ck", "eth0")
    ));
    let r = run_plugin(
        &plugin(),
        &node,
        "CHECK",
        "ck",
        Some(&pod.path()),
        "eth0",
        &with_prev,
    );
    assert!(
        r.json()["msg"].as_str().unwrap().contains("not a port"),
        "{}",
        r.stdout
    );

    // CHECK without prevResult is a config error.
    let r = run_plugin(
        &plugin(),
        &node,
        "CHECK",
        "ck",
        Some(&pod.path()),
        "eth0",
        &conf,
    );
    assert_eq!(r.error_code(), 7);
}

#[test]
fn failed_adds_leave_nothing_behind() {
    let p = unique("fa");
    let node = TestNs::new(&format!("{p}-node"));
    let data = tempfile::tempdir().unwrap();

    // A missing namespace: code 3, no allocation.
    let conf = config("1.1.0", "10.99.3.0/24", data.path(), "");
    let r = run_plugin(
        &plugin(),
        &node,
        "ADD",
        "ghost",
        Some(Path::new("/run/netns/does-not-exist")),
        "eth0",
        &conf,
    );
    assert_eq!(r.error_code(), 3, "{}", r.stdout);
    assert!(allocation_files(data.path()).is_empty());

    // The interface name is already taken inside the pod: the ADD fails after allocating, and
    // must give the address back and remove the host veth.
    let pod = TestNs::new(&format!("{p}-p"));
    pod.sh("ip link add eth0 type veth peer name eth0peer");
    let r = run_plugin(
        &plugin(),
        &node,
        "ADD",
        "clash",
        Some(&pod.path()),
        "eth0",
        &conf,
    );
    assert_ne!(r.code, Some(0));
    assert!(allocation_files(data.path()).is_empty(), "address leaked");
    assert!(!node
        .sh("ip -o link show")
        .contains(&host_veth_name("clash", "eth0")));

    // An exhausted range: a /30 has one usable address besides the gateway.
    let small = config("1.1.0", "10.99.4.0/30", data.path(), "");
    let pod_a = TestNs::new(&format!("{p}-a"));
    let pod_b = TestNs::new(&format!("{p}-b"));
    run_plugin(
        &plugin(),
        &node,
        "ADD",
        "first",
        Some(&pod_a.path()),
        "eth0",
        &small,
    )
    .ok();
    let r = run_plugin(
        &plugin(),
        &node,
        "ADD",
        "second",
        Some(&pod_b.path()),
        "eth0",
        &small,
    );
    assert_eq!(r.error_code(), 100, "{}", r.stdout);
    assert_eq!(
        pod_b.sh("ip -o link show").lines().count(),
        1,
        "only lo in the pod"
    );
    assert!(!node
        .sh("ip -o link show")
        .contains(&host_veth_name("second", "eth0")));
}

#[test]
fn bad_input_gets_the_right_codes() {
    let p = unique("bi");
    let node = TestNs::new(&format!("{p}-node"));
    let pod = TestNs::new(&format!("{p}-p"));
    let data = tempfile::tempdir().unwrap();
    let conf = config("1.1.0", "10.99.5.0/24", data.path(), "");
    let add = |c: &str, id: &str, ifname: &str| {
        run_plugin(&plugin(), &node, "ADD", id, Some(&pod.path()), ifname, c)
    };
    assert_eq!(add("{oops", "x", "eth0").error_code(), 6);
    assert_eq!(
        add(
            &config("1.1.0", "10.99.5.0/24", data.path(), r#","color":"blue""#),
            "x",
            "eth0"
        )
        .error_code(),
        2
    );
    assert_eq!(
        add(&conf.replace("1.1.0", "9.9.9"), "x", "eth0").error_code(),
        1
    );
    assert_eq!(add(&conf, "../../etc/passwd", "eth0").error_code(), 4);
    assert_eq!(add(&conf, "ok", "eth0/../x").error_code(), 4);
    assert_eq!(add(&conf, "ok", "a-very-long-ifname").error_code(), 4);
    assert_eq!(
        add(&conf.replace("10.99.5.0/24", "10.99.5.0/99"), "x", "eth0").error_code(),
        7
    );
    assert!(allocation_files(data.path()).is_empty());
    assert_eq!(pod.sh("ip -o link show").lines().count(), 1);

    // VERSION answers with every supported version.
    let v = run_plugin(
        &plugin(),
        &node,
        "VERSION",
        "",
        None,
        "",
        r#"{"cniVersion":"1.1.0"}"#,
    )
    .ok()
    .json();
    assert_eq!(v["cniVersion"], "1.1.0");
    assert!(v["supportedVersions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|x| x == "0.4.0"));
    // GC and STATUS need 1.1.0; CHECK needs 0.4.0.
    let old = conf.replace("1.1.0", "0.3.1");
    assert_eq!(
        run_plugin(&plugin(), &node, "GC", "", None, "", &old).error_code(),
        1
    );
    assert_eq!(
        run_plugin(
            &plugin(),
            &node,
            "CHECK",
            "x",
            Some(&pod.path()),
            "eth0",
            &old
        )
        .error_code(),
        1
    );
    // 0.3.1 results carry ips[].version.
    let res = run_plugin(
        &plugin(),
        &node,
        "ADD",
        "old",
        Some(&pod.path()),
        "eth0",
        &old,
    )
    .ok()
    .json();
    assert_eq!(res["ips"][0]["version"], "4");
}

#[test]
fn status_reports_an_unwritable_store() {
    let p = unique("st");
    let node = TestNs::new(&format!("{p}-node"));
    let data = tempfile::tempdir().unwrap();
    let conf = config("1.1.0", "10.99.6.0/24", data.path(), "");
    run_plugin(&plugin(), &node, "STATUS", "", None, "", &conf).ok();
    // /proc/sys is not writable for anyone, root included: the store cannot live there.
    let ro = config("1.1.0", "10.99.6.0/24", Path::new("/proc/sys/weir-ro"), "");
    let r = run_plugin(&plugin(), &node, "STATUS", "", None, "", &ro);
    assert_eq!(r.error_code(), 50, "{}", r.stdout);
    let pod = TestNs::new(&format!("{p}-p"));
    let r = run_plugin(
        &plugin(),
        &node,
        "ADD",
        "ro",
        Some(&pod.path()),
        "eth0",
        &ro,
    );
    assert_eq!(r.error_code(), 5, "{}", r.stdout);
    assert_eq!(pod.sh("ip -o link show").lines().count(), 1);
}

#[test]
fn fifty_concurrent_adds_then_gc() {
    let p = unique("cc");
    let node = TestNs::new(&format!("{p}-node"));
    let data = tempfile::tempdir().unwrap();
    let conf = config("1.1.0", "10.99.7.0/24", data.path(), "");
    let pods: Vec<TestNs> = (0..50).map(|i| TestNs::new(&format!("{p}-{i}"))).collect();
    let results: Vec<IpAddr> = std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(i, pod)| {
                let (node, conf) = (&node, &conf);
                s.spawn(move || {
                    pod_ip(
                        &run_plugin(
                            &plugin(),
                            node,
                            "ADD",
                            &format!("c{i}"),
                            Some(&pod.path()),
                            "eth0",
                            conf,
                        )
                        .ok()
                        .json(),
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut unique_ips = results.clone();
    unique_ips.sort();
    unique_ips.dedup();
    assert_eq!(unique_ips.len(), 50, "an address was handed out twice");
    assert_eq!(allocation_files(data.path()).len(), 50);

    // GC keeps the first ten and removes everything of the rest, veths included.
    let valid: Vec<String> = (0..10)
        .map(|i| format!(r#"{{"containerID":"c{i}","ifname":"eth0"}}"#))
        .collect();
    let gc_conf = conf.replacen(
        '{',
        &format!("{{\"cni.dev/valid-attachments\":[{}],", valid.join(",")),
        1,
    );
    run_plugin(&plugin(), &node, "GC", "", None, "", &gc_conf).ok();
    assert_eq!(allocation_files(data.path()).len(), 10);
    let links = node.sh("ip -o link show");
    assert!(links.contains(&host_veth_name("c3", "eth0")));
    assert!(!links.contains(&host_veth_name("c30", "eth0")));
    let set = node.sh("nft list set inet weir-cni pods4");
    assert!(
        set.contains(&results[3].to_string()) && !set.contains(&format!("{},", results[30])),
        "{set}"
    );
}

#[test]
fn what_a_killed_add_leaves_is_reclaimed() {
    // A process killed between allocation and interface creation leaves an allocation file and,
    // at worst, a host veth. Reproduce exactly that state, then let DEL and GC reclaim it.
    let p = unique("kl");
    let node = TestNs::new(&format!("{p}-node"));
    let data = tempfile::tempdir().unwrap();
    let conf_text = config("1.1.0", "10.99.8.0/24", data.path(), "");
    let conf = weir_cni::config::NetConf::parse(conf_text.as_bytes()).unwrap();
    let store = weir_cni::ipam::Store::open(&conf.ipam, &conf.name).unwrap();
    store.allocate(&conf.ipam, "killed-del", "eth0").unwrap();
    store.allocate(&conf.ipam, "killed-gc", "eth0").unwrap();
    for id in ["killed-del", "killed-gc"] {
        node.sh(&format!(
            "ip link add {} type veth peer name tmp-{id}",
            host_veth_name(id, "eth0")
        ));
    }
    run_plugin(
        &plugin(),
        &node,
        "DEL",
        "killed-del",
        None,
        "eth0",
        &conf_text,
    )
    .ok();
    let gc_conf = conf_text.replacen('{', "{\"cni.dev/valid-attachments\":[],", 1);
    run_plugin(&plugin(), &node, "GC", "", None, "", &gc_conf).ok();
    assert!(allocation_files(data.path()).is_empty());
    eventually("no weir veth is left", || {
        !node.sh("ip -o link show").contains("weir")
    });

    // A veth named like ours that no allocation accounts for is swept by GC.
    node.sh("ip link add weir0123456789a type veth peer name orphanpeer");
    assert!(node.sh("ip -o link show").contains("weir0123456789a"));
    run_plugin(&plugin(), &node, "GC", "", None, "", &gc_conf).ok();
    assert!(!node.sh("ip -o link show").contains("weir0123456789a"));
}

#[test]
fn add_in_a_conflist_extends_the_previous_result() {
    // In a conflist the runtime hands each plugin the result so far as prevResult; weir appends its
    // interfaces and addresses, pointing its ips at its own interface's index in the merged list.
    let p = unique("cl");
    let node = TestNs::new(&format!("{p}-node"));
    let pod = TestNs::new(&format!("{p}-p"));
    let data = tempfile::tempdir().unwrap();
    let prev = r#"{"cniVersion":"1.0.0","interfaces":[{"name":"lo","sandbox":"/x"}],
                  "ips":[{"address":"127.0.0.1/8","interface":0}],"dns":{"nameservers":["10.96.0.10"]}}"#;
    let conf = config("1.0.0", "10.99.9.0/24", data.path(), "").replacen(
        '{',
        &format!("{{\"prevResult\":{prev},"),
        1,
    );
    let res = run_plugin(
        &plugin(),
        &node,
        "ADD",
        "chained",
        Some(&pod.path()),
        "eth0",
        &conf,
    )
    .ok()
    .json();
    let names: Vec<&str> = res["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["lo", "cni0", &host_veth_name("chained", "eth0"), "eth0"]
    );
    assert_eq!(res["ips"][0]["address"], "127.0.0.1/8");
    assert_eq!(res["ips"][1]["address"], "10.99.9.2/24");
    assert_eq!(res["ips"][1]["interface"], 3);
    assert_eq!(res["dns"]["nameservers"][0], "10.96.0.10");
}
