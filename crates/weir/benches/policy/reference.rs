//! weir policy beside SIG Network's reference, sigs.k8s.io/kube-network-policies, on one real
//! cluster (scripts/cluster/up.sh: Kubernetes of the pinned build, weir as CNI, proxy, routes
//! and DNS): node-1 runs `weir policy`, node-2 kube-network-policies, fed by the same API
//! server and the same objects. Each node holds a client pod and a server pod; the bench
//! serves and connects from inside the pods' network namespaces.
//!
//! * Change latency, per node: the API write (request sent) → the first new connection the
//!   change denies (a prober connects every half millisecond; the first attempt not answered
//!   within 100 ms marks the flip). A policy change (one write, both nodes at once) and a pod
//!   label change (each node's client relabelled by its own write); each change is undone and
//!   the path seen open again before the next, spaced past weir's --min-sync-period.
//! * Per-connection cost, per node: conn/s between its two pods with 1,000 policies selecting
//!   them (cluster::bench_policies, every one allowing the connection) vs none selecting them,
//!   A B A B; each state written through the API and seen in both nodes' rules first.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::cluster::{self, Shape, CLIENT_NS, CONN_PORT, SERVER_NS};
use crate::kubeapi::{KubeApi, Write};
use crate::world::{in_ns, sh, sh_with_input};
use crate::{median, memory_mib, ms, progress, Settings};

/// One node's pair of pods and who enforces there.
struct Pair {
    node: &'static str,
    who: &'static str,
    node_ns: String,
    client: String,
    client_ns: String,
    server_ns: String,
    target: SocketAddr,
}

#[derive(Default)]
pub struct Figures {
    pub who: &'static str,
    pub policy_change_ms: Vec<f64>,
    pub pod_change_ms: Vec<f64>,
    pub conn_none: Vec<f64>,
    pub conn_policies: Vec<f64>,
    pub conn_ratio: Vec<f64>,
    pub failed: u64,
    pub rss_mib: f64,
}

/// The cluster, torn down on drop.
struct Up {
    root: PathBuf,
    run: PathBuf,
    /// After a failure: the processes' logs stay in `run`.
    keep_logs: bool,
}

