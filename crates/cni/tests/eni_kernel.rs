//! weir-cni in eni-shared mode against the real kernel, in a miniature cloud: a node namespace
//! with `eth0` (addressed) and two addressless ENIs, a VPC router namespace that delivers every
//! ENI address to the ENI that owns it and drops packets whose source is not assigned to the
//! interface they left from (a cloud's source/destination check), a backend and an outside client.
//! `rp_filter=1` everywhere. Service rules in the node have kube-proxy's shapes (mark 0x4000 in
//! prerouting, masquerade of marked packets in postrouting). Needs root.

mod common;

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{run_plugin, unique, TestNs};
use weir_cni::eni::plan::host_veth_name;

fn plugin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_weir-cni"))
}

const NODE_IP: &str = "10.12.97.49";
const LB_IP: &str = "10.12.115.101";
const BACKEND: &str = "10.12.200.5";
const CLIENT: &str = "10.12.50.7";

/// Network A on eth1 (ENI address 10.12.192.10), network B on eth2 with another veth prefix.
fn conf_a(data: &Path, extra: &str) -> String {
    format!(
        r#"{{"cniVersion":"1.1.0","name":"enia","type":"weir-cni","mode":"eni-shared",
            "eniName":"eth1","eniGateway":"10.12.192.1","routeTable":1003,
            "eniAddresses":["10.12.192.10","10.12.192.44","10.12.192.45","10.12.192.46"],
            "dataDir":"{}"{extra}}}"#,
        data.display()
    )
}

fn conf_b(data: &Path, mac: &str) -> String {
    format!(
        r#"{{"cniVersion":"1.1.0","name":"enib","type":"weir-cni","mode":"eni-shared",
            "eniMAC":"{mac}","eniGateway":"10.12.193.1","routeTable":1004,"vethPrefix":"enb",
            "eniAddresses":["10.12.193.10","10.12.193.20"],"dataDir":"{}"}}"#,
        data.display()
    )
}

fn with_prev(conf: &str, prev: &serde_json::Value) -> String {
    let mut v: serde_json::Value = serde_json::from_str(conf).unwrap();
    v["prevResult"] = prev.clone();
    v.to_string()
}

fn with_valid(conf: &str, valid: &[(&str, &str)]) -> String {
    let mut v: serde_json::Value = serde_json::from_str(conf).unwrap();
    v["cni.dev/valid-attachments"] = valid
        .iter()
        .map(|(id, ifname)| serde_json::json!({"containerID": id, "ifname": ifname}))
        .collect();
    v.to_string()
}

