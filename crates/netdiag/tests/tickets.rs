//! A corpus of real tickets (`tests/data/tickets/<name>/`): the outputs reporters pasted into
//! public Kubernetes, CNI-plugin and cloud-CNI issues whose threads found the cause, each with a
//! `case.json` naming the issue, the packet, the cause and a word the verdict must contain to name
//! it. Every case is run through `weir trace` (or `weir doctor`) as a library on its directory
//! and classed against the thread's cause (see [`Class`]).
//!
//! Every case is listed in [`CASES`] with its class and why, and the table is asserted exactly:
//! a case whose class changes fails the test until the table (and the score in the corpus
//! README) is updated, so both stay the truth.

use std::path::{Path, PathBuf};

use serde_json::Value;
use weir_netdiag::doctor::{self, Status};
use weir_netdiag::state::NodeState;
use weir_netdiag::trace::{self, Packet, Proto, Verdict};

/// How a verdict stands against the cause the ticket's thread found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// A definite verdict names the cause: `weir trace` drops or rejects the packet with it, or
    /// a `weir doctor` check fails with it.
    Explained,
    /// A conditional verdict whose failing branch names the cause: a trace branch, or a doctor
    /// warning (doctor warns where what it read points at the cause but the paste leaves a
    /// condition open, and says which).
    Conditional,
    /// No verdict: trace is unknown and names the output that would settle it (or is
    /// conditional with no branch naming the cause, an unknown branch the ticket's node may be
    /// on, and no delivered branch it may be on), or the doctor check the cause belongs to skips
    /// naming the output it needs (or, doctor's counterpart of that conditional, warns of
    /// something else the paste leaves open, naming the output that would settle it), and
    /// nothing else fails.
    Unknown,
    /// The verdict contradicts the thread: delivered, or a delivered branch whose conditions
    /// the thread does not rule out (`dst_local` in case.json rules out the other side of
    /// `Fact::Route`), where the thread shows a failure; a definite drop or failure blaming
    /// something else; or the check the cause belongs to passing.
    Wrong,
}