impl Up {
    fn start(root: &Path, bin_dir: &Path) -> Result<Up, String> {
        let name = format!("pb{}", std::process::id() % 100_000);
        let run = std::env::temp_dir().join(format!("weir-policy-bench-{name}"));
        let mut up = Up {
            root: root.to_path_buf(),
            run,
            keep_logs: false,
        };
        up.down();
        let _ = std::fs::remove_dir_all(&up.run);
        std::fs::create_dir_all(&up.run).map_err(|e| e.to_string())?;
        let log = std::fs::File::create(up.run.join("up.log")).map_err(|e| e.to_string())?;
        let status = Command::new("bash")
            .arg(root.join("scripts/cluster/up.sh"))
            .args([&name, &up.run.display().to_string()])
            .env("WEIR_BIN", bin_dir)
            .env("WEIR_POLICIES", "weir kube-network-policies")
            .stdout(Stdio::null())
            .stderr(log)
            .status()
            .map_err(|e| e.to_string())?;
        if !status.success() {
            up.keep_logs = true;
            let log = std::fs::read_to_string(up.run.join("up.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            return Err(format!(
                "up.sh failed:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            ));
        }
        Ok(up)
    }

    fn env(&self, key: &str) -> Result<String, String> {
        let text = std::fs::read_to_string(self.run.join("env")).map_err(|e| e.to_string())?;
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .map(|v| v.trim_matches('"').to_string())
            .ok_or(format!("{key} not in the cluster's env"))
    }

    fn kubectl(&self, args: &str, input: &str) -> Result<String, String> {
        sh_with_input(
            &format!("{} {args}", self.run.join("kubectl").display()),
            input,
        )
    }

    fn pid(&self, process: &str) -> Result<u32, String> {
        let p = self.run.join(format!("{process}.pid"));
        std::fs::read_to_string(&p)
            .map_err(|e| format!("{}: {e}", p.display()))?
            .trim()
            .parse()
            .map_err(|e| format!("{}: {e}", p.display()))
    }

    fn down(&self) {
        let _ = Command::new("bash")
            .arg(self.root.join("scripts/cluster/down.sh"))
            .arg(&self.run)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        self.down();
        if !self.keep_logs {
            let _ = std::fs::remove_dir_all(&self.run);
        }
    }
}

fn pods_yaml() -> String {
    let mut y = String::new();
    for (ns, role) in [(CLIENT_NS, "client"), (SERVER_NS, "server")] {
        y += &format!(
            "---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}, labels: {{role: {role}}}}}\n"
        );
    }
    for n in 1..=2 {
        for (ns, app) in [(CLIENT_NS, "client"), (SERVER_NS, "server")] {
            y += &format!(
                "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {app}-{n}, namespace: {ns}, labels: {{app: {app}}}}}\n\
                 spec: {{nodeName: node-{n}, terminationGracePeriodSeconds: 1, containers: [{{name: c, \
                 image: localhost/weir/busybox:1.35, imagePullPolicy: Never, command: [/bin/busybox, sleep, '1000000']}}]}}\n"
            );
        }
    }
    y
}

/// The network namespace (under /run/netns) holding `ip` on its eth0: the pod's.
fn netns_of(ip: &str) -> Result<String, String> {
    let dir = std::fs::read_dir("/run/netns").map_err(|e| e.to_string())?;
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("cni-") {
            continue;
        }
        if sh(&format!("ip -n {name} -4 -o addr show dev eth0"))
            .is_ok_and(|out| out.contains(&format!("inet {ip}/")))
        {
            return Ok(name);
        }
    }
    Err(format!("no network namespace holds {ip}"))
}

fn pairs(up: &Up) -> Result<Vec<Pair>, String> {
    up.kubectl("apply -f -", &pods_yaml())?;
    up.kubectl(
        &format!(
            "wait --for=condition=Ready --timeout=180s -n {CLIENT_NS} pod/client-1 pod/client-2"
        ),
        "",
    )?;
    up.kubectl(
        &format!(
            "wait --for=condition=Ready --timeout=180s -n {SERVER_NS} pod/server-1 pod/server-2"
        ),
        "",
    )?;
    let node_ns: Vec<String> = up.env("NODE_NS")?.split(' ').map(String::from).collect();
    let ip = |ns: &str, pod: &str| {
        up.kubectl(
            &format!("get pod -n {ns} {pod} -o jsonpath={{.status.podIP}}"),
            "",
        )
        .map(|s| s.trim().to_string())
    };
    let mut v = Vec::new();
    for (i, (node, who)) in [("node-1", "weir"), ("node-2", "kube-network-policies")]
        .into_iter()
        .enumerate()
    {
        let n = i + 1;
        let server_ip = ip(SERVER_NS, &format!("server-{n}"))?;
        v.push(Pair {
            node,
            who,
            node_ns: node_ns[i].clone(),
            client: format!("client-{n}"),
            client_ns: netns_of(&ip(CLIENT_NS, &format!("client-{n}"))?)?,
            server_ns: netns_of(&server_ip)?,
            target: format!("{server_ip}:{CONN_PORT}")
                .parse()
                .map_err(|e| format!("{e}"))?,
        });
    }
    Ok(v)
}

pub fn run(s: &Settings, root: &Path) -> Result<Vec<Figures>, String> {
    let bin_dir = s.bin.parent().ok_or("WEIR_BIN has no directory")?;
    progress("the real cluster: node-1 weir policy, node-2 kube-network-policies (up.sh)");
    let mut up = Up::start(root, bin_dir)?;
    measure(s, &up).map_err(|e| {
        up.keep_logs = true;
        format!("{e} (the cluster's logs: {})", up.run.display())
    })
}

fn measure(s: &Settings, up: &Up) -> Result<Vec<Figures>, String> {
    let pairs = pairs(up)?;
    let api = KubeApi::connect(&up.env("CP_NS")?, &up.run.join("kubeconfig"))?;
    let _servers: Vec<_> = pairs
        .iter()
        .map(|p| crate::conn::Server::start(&p.server_ns, CONN_PORT))
        .collect::<Result<_, _>>()?;
    let mut figures: Vec<Figures> = pairs
        .iter()
        .map(|p| Figures {
            who: p.who,
            ..Default::default()
        })
        .collect();
    change_latency(s, &api, &pairs, &mut figures)?;
    conn_rates(s, &api, &pairs, &mut figures)?;
    figures[0].rss_mib = memory_mib(up.pid("node-1-policy")?)?.0;
    figures[1].rss_mib = memory_mib(up.pid("node-2-netpol")?)?.0;
    Ok(figures)
}

/// Whether a new connection from `p`'s client to its server is answered within `timeout`.
fn answered(p: &Pair, timeout: Duration) -> bool {
    let target = p.target;
    in_ns(&p.client_ns, || {
        std::net::TcpStream::connect_timeout(&target, timeout)
            .map(|s| weir_proxy::userspace::serve::reset_on_close(&s))
            .is_ok()
    })
}

/// Waits until `p`'s path is open (each attempt 100 ms, up to 60 s).
fn until_open(p: &Pair) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !answered(p, Duration::from_millis(100)) {
        if Instant::now() > deadline {
            return Err(format!("{}: the path never opened", p.node));
        }
        thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// A prober from `p`'s client: connects every half millisecond until an attempt is not
/// answered within 100 ms, and sends when that attempt started (or an error after 30 s).
fn prober(p: &Pair) -> mpsc::Receiver<Result<Instant, String>> {
    let (tx, rx) = mpsc::channel();
    let (ns, target, node) = (p.client_ns.clone(), p.target, p.node);
    thread::spawn(move || {
        in_ns(&ns, || {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let at = Instant::now();
                match std::net::TcpStream::connect_timeout(&target, Duration::from_millis(100)) {
                    Ok(s) => weir_proxy::userspace::serve::reset_on_close(&s),
                    Err(_) => {
                        let _ = tx.send(Ok(at));
                        return;
                    }
                }
                if at > deadline {
                    let _ = tx.send(Err(format!("{node}: never denied")));
                    return;
                }
                thread::sleep(Duration::from_micros(500));
            }
        })
    });
    rx
}

/// A policy that isolates the servers and one that lets the clients in on `port`.
fn gate_policies(port: u16) -> Vec<serde_json::Value> {
    let meta = |name: &str| json!({"name": name, "namespace": SERVER_NS});
    vec![
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta("deny"),
               "spec": {"podSelector": {"matchLabels": {"app": "server"}}, "policyTypes": ["Ingress"]}}),
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta("gate"),
               "spec": {"podSelector": {"matchLabels": {"app": "server"}}, "policyTypes": ["Ingress"],
                        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"role": "client"}},
                                               "podSelector": {"matchLabels": {"app": "client"}}}],
                                     "ports": [{"protocol": "TCP", "port": port}]}]}}),
    ]
}

