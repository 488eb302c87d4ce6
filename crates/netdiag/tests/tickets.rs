//! A corpus of real tickets (`tests/data/tickets/<name>/`): the outputs reporters pasted into
//! public Kubernetes, CNI-plugin and cloud-CNI issues whose threads found the cause, each with a
//! `case.json` naming the issue, the packet, the cause and a word the verdict must contain to name
//! it. Every case is run through `weir trace` (or `weir doctor`) as a library on its directory.
//!
//! The cases the tools cannot explain yet are listed in [`UNEXPLAINED`] with the reason, and the
//! list is asserted exactly: a listed case that starts to pass fails the test as much as an
//! unlisted case that does not, so the list (and the score in the corpus README) stays the truth.

use std::path::{Path, PathBuf};

use serde_json::Value;
use weir_netdiag::doctor::{self, Status};
use weir_netdiag::state::NodeState;
use weir_netdiag::trace::{self, Packet, Proto, Verdict};

/// Cases the verdict does not name the cause of yet, and why.
const UNEXPLAINED: &[(&str, &str)] = &[
    (
        "aws-vpc-cni-231-eni-source-dest-check",
        "only rp_filter values were pasted (read now that /proc/sys paths become \
         net.ipv4.conf.* keys); no routes, so the verdict is unknown (`ip route show table \
         all` would settle it); the cause (the EC2 source/destination check on secondary ENIs) \
         is in the cloud, in no node dump",
    ),
    (
        "cilium-12098-eks-nodeport-reply-eni-rule",
        "one `ip rule` line and one mangle CONNMARK line were pasted, no kube-proxy DNAT rules \
         and no routes: the walk never reaches the pod, so the reply's policy rule 110 is not \
         consulted (unknown: `routing: cannot tell where 192.168.21.197 goes`)",
    ),
    (
        "k8s-36835-no-cluster-cidr-no-masquerade",
        "the stored paste stops before KUBE-SERVICES and the KUBE-SEP DNAT rules, so the \
         missing KUBE-MARK-MASQ jumps cannot be seen; no routes, so the verdict is unknown",
    ),
    (
        "k8s-48370-udp-conntrack-empty-endpoints",
        "`conntrack -L` is read now, but the one entry pasted (conntrack-L.txt, UDP to \
         10.15.240.10:53 not DNATed) comes with no proxy rules, so doctor's conntrack-nat \
         cannot tell 10.15.240.10 is a Service and skips; the earlier paste showing the same \
         tuple DNATed is a second snapshot (conntrack-L-before.txt), not read; and the trace \
         walks a new connection, unknown at routing (no routes)",
    ),
    (
        "k8s-55923-ipvs-nodeport-non-eth-nic",
        "the pasted `ipvsadm -ln` predates the NodePort Service, and without `ip addr` the \
         node's address is not local to the walk (unknown: no routes in the dump)",
    ),
    (
        "k8s-59976-ipvs-lb-ip-not-on-kube-ipvs0",
        "the stored copy cuts the `ipvsadm` paste after its header and no `ip addr` of \
         kube-ipvs0 or routes are in it, so nothing shows the LoadBalancer IP missing from \
         kube-ipvs0; with no routes the verdict is unknown",
    ),
    (
        "k8s-63479-hostnetwork-forward-drop",
        "the only paste is one iptables LOG line (kernel log, not read): no iptables-save, \
         routes or addresses, so the verdict is unknown at `output routing`",
    ),
    (
        "k8s-65158-ipvs-host-to-clusterip",
        "the `ip route show table local` paste is read into table local, but the VIP's own local \
         route is cut from the stored paste and table main was not pasted: the output lookup \
         is unknown (`no table main`), and does not take 10.200.10.10 on kube-ipvs0 (from \
         `ip addr`) as local",
    ),
    (
        "k8s-81635-forward-reject-rule-order",
        "only `ip route` and one `ip route get` (of a ClusterIP, not the walked packet) made it \
         into the stored copy, no iptables: the verdict is conditional on the missing \
         ip_forward (delivered when 1), and with no rules every policy is taken as ACCEPT, so \
         no branch can name the REJECT",
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

/// What the tool said about the case, and whether it names the cause (contains `expect`,
/// compared case-insensitively, in a drop/reject verdict or a failing/warning check).
struct Outcome {
    explained: bool,
    said: String,
}

fn run_trace(st: &NodeState, case: &Value, name: &str, expect: &str) -> Outcome {
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
    let packet = Packet {
        src: addr("from"),
        dst: addr("to"),
        proto,
        sport: 40000,
        dport: p["dport"]
            .as_u64()
            .and_then(|d| u16::try_from(d).ok())
            .unwrap_or_else(|| panic!("{name}: packet.dport")),
        iif: iif.into(),
    };
    let t = trace::trace(st, &packet);
    let cause = t.cause.clone().unwrap_or_default();
    // Only a definite drop or reject that names the cause counts: a conditional verdict is
    // "cannot tell from these files", even when one of its branches names it.
    let explained = matches!(t.verdict, Verdict::Dropped | Verdict::Rejected)
        && cause.to_lowercase().contains(&expect.to_lowercase());
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
    Outcome { explained, said }
}

fn run_doctor(st: &NodeState, expect: &str) -> Outcome {
    let checks = doctor::run_all(st, None);
    let want = expect.to_lowercase();
    let hits: Vec<String> = checks
        .iter()
        .filter(|c| matches!(c.status, Status::Fail | Status::Warn))
        .filter(|c| {
            let text = format!(
                "{} {} {} {}",
                c.id,
                c.title,
                c.evidence.join(" "),
                c.fix.as_deref().unwrap_or("")
            );
            text.to_lowercase().contains(&want)
        })
        .map(|c| format!("{} {}", c.status.label(), c.id))
        .collect();
    let summary: Vec<String> = checks
        .iter()
        .map(|c| format!("{} {}", c.status.label(), c.id))
        .collect();
    Outcome {
        explained: !hits.is_empty(),
        said: format!("{} (naming it: {:?})", summary.join(", "), hits),
    }
}

#[test]
fn tickets_corpus_verdicts_match_the_list_of_unexplained_cases() {
    let dirs = case_dirs();
    assert!(dirs.len() >= 12, "only {} cases", dirs.len());
    let names: Vec<String> = dirs.iter().map(|d| name_of(d)).collect();
    for (listed, why) in UNEXPLAINED {
        assert!(
            names.iter().any(|n| n == listed),
            "UNEXPLAINED names {listed}, which is not a case"
        );
        assert!(!why.is_empty(), "{listed}: no reason given");
    }

    let mut explained = 0;
    let mut mismatches = Vec::new();
    for dir in &dirs {
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
            "doctor" => run_doctor(&st, expect),
            other => panic!("{name}: tool {other}"),
        };
        let listed = UNEXPLAINED.iter().find(|(n, _)| *n == name);
        println!(
            "{name}: {} — {}\n  read {:?}, not read {:?}, skipped {} line(s)\n  {}",
            if outcome.explained {
                "explained"
            } else {
                "not explained"
            },
            url,
            st.present,
            ignored,
            st.skipped.len(),
            outcome.said
        );
        if outcome.explained {
            explained += 1;
        }
        match (outcome.explained, listed) {
            (true, Some(_)) => mismatches.push(format!(
                "{name} now names the cause ({expect:?}): move it out of UNEXPLAINED"
            )),
            (false, None) => mismatches.push(format!(
                "{name} does not name the cause ({expect:?}) and is not in UNEXPLAINED: {}",
                outcome.said
            )),
            _ => {}
        }
    }
    let score = format!("{explained} of {} explained", dirs.len());
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
