//! The checks against the real kernel (root): each test builds a broken state in its own network
//! namespace, collects it the way `weir doctor --netns` does, sees the check fail, applies the fix
//! and sees it pass.

use std::net::UdpSocket;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use weir_netdiag::doctor::{self, Check, PodDns, Status};
use weir_netdiag::live::Target;
use weir_netdiag::state::NodeState;

/// A network namespace for one test, deleted on drop (also when the test panics).
struct Ns(String);

impl Ns {
    fn new(tag: &str) -> Ns {
        let name = format!("wdd-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap()
            .success();
        assert!(ok, "ip netns add {name}");
        let ns = Ns(name);
        ns.sh("ip link set lo up");
        ns
    }

    /// Runs a shell command inside the namespace; it must succeed.
    fn sh(&self, cmd: &str) {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.0, "sh", "-c", cmd])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn state(&self) -> NodeState {
        let target = Target {
            netns: Some(self.0.clone()),
        };
        NodeState::from_outputs(
            target
                .collect()
                .into_iter()
                .filter_map(|r| r.result.ok().map(|t| (r.output, t))),
        )
    }

    fn check(&self, f: fn(&NodeState) -> Check) -> Check {
        let c = f(&self.state());
        eprintln!("{}", doctor::render_table(std::slice::from_ref(&c)));
        c
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

#[test]
fn forwarding_off_then_on() {
    let ns = Ns::new("fwd");
    ns.sh("sysctl -qw net.ipv4.ip_forward=0");
    assert_eq!(ns.check(doctor::forwarding).status, Status::Fail);
    ns.sh("sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1");
    assert_eq!(ns.check(doctor::forwarding).status, Status::Ok);
}

#[test]
fn bridge_nf_call_off_then_on() {
    if !std::path::Path::new("/proc/sys/net/bridge").exists() {
        let _ = Command::new("modprobe").arg("br_netfilter").status();
    }
    let bridge_sysctls = std::path::Path::new("/proc/sys/net/bridge").exists();
    let missing = (!bridge_sysctls)
        .then(|| "br_netfilter (no /proc/sys/net/bridge, even after modprobe)".to_string());
    if !weir_testkit::can_run(missing) {
        return;
    }
    let ns = Ns::new("brnf");
    ns.sh("ip link add br0 type bridge");
    ns.sh("sysctl -qw net.bridge.bridge-nf-call-iptables=0");
    let c = ns.check(doctor::br_netfilter);
    assert_eq!(c.status, Status::Fail);
    assert!(c
        .evidence
        .iter()
        .any(|e| e == "net.bridge.bridge-nf-call-iptables = 0"));
    ns.sh("sysctl -qw net.bridge.bridge-nf-call-iptables=1 net.bridge.bridge-nf-call-ip6tables=1");
    assert_eq!(ns.check(doctor::br_netfilter).status, Status::Ok);
}

#[test]
fn forward_drop_without_then_with_kube_forward() {
    let ns = Ns::new("fdrop");
    ns.sh("iptables -P FORWARD DROP && iptables -A FORWARD -i cni0 -j ACCEPT");
    assert_eq!(ns.check(doctor::forward_policy).status, Status::Fail);
    ns.sh(
        "iptables -N KUBE-FORWARD && iptables -I FORWARD -j KUBE-FORWARD \
           && iptables -A KUBE-FORWARD -m mark --mark 0x4000/0x4000 -j ACCEPT \
           && iptables -A KUBE-FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
    );
    assert_eq!(ns.check(doctor::forward_policy).status, Status::Ok);

    // The same with a native nftables forward chain.
    ns.sh("iptables -P FORWARD ACCEPT && nft add table inet filt \
           && nft 'add chain inet filt fwdchain { type filter hook forward priority 0; policy drop; }' \
           && nft add rule inet filt fwdchain ct state established,related accept");
    let c = ns.check(doctor::forward_policy);
    assert_eq!(c.status, Status::Fail);
    assert!(
        c.evidence
            .iter()
            .any(|e| e.contains("inet filt fwdchain has policy drop")),
        "{:?}",
        c.evidence
    );
    ns.sh("nft add rule inet filt fwdchain meta mark and 0x4000 == 0x4000 accept");
    assert_eq!(ns.check(doctor::forward_policy).status, Status::Ok);
}

#[test]
fn dnat_to_a_vanished_endpoint_then_to_a_live_one() {
    let node = Ns::new("dnat");
    let peer = Ns::new("dnatp");
    node.sh(&format!(
        "ip link add v0 type veth peer name v1 netns {}",
        peer.0
    ));
    node.sh("ip addr add 10.99.0.1/24 dev v0 && ip link set v0 up");
    peer.sh("ip addr add 10.99.0.2/24 dev v1 && ip link set v1 up");
    node.sh(
        "iptables -t nat -A PREROUTING -p tcp --dport 80 -j DNAT --to-destination 10.99.0.77:8080",
    );
    // Someone tries the endpoint: nobody answers ARP for it.
    node.sh("timeout 1 bash -c 'echo > /dev/tcp/10.99.0.77/8080' 2>/dev/null; true");
    let c = node.check(doctor::stale_dnat);
    assert_eq!(c.status, Status::Fail);
    assert!(c.evidence.iter().any(|e| e.contains("10.99.0.77") && (e.contains("FAILED") || e.contains("INCOMPLETE"))), "{:?}", c.evidence);

    node.sh("iptables -t nat -F PREROUTING && iptables -t nat -A PREROUTING -p tcp --dport 80 -j DNAT --to-destination 10.99.0.2:8080");
    // The live endpoint answers ARP (its TCP port is closed; the RST is enough).
    node.sh("timeout 1 bash -c 'echo > /dev/tcp/10.99.0.2/8080' 2>/dev/null; true");
    let c = node.check(doctor::stale_dnat);
    assert_eq!(c.status, Status::Ok);
    assert!(
        c.evidence[0].contains("1 answering on a local link"),
        "{:?}",
        c.evidence
    );
}

#[test]
fn vxlan_mtu_below_the_bridge_then_matched() {
    let ns = Ns::new("mtu");
    ns.sh("ip link add eth0 type dummy 2>/dev/null || ip link add eth0 type veth peer name eth0p");
    ns.sh("ip link set eth0 up && ip addr add 192.0.2.1/24 dev eth0");
    ns.sh("ip link add flannel.1 type vxlan id 1 local 192.0.2.1 dev eth0 dstport 8472 && ip link set flannel.1 mtu 1450 up");
    ns.sh("ip link add cni0 type bridge && ip link add vethx1 type veth peer name vethx2 && ip link set vethx1 master cni0");
    let c = ns.check(doctor::mtu);
    assert_eq!(c.status, Status::Fail);
    assert!(
        c.evidence.iter().any(|e| e.contains("vethx1 mtu 1500")),
        "{:?}",
        c.evidence
    );
    ns.sh("ip link set vethx1 mtu 1450 && ip link set cni0 mtu 1450");
    assert_eq!(ns.check(doctor::mtu).status, Status::Ok);
}

#[test]
fn eni_shared_fix_off_then_on() {
    let ns = Ns::new("eni");
    ns.sh(
        "ip link add eth0 type veth peer name eth0p && ip link add eth1 type veth peer name eth1p \
           && ip link add enipod1 type veth peer name enipod1p \
           && for l in eth0 eth0p eth1 eth1p enipod1; do ip link set $l up; done",
    );
    ns.sh(
        "ip addr add 10.12.97.49/24 dev eth0 && ip route add default via 10.12.97.1 dev eth0 \
           && ip route add default via 10.12.192.1 dev eth1 onlink table 1003 \
           && ip route add 10.12.192.44 dev enipod1 scope link \
           && ip rule add pref 512 to 10.12.192.44 lookup main \
           && ip rule add pref 1536 from 10.12.192.44 lookup 1003 \
           && sysctl -qw net.ipv4.conf.all.rp_filter=1 net.ipv4.conf.eth0.rp_filter=1",
    );
    let c = ns.check(doctor::eni_asymmetric);
    assert_eq!(c.status, Status::Fail);
    assert!(
        c.evidence
            .iter()
            .any(|e| e.contains("eth1 has no IPv4 address") && e.contains("10.12.97.49")),
        "{:?}",
        c.evidence
    );
    assert!(
        c.evidence
            .iter()
            .any(|e| e.starts_with("outside → NodePort")),
        "{:?}",
        c.evidence
    );
    // weir-cni's fix: the ENI's own address, the fwmark rule, src_valid_mark.
    ns.sh("ip addr add 10.12.192.10/32 dev eth1 noprefixroute \
           && ip route replace default via 10.12.192.1 dev eth1 onlink table 1003 \
           && ip rule add pref 1024 fwmark 0x80/0x80 lookup main \
           && sysctl -qw net.ipv4.conf.all.src_valid_mark=1");
    let c = ns.check(doctor::eni_asymmetric);
    assert_eq!(c.status, Status::Ok, "{:?}", c.evidence);
}

/// A UDP "DNS server" in `ns` that answers every query with an empty NOERROR response, until
/// the returned flag is set.
fn answer_dns(ns: &str, addr: &str) -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let handle = weir_kernel::NetNs::named(ns).unwrap();
    let sock = handle.run(|| UdpSocket::bind((addr, 53)).unwrap()).unwrap();
    sock.set_read_timeout(Some(std::time::Duration::from_millis(100)))
        .unwrap();
    let flag = stop.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        while !flag.load(Ordering::Relaxed) {
            if let Ok((n, from)) = sock.recv_from(&mut buf) {
                if n >= 12 {
                    buf[2] = 0x81; // QR, RD
                    buf[3] = 0x80; // RA, NOERROR
                    let _ = sock.send_to(&buf[..n], from);
                }
            }
        }
    });
    stop
}

