//! End-to-end tests of the NetworkPolicy lab (weir_lab::POLICY_TOPOLOGY, bridge mode, and
//! weir_lab::POLICY_ENI_TOPOLOGY, eni-shared mode): pods in three namespaces on two nodes,
//! five policies (a default deny, a podSelector+namespaceSelector allow, an ipBlock with an
//! except, an egress policy, an ipBlock for masqueraded NodePort traffic), `weir policy`,
//! `weir proxy` and the CNI on every node. Every row's EXPECTED is weir-policy's oracle on the
//! objects the lab wrote; the OBSERVED column is real TCP/UDP probes; one mismatch fails.
//! Then the policies are deleted: the oracle, reading the objects again, expects every row
//! allowed, and every row must now answer, so each denied row was the policy's drop and the
//! expectations follow the objects. Needs root, `ip` and `nft`.
//!
//! With the policies in force, `weir trace` is checked against the kernel on every pod→pod TCP
//! row (issue 29 item 4): each node's state is collected once (`weir trace collect`), the
//! row's packet is walked from the source pod's veth on its node (egress is judged there) and,
//! when it leaves for the other node, again there (ingress); trace's verdict must be the
//! row's OBSERVED one, a drop must be NetworkPolicy's naming a policy of the dropping pod's
//! namespace, and an allowed packet into (or out of) an isolated pod must name the policy
//! that allows it — both checked against the topology's own policies.
//!
//! Each test uses its own lab name (tag + pid) and state directory; a guard runs `weir lab down`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use weir_lab::state::LabState;
use weir_lab::topology::Topology;

mod common;
use common::*;

fn runnable_here() -> bool {
    weir_testkit::can_run(weir_testkit::missing(true, &["ip", "nft"]))
}

/// An embedded topology under this lab's name.
fn topology(lab: &Lab, text: &str, name: &str) -> std::path::PathBuf {
    let body = text.replacen(
        &format!("\nname: {name}\n"),
        &format!("\nname: {}\n", lab.name),
        1,
    );
    assert_ne!(body, text, "the topology names itself {name}");
    let path = lab.state.path().join("topology-input.yaml");
    std::fs::write(&path, body).unwrap();
    path
}

fn check(lab: &Lab) -> (bool, Vec<Value>) {
    let out = lab.weir(&["lab", "check", &lab.name, "--json"]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "check --json: {e}\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(
        json["policy_agents"]
            .as_array()
            .is_some_and(|a| a.len() == 2 && a.iter().all(|a| a["alive"] == true)),
        "{}",
        json["policy_agents"]
    );
    (
        out.status.success(),
        json["matrix"].as_array().unwrap().clone(),
    )
}

fn table(lab: &Lab) -> String {
    String::from_utf8_lossy(&lab.weir(&["lab", "check", &lab.name]).stdout).into_owned()
}

/// (kind, expected verdict) → how many rows.
fn count(rows: &[Value], kind: &str, verdict: &str) -> usize {
    rows.iter()
        .filter(|r| r["kind"] == kind && r["policy"] == verdict)
        .count()
}

/// The row from `from` (a pod, or the outside's address) to `to` over `proto`.
fn row<'a>(rows: &'a [Value], from: &str, to: &str, proto: &str) -> &'a Value {
    rows.iter()
        .find(|r| {
            (r["from"] == from || r["from_ip"] == from) && r["to"] == to && r["proto"] == proto
        })
        .unwrap_or_else(|| panic!("no row {from} -> {to} {proto}"))
}

