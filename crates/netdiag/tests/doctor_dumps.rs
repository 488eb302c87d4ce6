//! `weir doctor` on pasted dumps: every check that can run from the files runs, and one that
//! cannot says which output it needs instead of passing.

use std::path::PathBuf;

use weir_netdiag::doctor::{self, Check, PodDns, Status};
use weir_netdiag::state::{NodeState, Output};

fn data(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn show(c: Check) -> Check {
    eprintln!("{}", doctor::render_table(std::slice::from_ref(&c)));
    c
}

/// A grep of iptables-save with no FORWARD chain in it used to make forward-policy say "ok".
#[test]
fn forward_policy_on_a_cut_iptables_save_skips_or_warns_instead_of_passing() {
    let st = NodeState::from_outputs([(
        Output::IptablesSave,
        data("pasted/iptables-save-grep-A1.txt"),
    )]);
    let c = show(doctor::forward_policy(&st));
    assert_eq!(c.status, Status::Skip);
    assert!(
        c.evidence[0].contains("no filter FORWARD chain"),
        "{:?}",
        c.evidence
    );
    assert!(c.evidence[0].contains("needs the whole `iptables-save`"));

    // FORWARD DROP shown, its accepts cut away by grep: not a confident FAIL.
    let cut = "[root@node ~]# iptables-save | grep -A1 FORWARD\n:FORWARD DROP [0:0]\n-A FORWARD -j DOCKER-USER\n";
    let st = NodeState::from_outputs([(Output::IptablesSave, cut.to_string())]);
    let c = show(doctor::forward_policy(&st));
    assert_eq!(c.status, Status::Warn, "{:?}", c.evidence);
    assert!(c
        .evidence
        .iter()
        .any(|e| e.contains("may be in what was cut")));

    // A whole dump still fails: Ubuntu 18.04's Docker rules (FORWARD DROP) without their
    // RELATED,ESTABLISHED accept.
    let whole = data("pasted/iptables-1.6.1-save.txt").replace(
        "-A FORWARD -o docker0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n",
        "",
    );
    let st = NodeState::from_outputs([(Output::IptablesSave, whole)]);
    let c = show(doctor::forward_policy(&st));
    assert_eq!(c.status, Status::Fail, "{:?}", c.evidence);
}

/// A few pasted sysctl lines without net.bridge.* used to be read as "br_netfilter not loaded".
#[test]
fn br_netfilter_needs_a_whole_sysctl_dump_to_call_the_module_missing() {
    let st = NodeState::from_outputs([(
        Output::Sysctl,
        "$ sysctl net.ipv4.ip_forward net.ipv4.conf.all.rp_filter\nnet.ipv4.ip_forward = 1\nnet.ipv4.conf.all.rp_filter = 1\n".to_string(),
    )]);
    let c = show(doctor::br_netfilter(&st));
    assert_eq!(c.status, Status::Skip);
    assert!(c.evidence[0].contains("needs `sysctl net.bridge`"));
    // forwarding has what it needs there; an rp_filter-only paste does not.
    assert_eq!(doctor::forwarding(&st).status, Status::Ok);
    let st = NodeState::from_outputs([(
        Output::Sysctl,
        "net.ipv4.conf.all.rp_filter = 1\n".to_string(),
    )]);
    let c = show(doctor::forwarding(&st));
    assert_eq!(c.status, Status::Skip);
    assert!(c.evidence[0].contains("needs `sysctl net.ipv4.ip_forward`"));
    // A whole dump without the keys: the module is not loaded.
    let whole: String = (0..30)
        .map(|i| format!("net.ipv4.conf.eth{i}.rp_filter = 1\n"))
        .collect();
    let st = NodeState::from_outputs([(Output::Sysctl, whole.clone())]);
    assert_ne!(doctor::br_netfilter(&st).status, Status::Skip);
    // The same lines as `sysctl -a | grep rp_filter`: a grep, not a whole dump.
    let st = NodeState::from_outputs([(
        Output::Sysctl,
        format!("[root@node ~]# sysctl -a | grep rp_filter\n{whole}"),
    )]);
    let c = show(doctor::br_netfilter(&st));
    assert_eq!(c.status, Status::Skip);
    assert!(c.evidence[0].contains("cut with grep"));
}

/// IPVS's real servers are DNAT targets too: one behind a blackhole route is stale.
#[test]
fn stale_dnat_reads_ipvs_real_servers() {
    let st = NodeState::from_outputs([
        (Output::IpvsadmLn, data("pasted/ipvsadm-Ln-grep-A3.txt")),
        (
            Output::IpRoute,
            "default via 10.12.97.1 dev eth0 \n10.12.97.0/24 dev eth0 proto kernel scope link src 10.12.97.49 \nblackhole 10.12.202.0/24 \n".to_string(),
        ),
    ]);
    let c = show(doctor::stale_dnat(&st));
    assert_eq!(c.status, Status::Fail);
    assert!(c
        .evidence
        .iter()
        .any(|e| e.contains("10.12.202.9") && e.contains("IPVS")));
    assert!(c.evidence.iter().any(|e| e.contains("only those shown")));
}

/// Main-only routes and no ip addr: whether the ENI has an address is unknown, and said so.
#[test]
fn eni_asymmetric_says_which_files_settle_it() {
    let st = NodeState::from_outputs([
        (Output::IpRule, data("ticket-eni-ipvs-lb/ip-rule.txt")),
        (
            Output::IpRoute,
            "default via 10.12.97.1 dev eth0 \n10.12.97.0/24 dev eth0 proto kernel scope link src 10.12.97.49 \n10.12.192.44 dev eni3f9c1a2b4d5 scope link \n$ ip route show table 1003\ndefault via 10.12.192.1 dev eth1 onlink \n".to_string(),
        ),
    ]);
    let c = show(doctor::eni_asymmetric(&st));
    assert_eq!(c.status, Status::Warn);
    assert!(c.evidence[0].contains("cannot tell whether eth1 has an IPv4 address"));
    assert!(c.evidence[0].contains("needs `ip addr`"));

    // The ticket as pasted: table local says eth1 has none; rp_filter is what is missing.
    let (st, _) = NodeState::from_dir(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/ticket-eni-ipvs-lb"),
    )
    .unwrap();
    let c = show(doctor::eni_asymmetric(&st));
    assert_eq!(c.status, Status::Warn);
    assert!(c.evidence[0].contains("takes 10.12.97.49 from eth0"));
    assert!(c.evidence[0]
        .contains("needs `sysctl net.ipv4.conf.all.rp_filter net.ipv4.conf.eth0.rp_filter`"));
}

/// conntrack -S alone is read; the pod's saved resolv.conf is checked as far as a file can be.
#[test]
fn conntrack_stats_and_a_saved_pod_resolv_conf_run_from_files() {
    let st = NodeState::from_outputs([(
        Output::ConntrackStats,
        "cpu=0   \tfound=0 invalid=12 insert=0 insert_failed=0 drop=3 early_drop=0 error=0 search_restart=0 \ncpu=1   \tfound=0 invalid=4 insert=0 insert_failed=0 drop=0 early_drop=0 error=0 search_restart=0 \n".to_string(),
    )]);
    let c = show(doctor::conntrack(&st));
    assert_eq!(c.status, Status::Warn);
    assert!(c
        .evidence
        .iter()
        .any(|e| e.contains("fill level is unknown")));

    for (resolv, status, says) in [
        ("nameserver 127.0.0.53\noptions edns0 trust-ad\n", Status::Fail, "host-only"),
        ("search shop.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n", Status::Skip, "not probed"),
    ] {
        let st = NodeState::from_outputs([(Output::PodResolvConf, resolv.to_string())]);
        let pod = PodDns::from_saved(&st).unwrap();
        let c = show(doctor::pod_dns(Some(&pod)));
        assert_eq!(c.status, status);
        assert!(c.evidence.iter().any(|e| e.contains(says)), "{:?}", c.evidence);
    }
    assert_eq!(
        Output::for_file_name("resolv.conf"),
        Some(Output::PodResolvConf)
    );
}

/// `iptables -L` listings (tests/data/pasted: iptables 1.8.9 on the rules of
/// `iptables-listing-source.rules`) are read into the rule model, so forward-policy judges them:
/// the `-n -v` listing shows KUBE-FORWARD's accepts (and the catch-all REJECT that ends its
/// FORWARD: a warning of its own); `-L FORWARD` alone shows jumps to chains it does not list (a
/// warning naming them, not a pass or a confident FAIL).
#[test]
fn forward_policy_judges_iptables_listings() {
    let st = NodeState::from_outputs([(
        Output::IptablesSave,
        data("pasted/iptables-L-n-v-line-numbers.txt"),
    )]);
    let c = show(doctor::forward_policy(&st));
    assert_eq!(c.status, Status::Warn, "{:?}", c.evidence);
    assert_eq!(
        c.evidence
            .iter()
            .filter(|e| e.contains("catch-all REJECT"))
            .count(),
        1
    );
    assert!(
        c.evidence
            .iter()
            .any(|e| e.contains("marked (0x4000) traffic accepted by `2        0     0 ACCEPT")),
        "{:?}",
        c.evidence
    );

    let st =
        NodeState::from_outputs([(Output::IptablesSave, data("pasted/iptables-L-FORWARD.txt"))]);
    let c = show(doctor::forward_policy(&st));
    assert_eq!(c.status, Status::Warn, "{:?}", c.evidence);
    let all = c.evidence.join("\n");
    assert!(all.contains("policy drop"), "{all}");
    // The unconditional-looking ACCEPT hides `-i cni0 -o eth0` (no -v): not taken as
    // accepting everything.
    assert!(all.contains("hides interface matches"), "{all}");

    // The same FORWARD chain with -v but without the chains it jumps to (a ticket's
    // `iptables -v -L FORWARD`): a warning that names them.
    let one_chain = "$ iptables -v -n -L FORWARD
Chain FORWARD (policy DROP 0 packets, 0 bytes)
 pkts bytes target     prot opt in     out     source               destination
    0     0 KUBE-FORWARD  0    --  *      *       0.0.0.0/0            0.0.0.0/0            /* kubernetes forwarding rules */
    0     0 DOCKER-USER  0    --  *      *       0.0.0.0/0            0.0.0.0/0
";
    let st = NodeState::from_outputs([(Output::IptablesSave, one_chain.to_string())]);
    let c = show(doctor::forward_policy(&st));
    assert_eq!(c.status, Status::Warn, "{:?}", c.evidence);
    let all = c.evidence.join("\n");
    assert!(all.contains("jumps to KUBE-FORWARD, DOCKER-USER"), "{all}");

    // With -v and nothing jumped to: a confident FAIL, as for iptables-save.
    let alone = "Chain FORWARD (policy DROP 0 packets, 0 bytes)
 pkts bytes target     prot opt in     out     source               destination
    0     0 ACCEPT     0    --  cni0   *       0.0.0.0/0            0.0.0.0/0
";
    let st = NodeState::from_outputs([(Output::IptablesSave, alone.to_string())]);
    let c = show(doctor::forward_policy(&st));
    assert_eq!(c.status, Status::Fail, "{:?}", c.evidence);
}

/// kubernetes#48370 reproduced here (tests/data/pasted/conntrack-L.txt): with the nat rule that
/// DNATs 10.96.0.10:53 in the dump, conntrack-nat names the entry that bypasses it; without the
/// rules, the two entries to one destination (one DNATed, one not) say the same, hedged; a lone
/// un-DNATed entry without rules cannot be judged (skip, naming what it needs).
#[test]
fn conntrack_nat_names_entries_bypassing_a_services_dnat() {
    let rules = "*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
-A OUTPUT -j KUBE-SERVICES
-A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m udp --dport 53 -j DNAT --to-destination 10.1.0.7:53
COMMIT
";
    let ct = data("pasted/conntrack-L.txt");
    let st = NodeState::from_outputs([
        (Output::IptablesSave, rules.to_string()),
        (Output::ConntrackList, ct.clone()),
    ]);
    let c = show(doctor::conntrack_nat(&st));
    assert_eq!(c.status, Status::Warn, "{:?}", c.evidence);
    assert_eq!(c.evidence.len(), 1, "{:?}", c.evidence);
    let e = &c.evidence[0];
    assert!(
        e.starts_with("udp 10.1.0.1:40001 → 10.96.0.10:53 was not DNATed"),
        "{e}"
    );
    assert!(e.contains("has endpoints now (10.1.0.7:53"), "{e}");
    assert!(c
        .fix
        .as_deref()
        .unwrap()
        .contains("conntrack -D -p udp --orig-dst 10.96.0.10"));

    // Without the rules: one DNATed, one not, to the same destination.
    let st = NodeState::from_outputs([(Output::ConntrackList, ct.clone())]);
    let c = show(doctor::conntrack_nat(&st));
    assert_eq!(c.status, Status::Warn, "{:?}", c.evidence);
    assert!(c.evidence[0].contains("were DNATed (to 10.1.0.7:53) and 1 were not"));
    assert!(c.evidence[0].contains("if the rules DNAT every connection"));

    // One un-DNATed entry and no rules: cannot tell whether 10.96.0.10 is a Service.
    let lone = ct
        .lines()
        .filter(|l| !l.contains("sport=40002"))
        .collect::<Vec<_>>()
        .join("\n")
        + "\n";
    let st = NodeState::from_outputs([(Output::ConntrackList, lone)]);
    let c = show(doctor::conntrack_nat(&st));
    assert_eq!(c.status, Status::Skip, "{:?}", c.evidence);
    assert!(
        c.evidence[0].contains("needs `iptables-save`"),
        "{:?}",
        c.evidence
    );

    // Entries all bound to current endpoints: ok.
    let fresh = ct
        .lines()
        .filter(|l| !l.contains("sport=40001"))
        .collect::<Vec<_>>()
        .join("\n")
        + "\n";
    let st = NodeState::from_outputs([
        (Output::IptablesSave, rules.to_string()),
        (Output::ConntrackList, fresh),
    ]);
    let c = show(doctor::conntrack_nat(&st));
    assert_eq!(c.status, Status::Ok, "{:?}", c.evidence);
}

/// An overlay MTU too *small*: flannel's vxlan backend sets flannel.1 to the underlay's MTU − 50
/// and gives that to the pods, so flannel.1 at 1500 over eth0 at 9001 (flannel#841, its
/// maintainer's `ip -d link` as pasted in the ticket) warns; another VXLAN device below its
/// underlay is only noted (a smaller MTU can be chosen for a path elsewhere).
#[test]
fn mtu_warns_on_a_flannel_device_below_underlay_minus_50() {
    let links = data("tickets/flannel-841-vxlan-mtu-aws/ip-link.txt");
    let st = NodeState::from_outputs([(Output::IpLink, links.clone())]);
    let c = show(doctor::mtu(&st));
    assert_eq!(c.status, Status::Warn, "{:?}", c.evidence);
    assert!(
        c.evidence
            .iter()
            .any(|e| e
                .contains("flannel.1 mtu 1500 is below its underlay eth0 mtu 9001 − 50 = 8951")),
        "{:?}",
        c.evidence
    );
    assert!(c
        .fix
        .as_deref()
        .unwrap()
        .contains("ip link set flannel.1 mtu 8951"));

    let other = links.replace("flannel.1", "vxlan0");
    let st = NodeState::from_outputs([(Output::IpLink, other)]);
    let c = show(doctor::mtu(&st));
    assert_eq!(c.status, Status::Ok, "{:?}", c.evidence);
    assert!(c
        .evidence
        .iter()
        .any(|e| e.contains("smaller than the underlay allows")));

    // At eth0 − 50 exactly: nothing to say.
    let right = links.replace(
        "flannel.1: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500",
        "flannel.1: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 8951",
    );
    let st = NodeState::from_outputs([(Output::IpLink, right)]);
    assert_eq!(doctor::mtu(&st).status, Status::Ok);
}

/// `ipvsadm -Lnc` connection entries: one whose source is a virtual server's own address (the
/// node dialled a ClusterIP and took it, on kube-ipvs0, as its source; calico#3258's paste, a
/// SYN_RECV entry) warns; entries from other sources are only counted.
#[test]
fn ipvs_vip_source_names_connections_from_a_virtual_address() {
    let conns = "[root@k8s-4 ~]# ipvsadm -Lnc
IPVS connection entries
pro expire state       source             virtual            destination
TCP 00:51  SYN_RECV    10.254.0.1:37954   10.254.0.1:443     10.111.32.241:6443
TCP 14:58  ESTABLISHED 10.244.1.7:51122   10.254.0.1:443     10.111.32.239:6443
";
    let st = NodeState::from_outputs([(Output::IpvsadmConns, conns.to_string())]);
    assert!(st.skipped.is_empty(), "{:?}", st.skipped);
    let c = show(doctor::ipvs_vip_source(&st));
    assert_eq!(c.status, Status::Warn, "{:?}", c.evidence);
    assert_eq!(c.evidence.len(), 1, "{:?}", c.evidence);
    assert!(c.evidence[0].contains(
        "tcp connection 10.254.0.1:37954 → 10.254.0.1:443 → 10.111.32.241:6443 (SYN_RECV) has the virtual server address 10.254.0.1 as its source"
    ));
    assert!(c.fix.is_some());

    let ok = conns
        .lines()
        .filter(|l| !l.contains("SYN_RECV"))
        .collect::<Vec<_>>()
        .join("\n");
    let st = NodeState::from_outputs([(Output::IpvsadmConns, ok)]);
    let c = show(doctor::ipvs_vip_source(&st));
    assert_eq!(c.status, Status::Ok, "{:?}", c.evidence);

    let st = NodeState::from_outputs([(Output::Sysctl, "net.ipv4.ip_forward = 1\n".to_string())]);
    assert_eq!(doctor::ipvs_vip_source(&st).status, Status::Skip);
}

/// A catch-all REJECT in FORWARD itself (firewalld's) is the chain's effective policy: kubeadm#139's
/// pasted FORWARD chain (no policy line, cut right after the REJECT) warns naming it; with
/// flannel's ACCEPTs after it in the dump, they are dead rules and the check fails.
#[test]
fn forward_policy_names_a_catch_all_reject_before_the_cnis_accepts() {
    let chain = data("tickets/kubeadm-139-firewalld-forward-reject/iptables.txt");
    let st = NodeState::from_outputs([(Output::IptablesSave, chain.clone())]);
    let c = show(doctor::forward_policy(&st));
    assert_eq!(c.status, Status::Warn, "{:?}", c.evidence);
    let all = c.evidence.join("\n");
    assert!(
        all.contains("rule 10 is a catch-all REJECT: `-A FORWARD -j REJECT --reject-with icmp-host-prohibited`"),
        "{all}"
    );
    assert!(all.contains("KUBE-FORWARD, FORWARD_direct"), "{all}");

    let whole = format!(
        "{chain}-A FORWARD -s 10.244.0.0/16 -j ACCEPT\n-A FORWARD -d 10.244.0.0/16 -j ACCEPT\n"
    );
    let st = NodeState::from_outputs([(Output::IptablesSave, whole)]);
    let c = show(doctor::forward_policy(&st));
    assert_eq!(c.status, Status::Fail, "{:?}", c.evidence);
    assert!(c
        .evidence
        .iter()
        .any(|e| e.contains("never reached: `-A FORWARD -s 10.244.0.0/16 -j ACCEPT`")));
}

/// Bridge ports' sysfs hairpin_mode (kubernetes#23322's `cat …/docker0/brif/veth*/hairpin_mode`,
/// all 0): a warning naming the bridge; every port at 1 is fine; `grep .` output names the ports.
#[test]
fn hairpin_warns_on_bridge_ports_without_hairpin_mode() {
    let st = NodeState::from_outputs([(
        Output::HairpinMode,
        data("tickets/k8s-23322-hairpin-veth-fallback/hairpin_mode.txt"),
    )]);
    assert!(st.skipped.is_empty(), "{:?}", st.skipped);
    let c = show(doctor::hairpin(&st));
    assert_eq!(c.status, Status::Warn, "{:?}", c.evidence);
    assert!(
        c.evidence[0].starts_with("hairpin_mode is 0 on 4 of docker0's 4 port(s):"),
        "{:?}",
        c.evidence
    );
    assert!(c
        .fix
        .as_deref()
        .unwrap()
        .contains("--hairpin-mode=hairpin-veth"));

    let grep = "$ grep . /sys/class/net/*/brif/*/hairpin_mode
/sys/class/net/cni0/brif/veth1a2b3c4d/hairpin_mode:1
/sys/class/net/cni0/brif/veth5e6f7a8b/hairpin_mode:0
";
    let st = NodeState::from_outputs([(Output::HairpinMode, grep.to_string())]);
    let c = show(doctor::hairpin(&st));
    assert_eq!(c.status, Status::Warn, "{:?}", c.evidence);
    assert!(c.evidence[0].starts_with("hairpin_mode is 0 on 1 of cni0's 2 port(s) (veth5e6f7a8b)"));

    let st = NodeState::from_outputs([(Output::HairpinMode, grep.replace(":0", ":1"))]);
    assert_eq!(doctor::hairpin(&st).status, Status::Ok);
}

/// Refusals the kernel itself reported: lyft/cni-ipvlan-vpc-k8s#38's `ip route get … iif ens3`
/// (`Invalid cross-device link`) and its martian-source log line name rp_filter on ens3; the
/// `Invalid argument` a recent kernel answers (captured here) is hedged; answers that are routes
/// are not refusals.
#[test]
fn rp_filter_refusals_from_ip_route_get_and_the_kernel_log() {
    let dir = "tickets/lyft-ipvlan-38-nodeport-rp-filter";
    let st = NodeState::from_outputs([
        (Output::IpRouteGet, data(&format!("{dir}/ip-route-get.txt"))),
        (Output::KernelLog, data(&format!("{dir}/dmesg.txt"))),
    ]);
    let c = show(doctor::rp_filter_refusals(&st));
    assert_eq!(c.status, Status::Warn, "{:?}", c.evidence);
    assert_eq!(c.evidence.len(), 2, "{:?}", c.evidence);
    assert!(c.evidence[0].contains("the kernel's `ip route get 172.30.182.212 from 172.21.51.75 iif ens3` answered `Invalid cross-device link`: the reverse-path filter (rp_filter) on ens3 refuses"));
    assert!(c.evidence[1]
        .starts_with("kernel log: martian source 172.30.182.212 from 172.21.51.75, on dev ens3"));
    assert!(c
        .fix
        .as_deref()
        .unwrap()
        .contains("net.ipv4.conf.ens3.rp_filter=2"));

    let st = NodeState::from_outputs([
        (Output::IpRouteGet, data("pasted/ip-route-get.txt")),
        (
            Output::Sysctl,
            "net.ipv4.conf.all.rp_filter = 0\nnet.ipv4.conf.eth1.rp_filter = 1\n".to_string(),
        ),
    ]);
    let c = show(doctor::rp_filter_refusals(&st));
    assert_eq!(c.status, Status::Warn, "{:?}", c.evidence);
    assert_eq!(c.evidence.len(), 1, "{:?}", c.evidence);
    assert!(c.evidence[0].contains("`Invalid argument`"));
    assert!(c.evidence[0].contains("(rp_filter: conf.all 0, conf.eth1 1)"));

    let st = NodeState::from_outputs([(
        Output::IpRouteGet,
        "$ ip route get 10.1.0.7\n10.1.0.7 dev eth0 src 10.1.0.1 uid 0\n".to_string(),
    )]);
    assert_eq!(doctor::rp_filter_refusals(&st).status, Status::Ok);
}

/// The VIPs on kube-ipvs0 of the captured ipvs node (kube-proxy with a cluster CIDR) are
/// masqueraded when the node itself dials them (`! -s 10.244.0.0/16 … KUBE-CLUSTER-IP dst,dst
/// -j KUBE-MARK-MASQ`): ipvs-vip-source passes; without the iptables dump it can only warn.
#[test]
fn ipvs_vip_source_on_the_captured_ipvs_node() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/ipvs-node");
    let (st, _) = NodeState::from_dir(&dir).unwrap();
    let c = show(doctor::ipvs_vip_source(&st));
    assert_eq!(c.status, Status::Ok, "{:?}", c.evidence);
    assert!(c.evidence[0].contains("masqueraded by"), "{:?}", c.evidence);

    let mut st = st;
    st.iptables = None;
    st.nft = None;
    let c = show(doctor::ipvs_vip_source(&st));
    assert_eq!(c.status, Status::Warn);
    assert!(c.evidence[0].contains("no iptables-save pasted"));
}