#[test]
fn pod_dns_host_only_then_dead_then_live() {
    let pod = Ns::new("pod");
    let dns = Ns::new("dns");
    pod.sh(&format!(
        "ip link add eth0 type veth peer name d0 netns {}",
        dns.0
    ));
    pod.sh("ip addr add 10.98.0.2/24 dev eth0 && ip link set eth0 up");
    dns.sh("ip addr add 10.98.0.53/24 dev d0 && ip link set d0 up && ip link set lo up");
    let target = Target {
        netns: Some(pod.0.clone()),
    };
    let probe = |resolv: &str| {
        let probes = doctor::nameservers(resolv)
            .into_iter()
            .filter(|ip| !ip.is_loopback())
            .map(|ip| (ip, target.probe_dns(ip)))
            .collect();
        let c = doctor::pod_dns(Some(&PodDns {
            source: "test".into(),
            resolv_conf: resolv.into(),
            probes,
        }));
        eprintln!("{}", doctor::render_table(std::slice::from_ref(&c)));
        c
    };
    assert_eq!(probe("nameserver 127.0.0.53\n").status, Status::Fail);
    // Nothing listens on 10.98.0.53:53 yet.
    let c = probe("nameserver 10.98.0.53\n");
    assert_eq!(c.status, Status::Fail);
    assert!(
        c.evidence[0].contains("does not answer"),
        "{:?}",
        c.evidence
    );
    let stop = answer_dns(&dns.0, "10.98.0.53");
    let c = probe("nameserver 10.98.0.53\n");
    stop.store(true, Ordering::Relaxed);
    assert_eq!(c.status, Status::Ok, "{:?}", c.evidence);
}