/// Every case, its class and why. The test asserts each case's class exactly: a class that
/// changes fails it until this table (and the score in the corpus README) is updated.
const CASES: &[(&str, Class, &str)] = &[
    (
        "aws-vpc-cni-231-eni-source-dest-check",
        Class::Unknown,
        "only rp_filter sysctls (loose on eth0) were pasted and no routes: trace is unknown at routing, naming `ip route show table all`; the cause (the EC2 source/destination check on secondary ENIs) is in the cloud, in no node output",
    ),
    (
        "aws-vpc-cni-705-missing-to-pod-rules",
        Class::Unknown,
        "the `ip rule` paste is read (the sender's rule 1536 to table 2, no `512: to 10.80.46.124` rule), but no routes were pasted: trace walks the request both ways (this node's, forwarded); the thread's side (a local pod, `dst_local` false) is unknown at reply routing or the reverse-path check, naming `ip route show table all`",
    ),
    (
        "calico-2072-tunl0-mtu-over-wireguard",
        Class::Unknown,
        "a salt-indented `ip addr | grep mtu` has no device kinds and is not read: the mtu check skips, naming `ip -d link`; which device carries tunl0's packets (wg0) is in no paste",
    ),
    (
        "calico-3258-ipvs-vip-as-source",
        Class::Conditional,
        "ipvs-vip-source warns: the `ipvsadm -Lnc` entry's source is the virtual server's own address (SYN_RECV)",
    ),
    (
        "cilium-12098-eks-nodeport-reply-eni-rule",
        Class::Unknown,
        "one `ip rule` line and one grep-cut mangle line, no nat table, sysctls or routes: walked both ways, the forwarded side is unknown at reply routing and the side taken as the node's own address is unknown at delivery (no pasted route or address says it is the node's), each naming `ip route show table all`",
    ),
    (
        "cilium-19761-rp-filter-loose",
        Class::Conditional,
        "rp-filter-refusals warns: net.ipv4.conf.all.rp_filter = 2 reaches cilium_host, and Cilium's interfaces need it 0 (a warning: whether a reply was refused is not in the paste)",
    ),
    (
        "flannel-841-vxlan-mtu-aws",
        Class::Conditional,
        "mtu warns: flannel.1 at 1500 below eth0 9001 − 50 (no pod-side MTU pasted)",
    ),
    (
        "k3s-1114-buster-nft-forward-drop",
        Class::Conditional,
        "forward-policy warns: FORWARD policy DROP in the nft-backed listing, but the reporter elided its rules with `...`, so the accepts may be in what was cut",
    ),
    (
        "k8s-108718-forward-drop-pod-from-other-node",
        Class::Conditional,
        "forward-policy warns: FORWARD policy DROP with no accept shown, hedged because it jumps to DOCKER-USER, KUBE-FORWARD and others the listing does not show",
    ),
    (
        "k8s-125467-udp-conntrack-stale-coredns",
        Class::Unknown,
        "the one conntrack line has the reporter's `<clusterIp>` redaction and is not read; conntrack-nat skips, naming `iptables-save`",
    ),
    (
        "k8s-18100-hairpin-mode-zero",
        Class::Conditional,
        "hairpin warns: hairpin_mode 0 on all 3 bridge ports (hedged for a promiscuous bridge)",
    ),
    (
        "k8s-18604-conntrack-table-full-dmesg",
        Class::Explained,
        "conntrack fails: 14 `nf_conntrack: table full, dropping packet` kernel log lines",
    ),
    (
        "k8s-23322-hairpin-veth-fallback",
        Class::Conditional,
        "hairpin warns: hairpin_mode 0 on docker0's 4 ports (hedged for a promiscuous bridge)",
    ),
    (
        "k8s-36835-no-cluster-cidr-no-masquerade",
        Class::Unknown,
        "the stored paste stops before KUBE-SERVICES and the DNAT rules, and no routes: the ClusterIP (`dst_local` false) walked as forwarded is unknown at reply routing or the reverse-path check, naming `ip route show table all`",
    ),
    (
        "k8s-39658-canal-nodeport-forward-drop",
        Class::Conditional,
        "forward-policy warns: FORWARD policy DROP and nothing accepting, hedged for felix-FORWARD and the docker chains it jumps to",
    ),
    (
        "k8s-43966-cni-hairpin-not-set",
        Class::Conditional,
        "hairpin warns: hairpin_mode 0 on cni0's 2 ports, read from the `path = value` form",
    ),
    (
        "k8s-48370-udp-conntrack-empty-endpoints",
        Class::Unknown,
        "`conntrack -L` is read but no proxy rules say 10.15.240.10 is a Service, and no routes: the ClusterIP (`dst_local` false) walked as forwarded is unknown at reply routing or the reverse-path check, naming `ip route show table all`",
    ),
    (
        "k8s-55923-ipvs-nodeport-non-eth-nic",
        Class::Unknown,
        "only an `ipvsadm -ln` from before the NodePort existed, no iptables, sysctls or routes: walked both ways, unknown on each (reply routing; delivery to an address nothing shows is the node's), naming `ip route show table all`",
    ),
    (
        "k8s-59976-ipvs-lb-ip-not-on-kube-ipvs0",
        Class::Unknown,
        "the stored `ipvsadm` paste stops after its header, no `ip addr` or routes: trace branches on the very fact the thread found (whether 192.168.16.240 is this node's); the thread's side (not on kube-ipvs0, `dst_local` false) is unknown at reply routing, naming `ip route show table all`, not the missing address",
    ),
    (
        "k8s-63479-hostnetwork-forward-drop",
        Class::Unknown,
        "one iptables LOG line (not read), no rules, routes or addresses: trace is unknown at output routing, naming `ip route show table all`",
    ),
    (
        "k8s-65158-ipvs-host-to-clusterip",
        Class::Conditional,
        "ipvs-vip-source warns: 10.200.10.10 on kube-ipvs0 is the source of the node's own connections to it unless kube-proxy masquerades them, which no pasted iptables shows",
    ),
    (
        "k8s-71261-conntrack-table-full",
        Class::Explained,
        "conntrack fails: the `nf_conntrack: table full, dropping packet` kernel log lines",
    ),
    (
        "k8s-71705-coredns-loop-local-dnsmasq",
        Class::Explained,
        "pod-dns fails: nameserver 127.0.0.1 is the pod's own loopback (CoreDNS forwards to itself)",
    ),
    (
        "k8s-81635-forward-reject-rule-order",
        Class::Unknown,
        "no iptables was pasted (the stored copy stops before it): with ip_forward 1 the walk is unknown, `no firewall rules were pasted`, naming `iptables-save` (dropped only where ip_forward is 0); the REJECT is in what the stored copy cut",
    ),
    (
        "k8s-97283-rhel8-firewalld-nft",
        Class::Unknown,
        "the `nft list table ip filter` text is read (the stored copy cuts it inside FORWARD): forward-policy warns, hedged, that FORWARD's policy is drop and its accepts are in cali-FORWARD, KUBE-FORWARD and five more chains the paste does not show, needing the whole `nft list ruleset`; the table that rejects (inet firewalld) is not in the paste. Before the text was read, forward-policy skipped (and before this corpus passed with no evidence)",
    ),
    (
        "kube-arm-62-forward-drop-cni0",
        Class::Conditional,
        "forward-policy warns: FORWARD policy DROP with only docker0 accepted, hedged because the reporter cut the paste (`...`, no table header)",
    ),
    (
        "kube-router-1136-egress-policy-service-vip",
        Class::Unknown,
        "the policy (no Pods) and a grep cut of KUBE-ROUTER-INPUT that no shown INPUT rule jumps to, no sysctls or routes: walked both ways, unknown on each (reply routing; delivery to an address nothing shows is the node's), naming `ip route show table all`; policy-dns skips for want of Pods",
    ),
    (
        "kube-router-637-hairpin-cni-conf",
        Class::Unknown,
        "only kube-router's hairpin SNAT rule was pasted: hairpin skips, naming the sysfs hairpin_mode output",
    ),
    (
        "kubeadm-1162-coredns-loop-systemd-resolved",
        Class::Explained,
        "pod-dns fails: nameserver 127.0.0.53 is the pod's own loopback (CoreDNS forwards to itself)",
    ),
    (
        "kubeadm-139-firewalld-forward-reject",
        Class::Conditional,
        "forward-policy warns: the catch-all REJECT ends FORWARD before flannel's appended accepts (cut by the stored copy)",
    ),
    (
        "kubespray-2067-centos7-bridge-nf-call-zero",
        Class::Explained,
        "br-netfilter fails: net.bridge.bridge-nf-call-iptables = 0",
    ),
    (
        "lyft-ipvlan-38-nodeport-rp-filter",
        Class::Conditional,
        "rp-filter-refusals warns: `ip route get ... iif ens3` answered `Invalid cross-device link` and the kernel logged the martian",
    ),
    (
        "rke-1788-centos8-nft-forward-drop",
        Class::Conditional,
        "forward-policy warns: FORWARD policy DROP with only docker0 accepted, hedged for the docker chains it jumps to (the backend mismatch behind it is not named)",
    ),
    (
        "zalando-kubernetes-on-aws-1470-flannel-hairpin",
        Class::Conditional,
        "hairpin warns: hairpin_mode 0 on the bridge's ports (the paste elided the rest with `...`)",
    ),
];