/// `nft list table` text (kubernetes#97283's form) is read like `nft -j`: a FORWARD policy
/// drop with nothing accepting fails; with jumps to chains the paste does not show, it warns
/// naming them; a paste none of which reads skips, naming what would be read.
#[test]
fn forward_policy_reads_an_nft_text_paste() {
    let head = "[root@master ~]# nft list table ip filter\ntable ip filter {\n        chain FORWARD {\n                type filter hook forward priority filter; policy drop;\n";
    let text = format!("{head}        }}\n}}\n");
    let st = NodeState::from_outputs([(Output::NftRuleset, text)]);
    let c = show(doctor::forward_policy(&st));
    assert_eq!(c.status, Status::Fail);
    assert!(c.evidence[0].contains("nft chain ip filter FORWARD has policy drop"));

    let text = format!("{head}                 counter packets 1914 bytes 86557 jump cali-FORWARD\n        }}\n}}\n");
    let st = NodeState::from_outputs([(Output::NftRuleset, text)]);
    let c = show(doctor::forward_policy(&st));
    assert_eq!(c.status, Status::Warn);
    assert!(
        c.evidence[0].contains("jumps to cali-FORWARD, which the paste does not show"),
        "{:?}",
        c.evidence
    );

    let st = NodeState::from_outputs([(Output::NftRuleset, "table ip filter\n".to_string())]);
    let c = show(doctor::forward_policy(&st));
    assert_eq!(c.status, Status::Skip, "{:?}", c.evidence);
    assert!(
        c.evidence[0].contains("nft list ruleset"),
        "{:?}",
        c.evidence
    );
}