/// Waits until no node's `table inet weir-policy` has a pod chain left (the agents followed
/// the deleted policies).
fn wait_unenforced(lab: &Lab) {
    let deadline = Instant::now() + weir_lab::startup_timeout(Duration::from_secs(20));
    for node in ["a", "b"] {
        loop {
            let out = lab.ok(&[
                "lab",
                "exec",
                &lab.name,
                node,
                "--",
                "nft",
                "list",
                "table",
                "inet",
                "weir-policy",
            ]);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            if !text.contains("chain ingress_") && !text.contains("chain egress_") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {node} still enforces:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn policy_lab(tag: &str, text: &str, name: &str, masquerade: &str) {
    if !runnable_here() {
        return;
    }
    weir_cni();
    let lab = Lab::new(tag);
    let topo = topology(&lab, text, name);
    lab.ok(&["lab", "up", topo.to_str().unwrap()]);
    let (ok, rows) = check(&lab);
    if !ok {
        eprintln!("{}", table(&lab));
    }
    for r in &rows {
        assert_eq!(r["ok"], true, "{r}");
        assert_eq!(r["observed"], r["policy"], "{r}");
    }
    assert!(ok);
    // Every kind the brief names has allowed and denied rows.
    for kind in [
        "same-node",
        "other-node",
        "own-node",
        "outside",
        "cluster-ip",
        "node-port",
    ] {
        assert!(count(&rows, kind, "allowed") > 0, "no allowed {kind} row");
        assert!(count(&rows, kind, "denied") > 0, "no denied {kind} row");
    }
    // A dual-stack lab: every row once per family, IPv6 with allowed and denied rows (the
    // Service rows after DNAT too).
    if text.contains("\nipv6:") {
        let v6 = |r: &&Value| r["to_ip"].as_str().is_some_and(|ip| ip.contains(':'));
        for verdict in ["allowed", "denied"] {
            for kind in ["same-node", "other-node", "cluster-ip", "node-port"] {
                assert!(
                    rows.iter()
                        .filter(v6)
                        .any(|r| r["kind"] == kind && r["policy"] == verdict),
                    "no {verdict} IPv6 {kind} row"
                );
            }
        }
    }
    // ipBlock except: web's NodePort answers the outside's own address, not the excepted one.
    assert_eq!(
        row(&rows, "198.51.100.1", "web via a", "tcp")["observed"],
        "allowed"
    );
    assert_eq!(
        row(&rows, "198.51.100.200", "web via a", "tcp")["observed"],
        "denied"
    );
    // Masquerade: through node a, db sees node a's address (allowed by db-from-nodes); on
    // node b itself, the policy saw the outside's address before the masquerade (denied).
    let via_a = row(&rows, "198.51.100.1", "dbnp via a", "tcp");
    assert_eq!(via_a["seen_source"], masquerade, "{via_a}");
    assert_eq!(
        row(&rows, "198.51.100.1", "dbnp via b", "tcp")["observed"],
        "denied"
    );
    // Egress: tool reaches the outside on TCP 8080 only.
    assert_eq!(row(&rows, "tool", "outside", "tcp")["observed"], "allowed");
    assert_eq!(row(&rows, "tool", "outside", "udp")["observed"], "denied");

    trace_agrees_on_pod_rows(&lab, text, &rows);

    // The policies deleted: the oracle now expects every row allowed, and every row answers.
    std::fs::remove_file(lab.lab_dir().join("manifests").join("policies.yaml")).unwrap();
    wait_unenforced(&lab);
    let (ok, open) = check(&lab);
    if !ok {
        eprintln!("{}", table(&lab));
    }
    assert_eq!(open.len(), rows.len());
    for r in &open {
        assert_eq!(
            (&r["policy"], &r["ok"]),
            (&"allowed".into(), &true.into()),
            "{r}"
        );
    }
    assert!(ok);
}

#[test]
fn policy_rows_pass_in_bridge_mode() {
    policy_lab("pol", weir_lab::POLICY_TOPOLOGY, "policy", "172.30.0.11");
}

/// The bridge lab dual-stack: every row twice, once per family. IPv6's neighbor discovery
/// is ICMPv6 (ARP is not IP), so a policy's drop can catch it: an egress-isolated pod that
/// cannot resolve its gateway reaches nothing over IPv6, allowed or not. The two ingress
/// ipBlocks gain their IPv6 twins (the underlay's, the outside's), so IPv6 NodePort rows
/// are allowed too.
#[test]
fn policy_rows_pass_in_dual_stack_bridge_mode() {
    let mut text = weir_lab::POLICY_TOPOLOGY.to_string();
    for (from, to) in [
        (
            "\nserviceCIDR: 10.96.0.0/16\n",
            "\nserviceCIDR: 10.96.0.0/16\nipv6: {}\n",
        ),
        (
            "[{ipBlock: {cidr: 172.30.0.0/24}}]",
            "[{ipBlock: {cidr: 172.30.0.0/24}}, {ipBlock: {cidr: 'fd00:172:30::/64'}}]",
        ),
        (
            "except: [198.51.100.128/25]}}]",
            "except: [198.51.100.128/25]}}, {ipBlock: {cidr: 'fd00:198:51:100::/64'}}]",
        ),
    ] {
        let edited = text.replacen(from, to, 1);
        assert_ne!(edited, text, "{from}");
        text = edited;
    }
    policy_lab("pol6", &text, "policy", "172.30.0.11");
}

#[test]
fn policy_rows_pass_in_eni_shared_mode() {
    policy_lab(
        "pole",
        weir_lab::POLICY_ENI_TOPOLOGY,
        "policyeni",
        "10.12.97.11",
    );
}

/// `ns/name` of every policy in the topology, and each pod's (namespace, labels).
struct Objects {
    policies: Vec<Value>,
    pods: BTreeMap<String, weir_lab::policy_spec::PodMeta>,
}

impl Objects {
    fn of(text: &str) -> Self {
        let t = Topology::parse(text).unwrap();
        Objects {
            policies: t.policies,
            pods: t.pod_metadata,
        }
    }

    fn names(&self) -> BTreeSet<String> {
        self.policies
            .iter()
            .map(|p| {
                let m = &p["metadata"];
                let ns = m["namespace"].as_str().unwrap_or("default");
                format!("{ns}/{}", m["name"].as_str().unwrap())
            })
            .collect()
    }

    fn namespace(&self, pod: &str) -> String {
        self.pods
            .get(pod)
            .map_or("default".into(), |m| m.namespace.clone())
    }

    /// Whether some policy selects `pod` for `direction` ("Ingress"/"Egress"): its namespace,
    /// a podSelector whose matchLabels the pod carries (the lab's policies use no
    /// matchExpressions), and the direction in policyTypes (absent: Ingress, plus Egress
    /// when the spec has egress rules, as Kubernetes defaults it).
    fn isolated(&self, pod: &str, direction: &str) -> bool {
        let meta = self.pods.get(pod).cloned().unwrap_or_default();
        let ns = self.namespace(pod);
        self.policies.iter().any(|p| {
            let spec = &p["spec"];
            let types: Vec<&str> = match spec["policyTypes"].as_array() {
                Some(t) => t.iter().filter_map(Value::as_str).collect(),
                None if spec.get("egress").is_some() => vec!["Ingress", "Egress"],
                None => vec!["Ingress"],
            };
            let labels = spec["podSelector"]["matchLabels"].as_object();
            p["metadata"]["namespace"].as_str().unwrap_or("default") == ns
                && types.contains(&direction)
                && labels.is_none_or(|l| {
                    l.iter()
                        .all(|(k, v)| meta.labels.get(k).map(String::as_str) == v.as_str())
                })
        })
    }
}

/// `ip -j link show` in a namespace.
fn links(netns: &str) -> Vec<Value> {
    let out = Command::new("ip")
        .args(["-n", netns, "-j", "link", "show"])
        .output()
        .unwrap();
    assert!(out.status.success(), "ip -n {netns} link");
    serde_json::from_slice::<Value>(&out.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

/// The node-side veth of a pod: the node's interface whose index the pod's eth0 names as its
/// peer.
fn host_veth(node_ns: &str, pod_ns: &str) -> String {
    let eth0 = links(pod_ns)
        .into_iter()
        .find(|l| l["ifname"] == "eth0")
        .unwrap();
    let peer = eth0["link_index"].as_u64().unwrap();
    links(node_ns)
        .into_iter()
        .find(|l| l["ifindex"].as_u64() == Some(peer))
        .and_then(|l| l["ifname"].as_str().map(str::to_string))
        .unwrap_or_else(|| panic!("no veth of {pod_ns} in {node_ns}"))
}

/// `weir trace --json` of a TCP packet on a collected directory: the `trace` object.
fn walk(lab: &Lab, dir: &Path, from: &str, iif: &str, to: &str, dport: &str) -> Value {
    let out = lab.weir(&[
        "trace",
        "--json",
        "--from",
        from,
        "--iif",
        iif,
        "--to",
        to,
        "--dport",
        dport,
        "--proto",
        "tcp",
        dir.to_str().unwrap(),
    ]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "weir trace --json: {e}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    v["trace"].clone()
}

/// What trace said of one row: its verdict ("allowed"/"denied"), every policy decision on
/// the way (all legs), and the trace's cause when it was not delivered.
struct Traced {
    verdict: &'static str,
    decisions: Vec<Value>,
    cause: String,
}

/// Walks a pod→pod row: on the source pod's node from its veth, and, if the packet leaves
/// for the destination's node, there from the underlay (bridge: eth0; eni: the ENI, eth1).
fn trace_row(lab: &Lab, state: &LabState, dirs: &BTreeMap<String, PathBuf>, r: &Value) -> Traced {
    let pod = |name: &str| state.pods.iter().find(|p| p.name == name).unwrap().clone();
    let (src, dst) = (
        pod(r["from"].as_str().unwrap()),
        pod(r["to"].as_str().unwrap()),
    );
    let node_ns = |n: &str| {
        state
            .nodes
            .iter()
            .find(|x| x.name == n)
            .unwrap()
            .netns
            .clone()
    };
    let port = r["port"].to_string();
    let (from, to) = (src.ip.to_string(), dst.ip.to_string());
    let mut iif = host_veth(&node_ns(&src.node), &src.netns);
    let mut node = src.node.clone();
    let mut decisions = Vec::new();
    loop {
        let t = walk(lab, &dirs[&node], &from, &iif, &to, &port);
        decisions.extend(t["policy"].as_array().cloned().unwrap_or_default());
        if t["verdict"] != "delivered" {
            let verdict = if t["verdict"] == "dropped" {
                "denied"
            } else {
                "other"
            };
            let cause = format!("{}: {}", t["verdict"], t["cause"].as_str().unwrap_or(""));
            return Traced {
                verdict,
                decisions,
                cause,
            };
        }
        if node == dst.node {
            let cause = String::new();
            return Traced {
                verdict: "allowed",
                decisions,
                cause,
            };
        }
        node = dst.node.clone();
        iif = match state.network {
            weir_lab::Network::Eni => "eth1".into(),
            _ => "eth0".into(),
        };
    }
}

/// What is wrong with trace's account of a row (None: nothing): its verdict against the
/// kernel's, and the policies it names against the topology's.
fn judge(r: &Value, t: &Traced, objs: &Objects) -> Option<String> {
    let known = objs.names();
    let (from, to) = (r["from"].as_str().unwrap(), r["to"].as_str().unwrap());
    if r["observed"] != t.verdict {
        return Some(format!("verdict {} ({})", t.verdict, t.cause));
    }
    if t.verdict == "denied" {
        let Some(d) = t.decisions.iter().find(|d| d["verdict"] == "dropped") else {
            return Some(format!("dropped, but by no policy: {}", t.cause));
        };
        // The dropping pod: the destination for ingress, the source for egress.
        let pod = if d["direction"] == "ingress" {
            to
        } else {
            from
        };
        let ns = objs.namespace(pod);
        let names_one = d["isolated_by"].as_array().is_some_and(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .any(|n| known.contains(n) && n.starts_with(&format!("{ns}/")))
        });
        let right_pod = d["pod"].as_str() == Some(&format!("{ns}/{pod}"));
        return (!names_one || !right_pod).then(|| format!("drop names {d}"));
    }
    for (direction, kind, pod) in [("ingress", "Ingress", to), ("egress", "Egress", from)] {
        if !objs.isolated(pod, kind) {
            continue;
        }
        let allowed = t
            .decisions
            .iter()
            .find(|d| d["direction"] == direction && d["verdict"] == "allowed");
        match allowed.and_then(|d| d["allowed_by"].as_str()) {
            Some(p) if known.contains(p) => {}
            _ => {
                return Some(format!(
                    "{direction} of isolated {pod}: no known policy allows it"
                ))
            }
        }
    }
    None
}

/// The policy named by trace's decisive decision, for the table.
fn named(t: &Traced) -> String {
    t.decisions
        .iter()
        .filter_map(|d| match d["verdict"].as_str()? {
            "dropped" => Some(format!(
                "{} isolated by {}",
                d["direction"].as_str()?,
                d["isolated_by"]
            )),
            "allowed" => Some(format!(
                "{} by {}",
                d["direction"].as_str()?,
                d["allowed_by"].as_str()?
            )),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Collects each node's state once and checks trace on every pod→pod TCP row.
fn trace_agrees_on_pod_rows(lab: &Lab, text: &str, rows: &[Value]) {
    let state = LabState::load(&lab.lab_dir().join("state.json")).unwrap();
    let objs = Objects::of(text);
    let collected = tempfile::tempdir().unwrap();
    let mut dirs = BTreeMap::new();
    for n in &state.nodes {
        let dir = collected.path().join(&n.name);
        let d = dir.to_str().unwrap();
        lab.ok(&["trace", "collect", d, "--netns", &n.netns]);
        dirs.insert(n.name.clone(), dir);
    }
    let pod_rows: Vec<&Value> = rows
        .iter()
        .filter(|r| (r["kind"] == "same-node" || r["kind"] == "other-node") && r["proto"] == "tcp")
        .collect();
    assert!(
        pod_rows.iter().any(|r| r["observed"] == "denied"),
        "no denied pod row"
    );
    assert!(
        pod_rows.iter().any(|r| r["observed"] == "allowed"),
        "no allowed pod row"
    );
    let mut table = Vec::new();
    let mut bad = 0;
    for r in pod_rows {
        let t = trace_row(lab, &state, &dirs, r);
        let wrong = judge(r, &t, &objs);
        bad += usize::from(wrong.is_some());
        table.push(format!(
            "{:<10} {:>5} -> {:<5} kernel {:<8} trace {:<8} {} {}",
            r["kind"].as_str().unwrap(),
            r["from"].as_str().unwrap(),
            r["to"].as_str().unwrap(),
            r["observed"].as_str().unwrap_or("?"),
            t.verdict,
            named(&t),
            wrong
                .map(|w| format!("  <- WRONG: {w}"))
                .unwrap_or_default()
        ));
    }
    eprintln!("trace vs kernel:\n{}", table.join("\n"));
    assert_eq!(bad, 0, "trace disagrees:\n{}", table.join("\n"));
}