fn tickets_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tickets")
}

fn case_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(tickets_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

fn name_of(dir: &Path) -> String {
    dir.file_name().unwrap().to_string_lossy().into_owned()
}

fn field<'a>(case: &'a Value, key: &str, name: &str) -> &'a str {
    case[key]
        .as_str()
        .unwrap_or_else(|| panic!("{name}/case.json: `{key}` is not a string"))
}

/// What the tool said about the case, and its class.
struct Outcome {
    class: Class,
    said: String,
}

fn names(text: &str, expect: &str) -> bool {
    text.to_lowercase().contains(&expect.to_lowercase())
}

fn packet_of(case: &Value, name: &str) -> Packet {
    let p = &case["packet"];
    let addr = |k: &str| {
        p[k].as_str()
            .unwrap_or_else(|| panic!("{name}: packet.{k}"))
            .parse()
            .unwrap_or_else(|e| panic!("{name}: packet.{k}: {e}"))
    };
    let proto = match p["proto"].as_str().unwrap_or("tcp") {
        "tcp" => Proto::Tcp,
        "udp" => Proto::Udp,
        other => panic!("{name}: packet.proto {other}"),
    };
    let iif = p["iif"]
        .as_str()
        .unwrap_or_else(|| panic!("{name}: packet.iif (a directory has no pod netns to follow)"));
    Packet {
        src: addr("from"),
        dst: addr("to"),
        proto,
        sport: 40000,
        dport: p["dport"]
            .as_u64()
            .and_then(|d| u16::try_from(d).ok())
            .unwrap_or_else(|| panic!("{name}: packet.dport")),
        iif: iif.into(),
    }
}