fn sh(cmd: &str) {
    let out = std::process::Command::new("sh")
        .args(["-ec", cmd])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{cmd}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The miniature cloud. Namespaces are dropped (deleted) with it.
struct Cloud {
    node: TestNs,
    vpc: TestNs,
    client: TestNs,
    backend: TestNs,
}

impl Cloud {
    fn new(tag: &str) -> Cloud {
        let p = unique(tag);
        let c = Cloud {
            node: TestNs::new(&format!("{p}-n")),
            vpc: TestNs::new(&format!("{p}-v")),
            client: TestNs::new(&format!("{p}-c")),
            backend: TestNs::new(&format!("{p}-b")),
        };
        let (n, v, cl, b) = (&c.node.name, &c.vpc.name, &c.client.name, &c.backend.name);
        sh(&format!(
            "for ns in {n} {v} {cl} {b}; do ip -n $ns link set lo up; done
             ip netns exec {n} sysctl -qw net.ipv4.conf.all.rp_filter=1 net.ipv4.conf.default.rp_filter=1
             ip netns exec {v} sysctl -qw net.ipv4.ip_forward=1
             ip -n {n} link add eth0 type veth peer name n-e0 netns {v}
             ip -n {n} link add eth1 type veth peer name a-e1 netns {v}
             ip -n {n} link add eth2 type veth peer name b-e2 netns {v}
             ip -n {n} addr add {NODE_IP}/24 dev eth0
             ip -n {n} link set eth0 up
             ip -n {n} route add default via 10.12.97.1
             ip -n {v} addr add 10.12.97.1/24 dev n-e0
             ip -n {v} addr add 10.12.192.1/32 dev a-e1
             ip -n {v} addr add 10.12.193.1/32 dev b-e2
             for i in n-e0 a-e1 b-e2; do ip -n {v} link set $i up; done
             ip -n {cl} link add eth0 type veth peer name out netns {v}
             ip -n {cl} addr add {CLIENT}/24 dev eth0; ip -n {cl} link set eth0 up
             ip -n {cl} route add default via 10.12.50.1
             ip -n {v} addr add 10.12.50.1/24 dev out; ip -n {v} link set out up
             ip -n {b} link add eth0 type veth peer name be netns {v}
             ip -n {b} addr add {BACKEND}/24 dev eth0; ip -n {b} link set eth0 up
             ip -n {b} route add default via 10.12.200.1
             ip -n {v} addr add 10.12.200.1/24 dev be; ip -n {v} link set be up
             # the cloud knows which ENI owns each address (no ARP: static neighbours)
             ma=$(ip netns exec {n} cat /sys/class/net/eth1/address)
             mb=$(ip netns exec {n} cat /sys/class/net/eth2/address)
             for a in 10 44 45 46; do
               ip -n {v} route add 10.12.192.$a/32 dev a-e1
               ip -n {v} neigh replace 10.12.192.$a lladdr $ma dev a-e1 nud permanent
             done
             for a in 10 20; do
               ip -n {v} route add 10.12.193.$a/32 dev b-e2
               ip -n {v} neigh replace 10.12.193.$a lladdr $mb dev b-e2 nud permanent
             done
             ip netns exec {v} nft -f - <<'EOF'
table inet vpc {{
  chain forward {{ type filter hook forward priority 0; policy accept;
    iifname \"n-e0\" ip saddr != {NODE_IP} counter name srccheck_eth0 drop
    iifname \"a-e1\" ip saddr != {{ 10.12.192.10, 10.12.192.44, 10.12.192.45, 10.12.192.46 }} counter name srccheck_eni_a drop
    iifname \"b-e2\" ip saddr != {{ 10.12.193.10, 10.12.193.20 }} counter name srccheck_eni_b drop
  }}
  counter srccheck_eth0 {{ }}
  counter srccheck_eni_a {{ }}
  counter srccheck_eni_b {{ }}
}}
EOF
             # kube-proxy's shapes: LB IP to a backend elsewhere (masquerade), NodePorts to a pod
             ip netns exec {n} nft -f - <<'EOF'
table ip kubeproxy {{
  chain pre {{ type nat hook prerouting priority dstnat;
    ip daddr {LB_IP} tcp dport 80 meta mark set meta mark | 0x4000 dnat to {BACKEND}:8080
    ip daddr {NODE_IP} tcp dport 30080 dnat to 10.12.192.44:8080
    ip daddr {NODE_IP} tcp dport 30081 meta mark set meta mark | 0x4000 dnat to 10.12.192.44:8080
    ip daddr {NODE_IP} tcp dport 30082 dnat to 10.12.193.20:8080
    ip daddr 10.96.0.9 tcp dport 80 meta mark set meta mark | 0x4000 dnat to 10.12.192.44:8080
  }}
  chain post {{ type nat hook postrouting priority srcnat;
    meta mark & 0x4000 == 0x4000 meta mark set meta mark ^ 0x4000 masquerade
  }}
}}
EOF"
        ));
        for i in ["eth0", "eth1", "eth2"] {
            sh(&format!(
                "ip netns exec {n} sysctl -qw net.ipv4.conf.{i}.rp_filter=1"
            ));
        }
        c
    }

    fn mac(&self, ifname: &str) -> String {
        self.node
            .sh(&format!("cat /sys/class/net/{ifname}/address"))
            .trim()
            .to_string()
    }

    /// The node kernel's count of packets strict reverse-path filtering dropped.
    fn rp_drops(&self) -> u64 {
        let out = self.node.sh("nstat -az TcpExtIPReversePathFilter");
        out.lines()
            .find_map(|l| {
                let mut f = l.split_whitespace();
                (f.next() == Some("TcpExtIPReversePathFilter"))
                    .then(|| f.next().unwrap().parse().unwrap())
            })
            .unwrap_or(0)
    }

    /// ICMP redirects the node sent.
    fn redirects(&self) -> u64 {
        let out = self.node.sh("nstat -az IcmpOutRedirects");
        out.lines()
            .find_map(|l| {
                let mut f = l.split_whitespace();
                (f.next() == Some("IcmpOutRedirects")).then(|| f.next().unwrap().parse().unwrap())
            })
            .unwrap_or(0)
    }

    /// Packets the VPC dropped for a source not assigned to the interface they came from.
    fn source_check_drops(&self) -> u64 {
        let out = self.vpc.sh("nft list counters table inet vpc");
        out.lines()
            .filter_map(|l| l.trim().strip_prefix("packets "))
            .map(|l| l.split_whitespace().next().unwrap().parse::<u64>().unwrap())
            .sum()
    }
}

/// Serves TCP on `port` inside `ns` in a thread: each connection gets back the peer's address.
fn serve_peer(ns: &TestNs, port: u16) {
    let handle = ns.open();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _g = handle.enter().unwrap();
        let l = TcpListener::bind(("0.0.0.0", port)).unwrap();
        tx.send(()).unwrap();
        for s in l.incoming().flatten() {
            let mut s = s;
            let peer = s
                .peer_addr()
                .map(|a| a.ip().to_string())
                .unwrap_or_default();
            let _ = s.write_all(peer.as_bytes());
        }
    });
    rx.recv().unwrap();
}