fn gate_port(port: u16) -> Write {
    Write::PatchPolicy(
        SERVER_NS.into(),
        "gate".into(),
        json!({"spec": {"ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"role": "client"}},
                                               "podSelector": {"matchLabels": {"app": "client"}}}],
                                     "ports": [{"protocol": "TCP", "port": port}]}]}}),
    )
}

fn client_app(client: &str, app: &str) -> Write {
    Write::PatchPod(
        CLIENT_NS.into(),
        client.into(),
        json!({"metadata": {"labels": {"app": app}}}),
    )
}

/// Writes `w` while `which` pairs are probed; each one's flip after the request was sent, in
/// ms.
fn timed_flip(api: &KubeApi, pairs: &[&Pair], w: Write) -> Result<Vec<f64>, String> {
    let probers: Vec<_> = pairs.iter().map(|p| prober(p)).collect();
    // The probers' first attempts are under way before the write.
    thread::sleep(Duration::from_millis(20));
    let (sent, _) = api.write(w)?;
    probers
        .into_iter()
        .map(|rx| {
            let at = rx.recv().map_err(|_| "prober died".to_string())??;
            Ok(ms(at.saturating_duration_since(sent)))
        })
        .collect()
}

fn change_latency(
    s: &Settings,
    api: &KubeApi,
    pairs: &[Pair],
    figures: &mut [Figures],
) -> Result<(), String> {
    progress(format!(
        "change → verdict flips on each node: {} policy changes, {} pod label changes",
        s.changes, s.changes
    ));
    let (_, mut last_write) = api.write(Write::Create(gate_policies(CONN_PORT)))?;
    for p in pairs {
        until_open(p)?;
    }
    // Every write reaches weir on node-1 (both clients are peers of its server's rule), which
    // syncs it at most --min-sync-period (1 s) after its previous sync: 2.5 s after the last
    // write, that sync is over a second old and a new change is synced at once.
    let space = |last: Instant| {
        thread::sleep(
            (last + Duration::from_millis(2500)).saturating_duration_since(Instant::now()),
        )
    };
    for k in 0..s.changes {
        space(last_write);
        let all: Vec<&Pair> = pairs.iter().collect();
        let flips = timed_flip(api, &all, gate_port(CONN_PORT + 2))?;
        for (f, ms) in figures.iter_mut().zip(flips) {
            f.policy_change_ms.push(ms);
        }
        last_write = api.write(gate_port(CONN_PORT))?.1;
        pairs.iter().try_for_each(until_open)?;
        for (i, p) in pairs.iter().enumerate() {
            space(last_write);
            let flip = timed_flip(api, &[p], client_app(&p.client, "other"))?;
            figures[i].pod_change_ms.push(flip[0]);
            last_write = api.write(client_app(&p.client, "client"))?.1;
            until_open(p)?;
        }
        progress(format!(
            "  change {}/{}: policy {}, pod {}",
            k + 1,
            s.changes,
            figures
                .iter()
                .map(|f| format!("{} {:.1} ms", f.who, f.policy_change_ms[k]))
                .collect::<Vec<_>>()
                .join(", "),
            figures
                .iter()
                .map(|f| format!("{} {:.1} ms", f.who, f.pod_change_ms[k]))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    for ns in [CLIENT_NS, SERVER_NS] {
        api.write(Write::DeletePolicies(ns.into()))?;
    }
    Ok(())
}

/// Whether each node's rules show `selected` (the bench pods in the 1,000 policies) or not.
fn converged(pairs: &[Pair], count: usize, selected: bool) -> bool {
    pairs.iter().all(|p| {
        let rules = if p.who == "weir" {
            let chain = format!("ingress_{SERVER_NS}/server-1");
            let out = sh(&format!(
                "ip netns exec {} nft list chain inet weir-policy {chain} 2>/dev/null || true",
                p.node_ns
            ))
            .unwrap_or_default();
            out.matches(&format!("comment \"{SERVER_NS}/ingress-")).count() == count / 2
        } else {
            let out = sh(&format!(
                "ip netns exec {} nft list set inet kube-network-policies podips-v4 2>/dev/null || true",
                p.node_ns
            ))
            .unwrap_or_default();
            out.contains(&p.target.ip().to_string())
        };
        rules == selected
    })
}

fn set_policies(api: &KubeApi, pairs: &[Pair], count: usize, on: bool) -> Result<(), String> {
    if on {
        api.write(Write::Create(cluster::bench_policies(
            count,
            Shape::AllAllow,
        )))?;
    } else {
        for ns in [CLIENT_NS, SERVER_NS] {
            api.write(Write::DeletePolicies(ns.into()))?;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while !converged(pairs, count, on) {
        if Instant::now() > deadline {
            return Err(format!(
                "the nodes' rules never showed policies {}",
                if on { "on" } else { "off" }
            ));
        }
        thread::sleep(Duration::from_millis(200));
    }
    // kube-network-policies judges each packet against its informers: let the last of the
    // objects reach them too.
    thread::sleep(Duration::from_secs(2));
    Ok(())
}

fn conn_rates(
    s: &Settings,
    api: &KubeApi,
    pairs: &[Pair],
    figures: &mut [Figures],
) -> Result<(), String> {
    progress(format!(
        "conn/s on each node, {} policies vs none, {} rounds",
        s.conn_policies, s.rounds
    ));
    let mut state = false;
    for round in 0..s.rounds {
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        let mut rates = vec![[0.0f64; 2]; pairs.len()];
        for on in order {
            // A B, B A, A B, ...: each state is written once per change of state.
            if round == 0 || on != state {
                set_policies(api, pairs, s.conn_policies, on)?;
                state = on;
            }
            for (i, p) in pairs.iter().enumerate() {
                sh(&format!(
                    "ip netns exec {} conntrack -F 2>/dev/null || true",
                    p.node_ns
                ))?;
                let (rate, failed) =
                    crate::conn::rate(&p.client_ns, p.target, s.clients, s.seconds);
                rates[i][on as usize] = rate;
                figures[i].failed += failed;
            }
        }
        for (f, r) in figures.iter_mut().zip(&rates) {
            f.conn_none.push(r[0]);
            f.conn_policies.push(r[1]);
            f.conn_ratio.push(r[1] / r[0]);
        }
        progress(format!(
            "  round {}/{}: {}",
            round + 1,
            s.rounds,
            figures
                .iter()
                .zip(&rates)
                .map(|(f, r)| format!(
                    "{} {:.0} vs {:.0} conn/s ({:.3})",
                    f.who,
                    r[1],
                    r[0],
                    r[1] / r[0]
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    set_policies(api, pairs, s.conn_policies, false)
}

impl Figures {
    pub fn summary(&self) -> (f64, f64, f64) {
        let changes: Vec<f64> = self
            .policy_change_ms
            .iter()
            .chain(&self.pod_change_ms)
            .copied()
            .collect();
        (median(&changes), median(&self.conn_ratio), self.rss_mib)
    }
}

/// Prints the cluster's table; returns what the bench line gains.
pub fn print(s: &Settings, figures: &[Figures]) -> String {
    let cell = |v: f64| {
        if !v.is_finite() {
            "—".into()
        } else if v >= 100.0 || v.fract() == 0.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.2}")
        }
    };
    let row = |name: &str, f: &dyn Fn(&Figures) -> f64| {
        let (a, b) = (f(&figures[0]), f(&figures[1]));
        println!("| {name} | {} | {} | {} |", cell(a), cell(b), cell(a / b));
    };
    println!(
        "\nThe real cluster: node-1 weir policy, node-2 kube-network-policies (medians; changes: API \
         write sent → the first new connection denied)\n"
    );
    println!("| figure | weir policy | kube-network-policies | weir / kube-network-policies |\n|---|---:|---:|---:|");
    row("policy change → denied, ms", &|f| {
        median(&f.policy_change_ms)
    });
    row("pod label change → denied, ms", &|f| {
        median(&f.pod_change_ms)
    });
    row("conn/s, no policy selecting the pods", &|f| {
        median(&f.conn_none)
    });
    row(
        &format!("conn/s, {} policies selecting them", s.conn_policies),
        &|f| median(&f.conn_policies),
    );
    row("ratio (median per round)", &|f| median(&f.conn_ratio));
    row("agent RSS MiB (small cluster)", &|f| f.rss_mib);
    row("failed connection attempts", &|f| f.failed as f64);
    let (w_change, w_ratio, _) = figures[0].summary();
    let (k_change, k_ratio, k_rss) = figures[1].summary();
    format!(
        " weir_cluster_change_ms={w_change:.2} weir_cluster_conn_ratio={w_ratio:.3} \
         kube-network-policies_change_ms={k_change:.2} kube-network-policies_conn_ratio={k_ratio:.3} \
         kube-network-policies_rss_mib={k_rss:.1}"
    )
}