fn run_trace(st: &NodeState, case: &Value, name: &str, expect: &str) -> Outcome {
    let t = trace::trace(st, &packet_of(case, name));
    let cause = t.cause.clone().unwrap_or_default();
    let failing = |v: &Verdict| matches!(v, Verdict::Dropped | Verdict::Rejected);
    let branch_names = t
        .branches
        .iter()
        .any(|b| failing(&b.verdict) && b.cause.as_deref().is_some_and(|c| names(c, expect)));
    let settles =
        t.unknowns.iter().any(|u| !u.settle.is_empty()) || cause.contains("settle it with");
    // What the thread settles about the node: `dst_local` (the destination is one of the
    // node's own addresses, or not). A branch whose every conjunction contradicts it is not the
    // ticket's node; any other branch may be.
    let dst = case["packet"]["to"].as_str().unwrap_or_default();
    let local = case.get("dst_local").and_then(Value::as_bool);
    let may_hold = |b: &trace::Branch| {
        b.when.iter().any(|conj| {
            conj.iter().all(|c| match (&c.fact, local) {
                (trace::Fact::Route(d), Some(l)) if d == dst => c.values.contains(&i64::from(!l)),
                _ => true,
            })
        })
    };
    let delivered_here = t
        .branches
        .iter()
        .any(|b| b.verdict == Verdict::Delivered && may_hold(b));
    let unknown_branch = t
        .branches
        .iter()
        .any(|b| b.verdict == Verdict::Unknown && may_hold(b));
    let class = match t.verdict {
        Verdict::Dropped | Verdict::Rejected if names(&cause, expect) => Class::Explained,
        Verdict::Conditional if branch_names => Class::Conditional,
        Verdict::Conditional if !delivered_here && unknown_branch && settles => Class::Unknown,
        Verdict::Unknown if settles => Class::Unknown,
        _ => Class::Wrong,
    };
    let mut said = format!("{:?}: {}", t.verdict, cause);
    for b in &t.branches {
        said.push_str(&format!(
            "\n    when {}: {:?}: {}",
            b.when_text,
            b.verdict,
            b.cause.as_deref().unwrap_or("")
        ));
    }
    for u in &t.unknowns {
        said.push_str(&format!("\n    unknown: {} ({})", u.why, u.settle));
    }
    Outcome { class, said }
}

/// Doctor's class: a failing check naming the cause explains it, a warning naming it is
/// conditional; otherwise any failing check blames something else (wrong), and the check the
/// cause belongs to (`check` in case.json) decides: skipped is unknown, passing is wrong.
fn run_doctor(st: &NodeState, case: &Value, name: &str, expect: &str) -> Outcome {
    let pod = doctor::PodDns::from_saved(st);
    let checks = doctor::run_all(st, pod.as_ref());
    let text = |c: &doctor::Check| {
        format!(
            "{} {} {} {}",
            c.id,
            c.title,
            c.evidence.join(" "),
            c.fix.as_deref().unwrap_or("")
        )
    };
    let naming = |s: Status| {
        checks
            .iter()
            .any(|c| c.status == s && names(&text(c), expect))
    };
    let owner = field(case, "check", name);
    let own = checks
        .iter()
        .find(|c| c.id == owner)
        .unwrap_or_else(|| panic!("{name}: no doctor check {owner}"));
    let class = if naming(Status::Fail) {
        Class::Explained
    } else if naming(Status::Warn) {
        Class::Conditional
    } else if checks.iter().any(|c| c.status == Status::Fail) {
        Class::Wrong
    } else if own.status == Status::Skip && !own.evidence.is_empty() {
        Class::Unknown
    } else if own.status == Status::Warn && own.evidence.iter().any(|e| e.contains("needs ")) {
        // A hedged warning about what the paste leaves open, saying what would settle it:
        // not the cause, not a claim against it.
        Class::Unknown
    } else {
        Class::Wrong
    };
    let summary: Vec<String> = checks
        .iter()
        .filter(|c| c.status != Status::Skip || c.id == owner)
        .map(|c| format!("{} {}", c.status.label(), c.id))
        .collect();
    Outcome {
        class,
        said: format!(
            "{} (others skip); {owner}: {}",
            summary.join(", "),
            own.evidence.join(" | ")
        ),
    }
}