/// From inside `ns`: the address the server at addr:port saw us as.
fn seen_as(ns: &TestNs, addr: &str, port: u16, timeout: Duration) -> std::io::Result<String> {
    let handle = ns.open();
    let addr: SocketAddr = (addr.parse::<IpAddr>().unwrap(), port).into();
    std::thread::scope(|s| {
        s.spawn(|| {
            let _g = handle.enter()?;
            let mut c = TcpStream::connect_timeout(&addr, timeout)?;
            c.set_read_timeout(Some(timeout))?;
            let mut out = String::new();
            c.read_to_string(&mut out)?;
            Ok(out)
        })
        .join()
        .unwrap()
    })
}

fn ok(ns: &TestNs, addr: &str, port: u16) -> String {
    seen_as(ns, addr, port, Duration::from_secs(3))
        .unwrap_or_else(|e| panic!("{} -> {addr}:{port}: {e}", ns.name))
}

fn pod_ip(result: &serde_json::Value) -> Ipv4Addr {
    let addr = result["ips"][0]["address"]
        .as_str()
        .expect("ips[0].address");
    assert!(addr.ends_with("/32"), "{addr}");
    addr.trim_end_matches("/32").parse().unwrap()
}

fn files(data: &Path, net: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(data.join(net))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.parse::<IpAddr>().is_ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// ADD of `id` into `ns`, which must succeed; its result.
fn add(cloud: &Cloud, ns: &TestNs, id: &str, conf: &str) -> serde_json::Value {
    let r = run_plugin(
        &plugin(),
        &cloud.node,
        "ADD",
        id,
        Some(&ns.path()),
        "eth0",
        conf,
    );
    r.ok();
    r.json()
}

#[test]
fn eni_shared_pods_reach_every_path_under_strict_rp_filter_and_source_check() {
    let cloud = Cloud::new("es");
    let p = &cloud.node.name;
    let pod1 = TestNs::new(&format!("{p}1"));
    let pod2 = TestNs::new(&format!("{p}2"));
    let pod3 = TestNs::new(&format!("{p}3"));
    let data = tempfile::tempdir().unwrap();
    let a = conf_a(data.path(), "");
    let b = conf_b(data.path(), &cloud.mac("eth2"));
    let r1 = add(&cloud, &pod1, "c-one", &a);
    let r2 = add(&cloud, &pod2, "c-two", &a);
    let r3 = add(&cloud, &pod3, "c-three", &b);
    // the ENI's own address is never a pod's; round-robin through the rest
    assert_eq!(pod_ip(&r1), Ipv4Addr::new(10, 12, 192, 44));
    assert_eq!(pod_ip(&r2), Ipv4Addr::new(10, 12, 192, 45));
    assert_eq!(pod_ip(&r3), Ipv4Addr::new(10, 12, 193, 20));
    assert_eq!(r1["routes"][0]["gw"], "169.254.1.1");
    assert_eq!(
        r1["interfaces"][0]["name"],
        host_veth_name("eni", "enia", "c-one", "eth0")
    );

    the_node_is_set_up(&cloud);
    every_path_is_reached(&cloud, [&pod1, &pod2, &pod3]);
    let _more_pods = check_notices_a_lost_address_and_add_heals_it(&cloud, &a, &r1, &pod1);
    assert_eq!(files(data.path(), "enia").len(), 3);
    drop(pod1);
    del_and_gc_release_only_their_own(&cloud, data.path(), &a, &r1, &r2);
    assert_eq!(ok(&pod3, BACKEND, 8080), "10.12.193.20");
    assert_eq!(ok(&pod2, LB_IP, 80), "10.12.192.10");

    run_plugin(&plugin(), &cloud.node, "STATUS", "", None, "", &a).ok();
}

/// Per node: each ENI has its /32, each table its default route, one fwmark rule; strict
/// rp_filter stays on.
fn the_node_is_set_up(cloud: &Cloud) {
    let addrs = cloud.node.sh("ip -4 -o addr show");
    assert!(addrs.contains("eth1    inet 10.12.192.10/32"), "{addrs}");
    assert!(addrs.contains("eth2    inet 10.12.193.10/32"), "{addrs}");
    assert!(addrs.contains("noprefixroute"), "{addrs}");
    let t = cloud
        .node
        .sh("ip route show table 1003; ip route show table 1004");
    assert!(
        t.contains("default via 10.12.192.1 dev eth1 proto static onlink"),
        "{t}"
    );
    assert!(
        t.contains("default via 10.12.193.1 dev eth2 proto static onlink"),
        "{t}"
    );
    let rules = cloud.node.sh("ip rule");
    for want in [
        "512:\tfrom all to 10.12.192.44 lookup main",
        "1024:\tfrom all fwmark 0x80/0x80 lookup main",
        "1536:\tfrom 10.12.192.44 lookup 1003",
        "1536:\tfrom 10.12.193.20 lookup 1004",
    ] {
        assert!(rules.contains(want), "missing {want:?} in\n{rules}");
    }
    assert_eq!(
        cloud
            .node
            .sh("sysctl -n net.ipv4.conf.all.rp_filter")
            .trim(),
        "1"
    );
    assert_eq!(
        cloud
            .node
            .sh("sysctl -n net.ipv4.conf.eth0.rp_filter")
            .trim(),
        "1"
    );
}

/// Pod to pod, to the node, to the VPC and a LoadBalancer; the outside to NodePorts; hairpin:
/// no drop by rp_filter or the VPC's source check, no ICMP redirect.
fn every_path_is_reached(cloud: &Cloud, [pod1, pod2, pod3]: [&TestNs; 3]) {
    for ns in [pod1, pod2, pod3, &cloud.backend] {
        serve_peer(ns, 8080);
    }
    let (rp0, sc0) = (cloud.rp_drops(), cloud.source_check_drops());
    // pod -> pod, same ENI and across ENIs (different veth prefixes), both directions
    assert_eq!(ok(pod1, "10.12.192.45", 8080), "10.12.192.44");
    assert_eq!(ok(pod1, "10.12.193.20", 8080), "10.12.192.44");
    assert_eq!(ok(pod3, "10.12.192.44", 8080), "10.12.193.20");
    // pod -> node
    serve_peer(&cloud.node, 9090);
    assert_eq!(ok(pod1, NODE_IP, 9090), "10.12.192.44");
    // pod -> something behind the VPC, unNATed: leaves by its own ENI with its own address
    assert_eq!(ok(pod1, BACKEND, 8080), "10.12.192.44");
    assert_eq!(ok(pod3, BACKEND, 8080), "10.12.193.20");
    // pod -> LoadBalancer IP, backend elsewhere, masqueraded: the brief's failure. The SYN leaves
    // by the ENI, so masquerade picks the ENI's own address; the reply comes back to the ENI.
    assert_eq!(ok(pod1, LB_IP, 80), "10.12.192.10");
    assert_eq!(ok(pod3, LB_IP, 80), "10.12.193.10");
    // outside -> NodePort -> pod on this node, without (ETP Local) and with masquerade
    assert_eq!(ok(&cloud.client, NODE_IP, 30080), CLIENT);
    assert_ne!(ok(&cloud.client, NODE_IP, 30081), CLIENT);
    assert_eq!(ok(&cloud.client, NODE_IP, 30082), CLIENT);
    // hairpin: a pod reaching itself through a Service is routed back out of its veth; the node
    // must not answer that with ICMP redirects (they spend the ICMP rate limit REJECTs need)
    let redirects0 = cloud.redirects();
    for _ in 0..3 {
        assert_ne!(
            ok(pod1, "10.96.0.9", 80),
            "10.12.192.44",
            "hairpin is masqueraded"
        );
    }
    assert_eq!(
        cloud.redirects(),
        redirects0,
        "the node sent ICMP redirects to a pod"
    );
    assert_eq!(cloud.rp_drops(), rp0, "strict rp_filter dropped something");
    assert_eq!(
        cloud.source_check_drops(),
        sc0,
        "the VPC source check dropped something"
    );
    // the connmark table saw the NodePort connections
    let ct = cloud
        .node
        .sh("conntrack -L -p tcp --dport 30080 2>/dev/null");
    assert!(ct.contains("mark=128"), "{ct}");
}

/// CHECK passes, then notices a missing ENI address; the next ADD heals the node, and the
/// one after finds the ENI's addresses all in use. Returns the pods it made (alive until the
/// test ends, as GC expects them).
fn check_notices_a_lost_address_and_add_heals_it(
    cloud: &Cloud,
    a: &str,
    r1: &serde_json::Value,
    pod1: &TestNs,
) -> [TestNs; 2] {
    let p = &cloud.node.name;
    let check = |conf: &str, prev: &serde_json::Value, ns: &TestNs| {
        run_plugin(
            &plugin(),
            &cloud.node,
            "CHECK",
            "c-one",
            Some(&ns.path()),
            "eth0",
            &with_prev(conf, prev),
        )
    };
    check(a, r1, pod1).ok();
    cloud.node.sh("ip addr del 10.12.192.10/32 dev eth1");
    let broken = check(a, r1, pod1);
    assert_eq!(broken.error_code(), 103);
    assert!(broken.json()["msg"]
        .as_str()
        .unwrap()
        .contains("10.12.192.10"));
    // the next ADD heals the node (node setup is idempotent)
    let pod4 = TestNs::new(&format!("{p}4"));
    let r4 = add(cloud, &pod4, "c-four", a);
    assert_eq!(pod_ip(&r4), Ipv4Addr::new(10, 12, 192, 46));
    check(a, r1, pod1).ok();
    // the ENI's addresses are all in use now
    let pod5 = TestNs::new(&format!("{p}5"));
    let full = run_plugin(
        &plugin(),
        &cloud.node,
        "ADD",
        "c-five",
        Some(&pod5.path()),
        "eth0",
        a,
    );
    assert_eq!(full.error_code(), 100);

    [pod4, pod5]
}

/// DEL from prevResult alone, with the pod's namespace already gone; a stale prevResult; GC of
/// network A keeps c-two, reclaims c-four, and never touches network B.
fn del_and_gc_release_only_their_own(
    cloud: &Cloud,
    data: &Path,
    a: &str,
    r1: &serde_json::Value,
    r2: &serde_json::Value,
) {
    let del =
        |id: &str, conf: &str| run_plugin(&plugin(), &cloud.node, "DEL", id, None, "eth0", conf);
    del("c-one", &with_prev(a, r1)).ok();
    let rules = cloud.node.sh("ip rule");
    assert!(!rules.contains("10.12.192.44"), "{rules}");
    assert!(cloud
        .node
        .sh("ip link")
        .lines()
        .all(|l| !l.contains(&host_veth_name("eni", "enia", "c-one", "eth0"))));
    assert_eq!(files(data, "enia"), vec!["10.12.192.45", "10.12.192.46"]);
    del("c-one", &with_prev(a, r1)).ok(); // idempotent
                                          // a stale prevResult never removes rules of an address someone else holds now
    del("c-gone", &with_prev(a, r2)).ok();
    assert!(cloud
        .node
        .sh("ip rule")
        .contains("from 10.12.192.45 lookup 1003"));

    // GC of network A keeps c-two, reclaims c-four, and never touches network B
    run_plugin(
        &plugin(),
        &cloud.node,
        "GC",
        "",
        None,
        "",
        &with_valid(a, &[("c-two", "eth0")]),
    )
    .ok();
    assert_eq!(files(data, "enia"), vec!["10.12.192.45"]);
    let rules = cloud.node.sh("ip rule");
    assert!(!rules.contains("10.12.192.46"), "{rules}");
    assert!(rules.contains("from 10.12.193.20 lookup 1004"), "{rules}");
}

#[test]
fn with_the_fix_removed_the_brief_failure_happens_exactly() {
    let cloud = Cloud::new("ef");
    let pod = TestNs::new(&format!("{}1", cloud.node.name));
    let data = tempfile::tempdir().unwrap();
    let a = conf_a(data.path(), "");
    add(&cloud, &pod, "c-one", &a);
    serve_peer(&cloud.backend, 8080);
    serve_peer(&pod, 8080);
    assert_eq!(ok(&pod, LB_IP, 80), "10.12.192.10");

    // Take weir's fix away: no address on the ENI, no connmark table.
    // (Removing a device's last IPv4 address flushes every route through it, so the ENI table's
    // default route has to be put back: the state of a node whose ENI never had an address.)
    cloud.node.sh(
        "ip addr del 10.12.192.10/32 dev eth1; nft delete table inet weir-eni; conntrack -F
         ip route replace default via 10.12.192.1 dev eth1 onlink table 1003",
    );
    let short = Duration::from_millis(1500);
    // With the VPC's source check: the SYN leaves the ENI with eth0's address and is dropped.
    let sc0 = cloud.source_check_drops();
    assert!(
        seen_as(&pod, LB_IP, 80, short).is_err(),
        "pod -> LB IP must time out"
    );
    assert!(
        cloud.source_check_drops() > sc0,
        "the VPC source check should have dropped the SYN"
    );
    let ct = cloud
        .node
        .sh(&format!("conntrack -L -d {LB_IP} 2>/dev/null"));
    assert!(
        ct.contains(&format!("dst={NODE_IP}")),
        "masquerade picked eth0's address: {ct}"
    );
    // Without it: the SYN-ACK comes back on eth0 and strict rp_filter drops it.
    cloud.vpc.sh("nft delete table inet vpc");
    let rp0 = cloud.rp_drops();
    assert!(
        seen_as(&pod, LB_IP, 80, short).is_err(),
        "pod -> LB IP must time out"
    );
    assert!(
        cloud.rp_drops() > rp0,
        "TcpExtIPReversePathFilter should have risen"
    );
    // Outside -> NodePort -> local pod: the request itself fails the reverse-path check.
    let rp0 = cloud.rp_drops();
    assert!(seen_as(&cloud.client, NODE_IP, 30080, short).is_err());
    assert!(cloud.rp_drops() > rp0);

    // The next ADD puts the fix back, and both paths work again.
    let pod2 = TestNs::new(&format!("{}2", cloud.node.name));
    add(&cloud, &pod2, "c-two", &a);
    assert_eq!(ok(&pod, LB_IP, 80), "10.12.192.10");
    assert_eq!(ok(&cloud.client, NODE_IP, 30080), CLIENT);
}

#[test]
fn bad_input_gets_the_right_codes_and_leaves_nothing() {
    let cloud = Cloud::new("eb");
    let pod = TestNs::new(&format!("{}1", cloud.node.name));
    let data = tempfile::tempdir().unwrap();
    let run = |cmd: &str, conf: &str| {
        run_plugin(
            &plugin(),
            &cloud.node,
            cmd,
            "c-bad",
            Some(&pod.path()),
            "eth0",
            conf,
        )
    };
    // an ENI that is not attached (yet): try again later, nothing allocated
    let missing = conf_a(data.path(), "").replace("\"eth1\"", "\"eth9\"");
    assert_eq!(run("ADD", &missing).error_code(), 11);
    assert_eq!(run("STATUS", &missing).error_code(), 50);
    assert!(files(data.path(), "enia").is_empty());
    // an address file that is not there: I/O error
    let file = data.path().join("addresses");
    let from_file = conf_a(data.path(), "").replace(
        r#""eniAddresses":["10.12.192.10","10.12.192.44","10.12.192.45","10.12.192.46"]"#,
        &format!(r#""eniAddressFile":"{}""#, file.display()),
    );
    assert_eq!(run("ADD", &from_file).error_code(), 5);
    // once the node agent writes it, the same configuration works
    std::fs::write(&file, "# eth1\n10.12.192.10\n10.12.192.46\n").unwrap();
    let r = run("ADD", &from_file);
    r.ok();
    assert_eq!(pod_ip(&r.json()), Ipv4Addr::new(10, 12, 192, 46));
    // the same ADD again (a runtime retrying): same address, and the attachment still checks out
    let again = run("ADD", &from_file);
    again.ok();
    assert_eq!(pod_ip(&again.json()), Ipv4Addr::new(10, 12, 192, 46));
    run("CHECK", &with_prev(&from_file, &again.json())).ok();
    // a pod namespace that does not exist: unknown container
    let gone = run_plugin(
        &plugin(),
        &cloud.node,
        "ADD",
        "c-x",
        Some(Path::new("/run/netns/weir-no-such-ns")),
        "eth0",
        &from_file,
    );
    assert_eq!(gone.error_code(), 3);
    assert_eq!(files(data.path(), "enia"), vec!["10.12.192.46"]);
    // bridge-mode keys in an eni-shared configuration
    assert_eq!(
        run("ADD", &conf_a(data.path(), r#","bridge":"cni0""#)).error_code(),
        2
    );
    // GC and STATUS need 1.1.0
    assert_eq!(
        run("GC", &conf_a(data.path(), "").replace("1.1.0", "1.0.0")).error_code(),
        1
    );
}

#[test]
fn concurrent_adds_then_gc_reclaims_everything_including_orphans() {
    let cloud = Cloud::new("eg");
    let data = tempfile::tempdir().unwrap();
    // thirteen pod addresses (.11-.23), twelve pods; the VPC side does not matter here
    let list: Vec<String> = (10..24).map(|i| format!("\"10.12.192.{i}\"")).collect();
    let conf = conf_a(data.path(), "").replace(
        r#""eniAddresses":["10.12.192.10","10.12.192.44","10.12.192.45","10.12.192.46"]"#,
        &format!(r#""eniAddresses":[{}]"#, list.join(",")),
    );
    let pods: Vec<TestNs> = (0..12)
        .map(|i| TestNs::new(&format!("{}p{i}", cloud.node.name)))
        .collect();
    // twelve ADDs at once on a node that has not been set up yet
    let results: Vec<serde_json::Value> = std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(i, ns)| {
                let conf = &conf;
                let cloud = &cloud;
                s.spawn(move || {
                    let r = run_plugin(
                        &plugin(),
                        &cloud.node,
                        "ADD",
                        &format!("c{i}"),
                        Some(&ns.path()),
                        "eth0",
                        conf,
                    );
                    r.ok();
                    r.json()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut ips: Vec<Ipv4Addr> = results.iter().map(pod_ip).collect();
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), 12, "every pod got its own address");
    assert!(
        !ips.contains(&Ipv4Addr::new(10, 12, 192, 10)),
        "the ENI's own address"
    );
    let ruleset = cloud.node.sh("nft list table inet weir-eni");
    assert_eq!(ruleset.matches("ct state new").count(), 1, "{ruleset}");
    assert_eq!(cloud.node.sh("ip rule").matches("fwmark 0x80").count(), 1);

    // leftovers no allocation accounts for: a rule and a veth routing to a free address
    let free = "10.12.192.23";
    assert!(
        !ips.contains(&free.parse().unwrap()),
        "{free} must be free for this test"
    );
    cloud.node.sh(&format!(
        "ip rule add pref 1536 from {free} lookup 1003; ip rule add pref 512 to {free} lookup main
         ip link add eniorphan000000 type veth peer name orphanpeer
         ip link set eniorphan000000 up; ip route add {free}/32 dev eniorphan000000 scope link
         ip link add enikeep00000000 type veth peer name keeppeer"
    ));
    let links = cloud.node.sh("ip -o link");
    assert!(
        links.contains("eniorphan000000") && links.contains("enikeep00000000"),
        "{links}"
    );
    // another network's rule in another table must survive
    cloud
        .node
        .sh("ip rule add pref 1536 from 10.12.193.99 lookup 1004");

    let keep = [("c0", "eth0")];
    run_plugin(
        &plugin(),
        &cloud.node,
        "GC",
        "",
        None,
        "",
        &with_valid(&conf, &keep),
    )
    .ok();
    assert_eq!(
        files(data.path(), "enia"),
        vec![pod_ip(&results[0]).to_string()]
    );
    let rules = cloud.node.sh("ip rule");
    assert_eq!(rules.matches("lookup 1003").count(), 1, "{rules}");
    assert!(!rules.contains(free), "{rules}");
    assert!(rules.contains("from 10.12.193.99 lookup 1004"), "{rules}");
    let links = cloud.node.sh("ip -o link");
    assert!(!links.contains("eniorphan000000"), "{links}");
    assert!(
        links.contains("enikeep00000000"),
        "a veth without our route is not ours: {links}"
    );
    assert_eq!(links.matches(": eni").count(), 2, "{links}");
}

#[test]
fn del_returns_before_the_veth_is_deleted_and_gc_finishes_a_delete_that_never_ran() {
    let cloud = Cloud::new("et");
    let data = tempfile::tempdir().unwrap();
    let a = conf_a(data.path(), "");
    let store = data.path().join("enia");
    let tomb = |veth: &str| store.join(format!("weir-eni-deleting.{veth}"));
    let pods: Vec<TestNs> = (0..2)
        .map(|i| TestNs::new(&format!("{}t{i}", cloud.node.name)))
        .collect();
    let ip0 = pod_ip(&add(&cloud, &pods[0], "c0", &a));
    let ip1 = pod_ip(&add(&cloud, &pods[1], "c1", &a));
    let veth0 = host_veth_name("eni", "enia", "c0", "eth0");
    let veth1 = host_veth_name("eni", "enia", "c1", "eth0");

    // DEL: rules, host route and address are gone when it returns; the veth and its tombstone
    // go a moment later (the detached child).
    run_plugin(&plugin(), &cloud.node, "DEL", "c0", None, "eth0", &a).ok();
    assert!(!cloud.node.sh("ip rule").contains(&ip0.to_string()));
    assert!(!cloud.node.sh("ip route").contains(&ip0.to_string()));
    assert_eq!(files(data.path(), "enia"), vec![ip1.to_string()]);
    common::eventually("the veth and its tombstone are gone", || {
        !cloud.node.sh("ip -o link").contains(&veth0) && !tomb(&veth0).exists()
    });

    // A DEL whose child never ran: a down veth named by a tombstone. Beside it, a down veth of
    // ours without a tombstone (another network's business) and a tombstone naming the live
    // pod's veth (its name owned again by an allocation): GC deletes only the first.
    cloud.node.sh(&format!(
        "ip link add {veth0} type veth peer name deadpeer
         ip link add eniother0000000 type veth peer name otherpeer"
    ));
    std::fs::write(tomb(&veth0), b"").unwrap();
    std::fs::write(tomb(&veth1), b"").unwrap();
    run_plugin(
        &plugin(),
        &cloud.node,
        "GC",
        "",
        None,
        "",
        &with_valid(&a, &[("c1", "eth0")]),
    )
    .ok();
    let links = cloud.node.sh("ip -o link");
    assert!(!links.contains(&veth0), "the unfinished delete: {links}");
    assert!(links.contains("eniother0000000"), "{links}");
    assert!(links.contains(&veth1), "the live pod's veth: {links}");
    assert!(!tomb(&veth0).exists() && !tomb(&veth1).exists());
    serve_peer(&cloud.backend, 8080);
    assert_eq!(ok(&pods[1], BACKEND, 8080), ip1.to_string(), "the live pod");
}
