//! Agreement with the kernel (root): small topologies in network namespaces, a real TCP
//! connection from a client namespace, and `trace` on the node's live state must give the same
//! verdict. Each case also flips the one setting that decides it, so a walk that always said
//! "delivered" (or always "dropped") fails.

mod common;

use common::ns::Ns;

use std::process::Command;
use std::time::Duration;

use weir_netdiag::live::Target;
use weir_netdiag::state::NodeState;
use weir_netdiag::trace::Verdict;

/// How long a connection that the kernel lets through may take.
const CONNECT_LIMIT: Duration = Duration::from_secs(1);

/// Client — node — backend; NodePort 30080 on the node DNATs to a hostNetwork-style backend on
/// another host (10.60.0.2:8080) and masquerades (kube-proxy's shapes). FORWARD policy DROP,
/// first without kube-proxy's accept rules, then with them.
#[test]
fn nodeport_to_a_backend_elsewhere_under_forward_drop() {
    let client = Ns::new("wdt", "cl");
    let node = Ns::new("wdt", "nd");
    let backend = Ns::new("wdt", "be");
    node.sh(&format!(
        "ip link add eth0 type veth peer name c0 netns {} && ip link add eth1 type veth peer name b0 netns {}",
        client.0, backend.0
    ));
    node.sh(
        "ip addr add 10.50.0.1/24 dev eth0 && ip addr add 10.60.0.1/24 dev eth1 \
             && ip link set eth0 up && ip link set eth1 up && sysctl -qw net.ipv4.ip_forward=1",
    );
    client.sh("ip addr add 10.50.0.2/24 dev c0 && ip link set c0 up");
    backend.sh("ip addr add 10.60.0.2/24 dev b0 && ip link set b0 up");
    let _listener = backend.listen("0.0.0.0", 8080);
    node.sh(r#"iptables-restore <<'EOF'
*nat
:PREROUTING ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SEP-HOSTNET - [0:0]
-A PREROUTING -j KUBE-SERVICES
-A POSTROUTING -j KUBE-POSTROUTING
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-NODEPORTS -p tcp -m tcp --dport 30080 -j KUBE-MARK-MASQ
-A KUBE-NODEPORTS -p tcp -m tcp --dport 30080 -j KUBE-SEP-HOSTNET
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-SEP-HOSTNET -p tcp -m tcp -j DNAT --to-destination 10.60.0.2:8080
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -j MASQUERADE
COMMIT
*filter
:FORWARD DROP [0:0]
COMMIT
EOF"#);
    let kernel = client.connects("10.50.0.1:30080", CONNECT_LIMIT);
    let t = node.trace("10.50.0.2", "10.50.0.1", 30080, "eth0");
    assert!(!kernel, "the kernel must drop it under FORWARD DROP");
    assert_eq!(t.verdict, Verdict::Dropped);
    assert!(t.cause.as_deref().unwrap().starts_with("FORWARD"));

    node.sh(
        "iptables -N KUBE-FORWARD && iptables -A FORWARD -j KUBE-FORWARD \
             && iptables -A KUBE-FORWARD -m mark --mark 0x4000/0x4000 -j ACCEPT \
             && iptables -A KUBE-FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
    );
    let kernel = client.connects("10.50.0.1:30080", CONNECT_LIMIT);
    let t = node.trace("10.50.0.2", "10.50.0.1", 30080, "eth0");
    assert!(
        kernel,
        "the kernel must forward it with KUBE-FORWARD's accepts"
    );
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
}

/// The eni-shared NodePort direction: a client on eth0 → NodePort → a pod whose `from` rule
/// sends its traffic to the ENI's table; strict rp_filter drops the request. Then weir-cni's
/// connmark table, fwmark rule and src_valid_mark: both kernel and trace let it through.
#[test]
fn eni_nodeport_to_a_local_pod_strict_rp_filter_then_connmark() {
    let client = Ns::new("wdt", "ecl");
    let node = Ns::new("wdt", "end");
    let pod = Ns::new("wdt", "epd");
    let vpc = Ns::new("wdt", "evp");
    node.sh(&format!(
        "ip link add eth0 type veth peer name c0 netns {} && ip link add eth1 type veth peer name v0 netns {} \
         && ip link add enipod1 type veth peer name eth0 netns {}",
        client.0, vpc.0, pod.0
    ));
    node.sh("ip addr add 10.12.97.49/24 dev eth0 && for l in eth0 eth1 enipod1; do ip link set $l up; done \
             && ip route add default via 10.12.97.1 dev eth0 \
             && ip route add default via 10.12.192.1 dev eth1 onlink table 1003 \
             && ip route add 10.12.192.44 dev enipod1 scope link \
             && ip rule add pref 512 to 10.12.192.44 lookup main \
             && ip rule add pref 1536 from 10.12.192.44 lookup 1003 \
             && sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=1 net.ipv4.conf.eth0.rp_filter=1 \
             && sysctl -qw net.ipv4.conf.enipod1.proxy_arp=1");
    client.sh("ip addr add 10.12.97.7/24 dev c0 && ip link set c0 up");
    vpc.sh("ip link set v0 up");
    pod.sh("ip addr add 10.12.192.44/32 dev eth0 && ip link set eth0 up \
            && ip route add 169.254.1.1 dev eth0 scope link && ip route add default via 169.254.1.1 dev eth0");
    let _listener = pod.listen("0.0.0.0", 8080);
    node.sh("iptables -t nat -A PREROUTING -p tcp --dport 30080 -m addrtype --dst-type LOCAL -j DNAT --to-destination 10.12.192.44:8080");

    let kernel = client.connects("10.12.97.49:30080", CONNECT_LIMIT);
    let t = node.trace("10.12.97.7", "10.12.97.49", 30080, "eth0");
    assert!(!kernel, "strict rp_filter must drop the request");
    assert_eq!(t.verdict, Verdict::Dropped);
    assert!(
        t.cause
            .as_deref()
            .unwrap()
            .contains("strict reverse-path filter on eth0"),
        "{:?}",
        t.cause
    );

    // weir-cni's connmark shape (docs/eni.md), the fwmark rule and src_valid_mark.
    node.sh(r#"nft -f - <<'EOF'
table inet weir-eni {
  set pod_ifaces { type ifname; flags interval; elements = { "eni*" } }
  set enis { type ifname; elements = { "eth1" } }
  chain net-eni-eth1 { type filter hook prerouting priority mangle; policy accept;
    iifname @pod_ifaces ct mark & 0x80 == 0x80 meta mark set meta mark | 0x80
    iifname @pod_ifaces return
    iifname @enis return
    ct state new ct mark set ct mark | 0x80
    ct mark & 0x80 == 0x80 meta mark set meta mark | 0x80
  }
}
EOF"#);
    node.sh("ip rule add pref 1024 fwmark 0x80/0x80 lookup main && sysctl -qw net.ipv4.conf.all.src_valid_mark=1");
    let kernel = client.connects("10.12.97.49:30080", CONNECT_LIMIT);
    let t = node.trace("10.12.97.7", "10.12.97.49", 30080, "eth0");
    assert!(kernel, "the connmark fix must let the kernel deliver it");
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
}

/// `weir trace collect --pod`: the pod's `ip addr` and resolv.conf saved beside the node's
/// outputs name the pod's address and its host veth (by the `eth0@ifN` peer index), so a walk
/// from the directory needs no --iif.
#[test]
fn a_pod_collected_beside_its_node_is_found_by_its_peer_index() {
    let node = Ns::new("wdt", "pn");
    let pod = Ns::new("wdt", "pp");
    node.sh(&format!(
        "ip link add enipodx type veth peer name eth0 netns {} && ip link set enipodx up \
         && ip route add 10.70.0.5 dev enipodx scope link",
        pod.0
    ));
    pod.sh("ip addr add 10.70.0.5/32 dev eth0 && ip link set eth0 up");
    // A process living in the pod's namespace, whose resolv.conf is the pod's.
    let mut sleeper = Command::new("ip")
        .args(["netns", "exec", &pod.0, "sleep", "30"])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let mut runs = Target {
        netns: Some(node.0.clone()),
    }
    .collect();
    runs.extend(
        Target {
            netns: Some(pod.0.clone()),
        }
        .collect_pod(),
    );
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let dir = tempfile::tempdir().unwrap();
    weir_netdiag::live::write_collection(
        dir.path(),
        &Target {
            netns: Some(node.0.clone()),
        },
        &runs,
    )
    .unwrap();
    let (st, _) = NodeState::from_dir(dir.path()).unwrap();
    let side = st.pod.as_ref().expect("pod-ip-addr.txt read back");
    assert_eq!(side.addr.to_string(), "10.70.0.5");
    assert_eq!(side.host_iface.as_deref(), Some("enipodx"), "{}", side.how);
    assert!(side.how.contains("peer"), "{}", side.how);
    assert!(st.pod_resolv_conf.is_some());
}