fn run_case(dir: &Path) -> (String, Outcome) {
    let name = name_of(dir);
    let text = std::fs::read_to_string(dir.join("case.json"))
        .unwrap_or_else(|e| panic!("{name}/case.json: {e}"));
    let case: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}/case.json: {e}"));
    let url = field(&case, "url", &name);
    assert!(url.starts_with("https://github.com/"), "{name}: url {url}");
    assert!(!field(&case, "cause", &name).is_empty(), "{name}: no cause");
    let expect = field(&case, "expect", &name);
    assert!(!expect.is_empty(), "{name}: empty expect");
    let (st, ignored) = NodeState::from_dir(dir).unwrap();
    let outcome = match field(&case, "tool", &name) {
        "trace" => run_trace(&st, &case, &name, expect),
        "doctor" => run_doctor(&st, &case, &name, expect),
        other => panic!("{name}: tool {other}"),
    };
    println!(
        "{name}: {:?} — {url}\n  read {:?}, not read {:?}, skipped {} line(s)\n  {}",
        outcome.class,
        st.present,
        ignored,
        st.skipped.len(),
        outcome.said
    );
    if std::env::var("TICKETS_DEBUG").is_ok() {
        println!(
            "  assumptions {:?}\n  skipped {:?}",
            st.assumptions, st.skipped
        );
    }
    (name, outcome)
}

/// The score line the corpus README states.
fn score(classes: &[Class]) -> String {
    let n = |k: Class| classes.iter().filter(|c| **c == k).count();
    format!(
        "{} explained, {} conditional naming the cause, {} honest unknown, {} wrong, of {}",
        n(Class::Explained),
        n(Class::Conditional),
        n(Class::Unknown),
        n(Class::Wrong),
        classes.len()
    )
}

#[test]
fn tickets_corpus_classes_match_the_table() {
    let dirs = case_dirs();
    assert!(dirs.len() >= 30, "only {} cases", dirs.len());
    let names: Vec<String> = dirs.iter().map(|d| name_of(d)).collect();
    for (listed, _, why) in CASES {
        assert!(
            names.iter().any(|n| n == listed),
            "CASES names {listed}, which is not a case"
        );
        assert!(!why.is_empty(), "{listed}: no reason given");
    }

    let mut classes = Vec::new();
    let mut mismatches = Vec::new();
    for dir in &dirs {
        let (name, outcome) = run_case(dir);
        classes.push(outcome.class);
        match CASES.iter().find(|(n, _, _)| *n == name) {
            None => mismatches.push(format!(
                "{name} is not in CASES (it is {:?})",
                outcome.class
            )),
            Some((_, listed, _)) if *listed != outcome.class => mismatches.push(format!(
                "{name} is {:?}, CASES says {listed:?}: update the table and the README",
                outcome.class
            )),
            Some(_) => {}
        }
    }
    let score = score(&classes);
    println!("{score}");

    let readme = std::fs::read_to_string(tickets_dir().join("README.md")).unwrap();
    for name in &names {
        assert!(
            readme.contains(name.as_str()),
            "README.md does not list {name}"
        );
    }
    assert!(
        mismatches.is_empty(),
        "{score}; mismatches:\n{}",
        mismatches.join("\n")
    );
    assert!(
        readme.contains(&score),
        "README.md does not state the score `{score}`"
    );
}
