//! `weir policy` at scale, end to end (root only): the release binary in a network namespace
//! of its own, reading weir's fake Kubernetes API server (crates/fakeapi) on that namespace's
//! loopback as it reads a real one in production. The cluster: 1,000 namespaces, 10,000 pods,
//! 10,000 NetworkPolicies (cluster.rs), the pods spread over `WEIR_BENCH_NODES` nodes (default
//! 100); the agent enforces node-0's share. Measured:
//!
//! * full sync: spawn → the first nf_tables commit in the node's namespace (the kernel's own
//!   `NEWGEN` notification, generations.rs), with the agent's own plan + nft time beside it;
//! * one pod label change and one policy change → rules: the object written to the API server
//!   → the commit (medians; each change is checked to have been one diff sync); the agent's own
//!   change → rules figure (its network-programming histogram) beside it;
//! * the agent's RSS after the first sync and after the changes, and an idle agent's (no
//!   objects) for what the objects add;
//! * new connections per second between two pods on veths through the node's forward path,
//!   with 1,000 policies selecting them and allowing the connection vs no policy table: A B A B,
//!   conntrack flushed before each, the median of the per-round ratios. Two shapes: every
//!   policy allows it (the first rule matches) and only the last in chain order does (the
//!   first packet walks every rule of both pods' chains).
//!
//! ```sh
//! bash scripts/dev.sh policy-bench   # = cargo build --release -p weir && cargo bench -p weir --bench policy
//! ```
//!
//! Environment: `WEIR_BIN` (default `target/release/weir`), `WEIR_BENCH_NODES` (100),
//! `WEIR_BENCH_CHANGES` (changes of each kind, 15), `WEIR_BENCH_CONN_POLICIES` (1000),
//! `WEIR_BENCH_ROUNDS` (A B rounds, 10), `WEIR_BENCH_SECONDS` (per measurement, 2),
//! `WEIR_BENCH_CLIENTS` (connecting threads, 2), `WEIR_BENCH_AGENT_LOG` (a path: the agent's
//! log, with its debug lines, is copied there after the changes), `WEIR_BENCH_CLUSTER=1` (then the real
//! cluster beside kube-network-policies too: reference.rs), `WEIR_BENCH_NODE=0` (only that).
//! Prints tables and a last line `policy full_ms=… change_ms=… conn_ratio=… rss_mib=…`
//! (`kube-network-policies_change_ms=…` and the rest with the cluster). Nothing is asserted.

mod cluster;
mod conn;
mod generations;
mod kubeapi;
mod reference;
mod world;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use cluster::Shape;
use generations::Generations;
use weir_fakeapi::FakeApi;
use world::{metric, World};

const METRICS_PORT: u16 = 10258;
const TABLE: &str = "inet weir-policy";
/// How the bench policies' rules are commented in the table (`ns/policy`).
const CLIENT_RULES: &str = "comment \"bench-client/egress-";
const SERVER_RULES: &str = "comment \"bench-server/ingress-";

fn progress(msg: impl AsRef<str>) {
    eprintln!("[policy-bench] {}", msg.as_ref());
}

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} must be a number"))
        })
        .unwrap_or(default)
}

struct Settings {
    bin: PathBuf,
    nodes: usize,
    changes: usize,
    conn_policies: usize,
    rounds: usize,
    seconds: Duration,
    clients: usize,
}

impl Settings {
    fn from_env() -> Settings {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        Settings {
            bin: std::env::var_os("WEIR_BIN")
                .map(PathBuf::from)
                .unwrap_or_else(|| workspace.join("target/release/weir")),
            nodes: env_num("WEIR_BENCH_NODES", 100).max(1),
            changes: env_num("WEIR_BENCH_CHANGES", 15).max(1),
            conn_policies: env_num("WEIR_BENCH_CONN_POLICIES", 1000).max(2),
            rounds: env_num("WEIR_BENCH_ROUNDS", 10).max(1),
            seconds: Duration::from_secs(env_num("WEIR_BENCH_SECONDS", 2).max(1) as u64),
            clients: env_num("WEIR_BENCH_CLIENTS", 2).max(1),
        }
    }
}

/// The agent process (killed on drop; its table stays, as after a crash) and its log.
struct Agent {
    child: Child,
    log: PathBuf,
}

impl Agent {
    fn spawn(s: &Settings, w: &World, api: &FakeApi, log: PathBuf) -> Result<Agent, String> {
        let file = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let child = Command::new("ip")
            .args(["netns", "exec", &w.node()])
            .arg(&s.bin)
            .args([
                "policy",
                "--master",
                &api.url(),
                "--node-name",
                cluster::NODE,
            ])
            .arg(format!("--metrics-bind-address=127.0.0.1:{METRICS_PORT}"))
            // The per-change planning time is a debug line.
            .env("RUST_LOG", "info,weir_policy=debug")
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .map_err(|e| format!("{}: {e}", s.bin.display()))?;
        Ok(Agent { child, log })
    }

    /// `ip netns exec` execs weir: the child's pid is the agent's.
    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A numeric `field=value` of the last log line containing `marker` (NaN if none).
    fn last_field(&self, marker: &str, field: &str) -> f64 {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let Some(line) = text.lines().rev().find(|l| l.contains(marker)) else {
            return f64::NAN;
        };
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(field)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    }

    fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// (VmRSS, VmHWM) in MiB.
fn memory_mib(pid: u32) -> Result<(f64, f64), String> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| e.to_string())?;
    let get = |name: &str| -> Result<f64, String> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map(|kib| kib / 1024.0)
            .ok_or(format!("{name} missing"))
    };
    Ok((get("VmRSS:")?, get("VmHWM:")?))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Median of the finite samples (NaN when there are none).
fn median(samples: &[f64]) -> f64 {
    let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this binary without it,
    // and a minutes-long benchmark has no place in the test suite.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let s = Settings::from_env();
    if let Some(m) = weir_testkit::missing(true, &["ip", "nft", "conntrack", "sysctl"]) {
        eprintln!("policy bench: missing {m}");
        std::process::exit(2);
    }
    if !s.bin.exists() {
        eprintln!(
            "{} missing (cargo build --release -p weir)",
            s.bin.display()
        );
        std::process::exit(2);
    }
    let mut line = String::from("policy");
    if std::env::var("WEIR_BENCH_NODE").map_or(true, |v| v != "0") {
        let report = run(&s).unwrap_or_else(|e| {
            eprintln!("policy bench failed: {e}");
            std::process::exit(1);
        });
        line = report.print(&s);
    }
    if std::env::var("WEIR_BENCH_CLUSTER").is_ok_and(|v| v == "1") {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        match reference::run(&s, &root) {
            Ok(figures) => line += &reference::print(&s, &figures),
            Err(e) => {
                eprintln!("the cluster comparison failed: {e}");
                println!("\n{line}");
                std::process::exit(1);
            }
        }
    } else {
        progress("WEIR_BENCH_CLUSTER=1 adds kube-network-policies on the real cluster (dev.sh policy-bench)");
    }
    println!("\n{line}");
}

#[derive(Default)]
struct Report {
    idle_rss_mib: f64,
    local_pods: f64,
    chains: f64,
    rules: f64,
    full_ms: f64,
    full_own_ms: f64,
    full_plan_ms: f64,
    full_nft_ms: f64,
    rss_first_mib: f64,
    rss_mib: f64,
    hwm_mib: f64,
    pod: Changes,
    policy: Changes,
    conn: Conn,
}

#[derive(Default)]
struct Changes {
    /// API write → commit.
    wall_ms: Vec<f64>,
    /// The agent's own: the change reaching it → rules in the kernel.
    own_ms: Vec<f64>,
    /// Of which planning (from scratch) and the nft transaction, from its log.
    /// The change waiting in the source before the loop took it.
    queued_ms: Vec<f64>,
    plan_ms: Vec<f64>,
    nft_ms: Vec<f64>,
}

#[derive(Default)]
struct Conn {
    none: Vec<f64>,
    unselected: Vec<f64>,
    all: Vec<f64>,
    last: Vec<f64>,
    failed: u64,
    rules_walked: usize,
}

fn run(s: &Settings) -> Result<Report, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let w = World::create()?;
    let gens = Generations::watch(&w.node())?;
    let api = FakeApi::start(Some(&w.node()), "127.0.0.1:6443".parse().expect("addr"))
        .map_err(|e| format!("fake API server: {e:#}"))?;
    let mut r = Report::default();

    progress("an idle agent (no objects)");
    {
        let agent = Agent::spawn(s, &w, &api, dir.path().join("idle.log"))?;
        gens.next(Duration::from_secs(60))
            .map_err(|e| format!("idle agent: {e}: {}", agent.tail()))?;
        thread::sleep(Duration::from_millis(500));
        r.idle_rss_mib = memory_mib(agent.pid())?.0;
    }
    w.nft(&format!("delete table {TABLE}"), "")?;
    gens.drain();

    load(s, &api)?;
    progress("the agent's first sync");
    let started = Instant::now();
    let agent = Agent::spawn(s, &w, &api, dir.path().join("agent.log"))?;
    first_sync(&w, &gens, &agent, started, &mut r)?;
    changes(s, &w, &gens, &api, &agent, &mut r)?;
    if let Some(keep) = std::env::var_os("WEIR_BENCH_AGENT_LOG") {
        std::fs::copy(&agent.log, &keep).map_err(|e| format!("WEIR_BENCH_AGENT_LOG: {e}"))?;
    }
    (r.rss_mib, r.hwm_mib) = memory_mib(agent.pid())?;

    let tables = conn_tables(s, &w, &gens, &api, &agent)?;
    drop(agent);
    r.conn = conn_rates(s, &w, &tables)?;
    Ok(r)
}

/// The generated cluster and the bench pods into the API server.
fn load(s: &Settings, api: &FakeApi) -> Result<(), String> {
    let started = Instant::now();
    let mut n = 0;
    for o in cluster::objects(s.nodes).chain(cluster::bench_pods()) {
        cluster::apply(api, o)?;
        n += 1;
    }
    // Watches start from the lists: the creation history is not needed.
    api.compact();
    progress(format!(
        "{n} objects in the fake API server in {:.1} s; node-0 holds 1/{} of the pods",
        started.elapsed().as_secs_f64(),
        s.nodes
    ));
    Ok(())
}

/// Spawned at `started` → the first commit, and what the agent says of it.
fn first_sync(
    w: &World,
    gens: &Generations,
    agent: &Agent,
    started: Instant,
    r: &mut Report,
) -> Result<(), String> {
    let at = gens
        .next(Duration::from_secs(300))
        .map_err(|e| format!("first sync: {e}: {}", agent.tail()))?;
    r.full_ms = ms(at - started);
    let text = wait_metric(w, "weir_policy_syncs_total{kind=\"full\"}", 1.0)?;
    r.full_own_ms =
        metric(&text, "weir_policy_sync_duration_seconds_sum").unwrap_or(f64::NAN) * 1e3;
    r.full_plan_ms = agent.last_field("planned the initial objects", "plan_ms");
    r.full_nft_ms = agent.last_field("policy: synced", "nft_ms");
    r.local_pods = metric(&text, "weir_policy_local_pods").unwrap_or(f64::NAN);
    r.chains = metric(&text, "weir_policy_chains").unwrap_or(f64::NAN);
    r.rules = metric(&text, "weir_policy_rules").unwrap_or(f64::NAN);
    thread::sleep(Duration::from_millis(500));
    r.rss_first_mib = memory_mib(agent.pid())?.0;
    progress(format!(
        "  {:.0} ms to the commit (the agent's own sync {:.0} ms: plan {:.0}, nft {:.0}); {} local pods, {} chains, {} rules; RSS {:.1} MiB",
        r.full_ms, r.full_own_ms, r.full_plan_ms, r.full_nft_ms, r.local_pods, r.chains, r.rules, r.rss_first_mib
    ));
    Ok(())
}

/// The metrics text once `name` is at least `at_least` (the agent updates its metrics just
/// after the commit the bench saw).
fn wait_metric(w: &World, name: &str, at_least: f64) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = w.http_get(METRICS_PORT, "/metrics")?;
        if metric(&text, name).is_some_and(|v| v >= at_least) {
            return Ok(text);
        }
        if Instant::now() > deadline {
            return Err(format!("{name} never reached {at_least}"));
        }
        thread::sleep(Duration::from_millis(5));
    }
}

const DIFFS: &str = "weir_policy_syncs_total{kind=\"diff\"}";
const PROGRAMMING: &str = "weir_policy_network_programming_duration_seconds_sum";

/// Pod label changes and policy changes, alternating, each spaced past the agent's default
/// --min-sync-period (1 s) so it is synced alone and at once.
fn changes(
    s: &Settings,
    w: &World,
    gens: &Generations,
    api: &FakeApi,
    agent: &Agent,
    r: &mut Report,
) -> Result<(), String> {
    progress(format!(
        "{} pod label changes and {} policy changes, alternating",
        s.changes, s.changes
    ));
    let local = cluster::local_namespaces(s.nodes);
    let mut relabelled = vec![false; local.len()];
    let mut widened = vec![false; local.len()];
    let mut last = Instant::now();
    for k in 0..2 * s.changes {
        thread::sleep(
            (last + Duration::from_millis(1100)).saturating_duration_since(Instant::now()),
        );
        let before = w.http_get(METRICS_PORT, "/metrics")?;
        let (diffs, own) = (
            metric(&before, DIFFS).unwrap_or(0.0),
            metric(&before, PROGRAMMING).unwrap_or(0.0),
        );
        gens.drain();
        let slot = (k / 2 * 7) % local.len();
        let n = local[slot];
        let (object, into) = if k % 2 == 0 {
            relabelled[slot] = !relabelled[slot];
            let app = if relabelled[slot] { "a1" } else { "a0" };
            (cluster::pod(n, 0, s.nodes, Some(app)), &mut r.pod)
        } else {
            widened[slot] = !widened[slot];
            (cluster::policy(n, 5, widened[slot]), &mut r.policy)
        };
        let written = Instant::now();
        cluster::apply(api, object)?;
        let at = gens
            .next(Duration::from_secs(30))
            .map_err(|e| format!("change {k}: {e}: {}", agent.tail()))?;
        last = at;
        let after = wait_metric(w, DIFFS, diffs + 1.0)?;
        if metric(&after, DIFFS) != Some(diffs + 1.0) {
            progress(format!("  change {k}: more than one sync, left out"));
            continue;
        }
        into.wall_ms.push(ms(at - written));
        into.own_ms
            .push((metric(&after, PROGRAMMING).unwrap_or(f64::NAN) - own) * 1e3);
        into.queued_ms
            .push(agent.last_field("policy: planned", "queued_ms"));
        into.plan_ms
            .push(agent.last_field("policy: planned", "plan_ms"));
        into.nft_ms
            .push(agent.last_field("policy: synced", "nft_ms"));
    }
    for (what, c) in [("pod label", &r.pod), ("policy", &r.policy)] {
        progress(format!(
            "  {what} change → rules: median {:.2} ms (the agent's own {:.2}: queued {:.2}, plan {:.2}, nft {:.2})",
            median(&c.wall_ms),
            median(&c.own_ms),
            median(&c.queued_ms),
            median(&c.plan_ms),
            median(&c.nft_ms)
        ));
    }
    Ok(())
}

/// The agent's table with the bench pods selected by `conn_policies` policies in each
/// shape, as `nft list` prints it (loaded again with `nft -f` while no agent runs).
struct Tables {
    /// The node's table before the bench policies: the bench pods in no chain.
    unselected: String,
    all_allow: String,
    last_allows: String,
}

fn conn_tables(
    s: &Settings,
    w: &World,
    gens: &Generations,
    api: &FakeApi,
    agent: &Agent,
) -> Result<Tables, String> {
    let mut out = vec![w.nft(&format!("list table {TABLE}"), "")?];
    for shape in [Shape::AllAllow, Shape::LastAllows] {
        progress(format!(
            "{} policies selecting the bench pods ({shape:?})",
            s.conn_policies
        ));
        gens.drain();
        for p in cluster::bench_policies(s.conn_policies, shape) {
            cluster::apply(api, p)?;
        }
        gens.next(Duration::from_secs(60))
            .map_err(|e| format!("{shape:?}: {e}: {}", agent.tail()))?;
        // The writes may span two batches: quiet for 3 s means the last one is in.
        while gens.next(Duration::from_secs(3)).is_ok() {}
        out.push(w.nft(&format!("list table {TABLE}"), "")?);
    }
    let last_allows = out.pop().expect("two shapes");
    let all_allow = out.pop().expect("two shapes");
    let unselected = out.pop().expect("the table before");
    Ok(Tables {
        unselected,
        all_allow,
        last_allows,
    })
}

#[derive(Clone, Copy, Debug)]
enum State {
    NoTable,
    Unselected,
    AllAllow,
    LastAllows,
}

fn set_state(w: &World, t: &Tables, state: State) -> Result<(), String> {
    let text = match state {
        State::NoTable => {
            return w
                .nft(&format!("delete table {TABLE}"), "")
                .or_else(|e| {
                    if e.contains("No such file") {
                        Ok(String::new())
                    } else {
                        Err(e)
                    }
                })
                .map(|_| ());
        }
        State::Unselected => &t.unselected,
        State::AllAllow => &t.all_allow,
        State::LastAllows => &t.last_allows,
    };
    let script = format!("table {TABLE}\ndelete table {TABLE}\n{text}");
    w.nft("-f -", &script).map(|_| ())
}

fn conn_rates(s: &Settings, w: &World, t: &Tables) -> Result<Conn, String> {
    let target: SocketAddr = format!("{}:{}", cluster::SERVER_IP, cluster::CONN_PORT)
        .parse()
        .expect("address");
    let _server = conn::Server::start(&w.server(), cluster::CONN_PORT)?;
    let mut c = Conn {
        // The policies' rules of the two chains (each chain's "itself" rule comes first).
        rules_walked: [CLIENT_RULES, SERVER_RULES]
            .iter()
            .map(|c| t.last_allows.matches(c).count())
            .sum(),
        ..Default::default()
    };
    sanity(w, t, target)?;
    let states = [
        State::NoTable,
        State::Unselected,
        State::AllAllow,
        State::LastAllows,
    ];
    for round in 0..s.rounds {
        let mut rates = [0.0; 4];
        // The order rotates every round, so no state always comes first.
        for i in 0..states.len() {
            let which = (i + round) % states.len();
            set_state(w, t, states[which])?;
            world::sh(&format!(
                "ip netns exec {} conntrack -F 2>/dev/null || true",
                w.node()
            ))?;
            let (rate, failed) = conn::rate(&w.client(), target, s.clients, s.seconds);
            rates[which] = rate;
            c.failed += failed;
        }
        progress(format!(
            "round {}/{}: conn/s no table {:.0}, unselected {:.0} ({:.3}), all allow {:.0} ({:.3}), last allows {:.0} ({:.3})",
            round + 1,
            s.rounds,
            rates[0],
            rates[1],
            rates[1] / rates[0],
            rates[2],
            rates[2] / rates[0],
            rates[3],
            rates[3] / rates[0]
        ));
        c.none.push(rates[0]);
        c.unselected.push(rates[1]);
        c.all.push(rates[2]);
        c.last.push(rates[3]);
    }
    set_state(w, t, State::NoTable)?;
    Ok(c)
}

/// Each table is in force: the bench's port answers, another port of the server is dropped
/// (no answer at all, where no table gives a refusal).
fn sanity(w: &World, t: &Tables, target: SocketAddr) -> Result<(), String> {
    let other: SocketAddr = format!("{}:9999", cluster::SERVER_IP)
        .parse()
        .expect("address");
    for state in [State::AllAllow, State::LastAllows] {
        set_state(w, t, state)?;
        let (ok, closed) = world::in_ns(&w.client(), || {
            let ok = std::net::TcpStream::connect_timeout(&target, Duration::from_secs(2)).is_ok();
            let err = std::net::TcpStream::connect_timeout(&other, Duration::from_millis(300));
            (
                ok,
                err.is_err_and(|e| e.kind() == std::io::ErrorKind::TimedOut),
            )
        });
        if !ok || !closed {
            return Err(format!(
                "{state:?}: the allowed port answered: {ok}, another port dropped: {closed}"
            ));
        }
    }
    Ok(())
}

impl Report {
    /// Prints the table; returns the bench line.
    fn print(&self, s: &Settings) -> String {
        let change = |c: &Changes| (median(&c.wall_ms), median(&c.own_ms), c.wall_ms.len());
        let (pod_ms, pod_own, pod_n) = change(&self.pod);
        let (pol_ms, pol_own, pol_n) = change(&self.policy);
        let all_changes: Vec<f64> = self
            .pod
            .wall_ms
            .iter()
            .chain(&self.policy.wall_ms)
            .copied()
            .collect();
        let change_ms = median(&all_changes);
        let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
        println!(
            "\n1,000 namespaces, 10,000 pods, 10,000 NetworkPolicies; node-0 holds 1/{} of the pods \
             ({} local pods with the two bench pods, {} chains, {} rules)\n",
            s.nodes, self.local_pods, self.chains, self.rules
        );
        println!("| figure | weir policy | target |\n|---|---:|---|");
        println!(
            "| first full sync: start → rules committed | {:.0} ms | ≤ 1,000 ms: {} |",
            self.full_ms,
            verdict(self.full_ms <= 1000.0)
        );
        println!(
            "|   of which the agent's sync: plan, nft | {:.0} ms: {:.0}, {:.0} | |",
            self.full_own_ms, self.full_plan_ms, self.full_nft_ms
        );
        println!("| pod label change → rules (API write → commit; median of {pod_n}) | {pod_ms:.2} ms | ≤ 5 ms: {} |", verdict(pod_ms <= 5.0));
        println!("|   the agent's own (change received → rules): queued, plan, nft | {pod_own:.2} ms: {:.2}, {:.2}, {:.2} | |", median(&self.pod.queued_ms), median(&self.pod.plan_ms), median(&self.pod.nft_ms));
        println!(
            "| policy change → rules (median of {pol_n}) | {pol_ms:.2} ms | ≤ 5 ms: {} |",
            verdict(pol_ms <= 5.0)
        );
        println!(
            "|   the agent's own: queued, plan, nft | {pol_own:.2} ms: {:.2}, {:.2}, {:.2} | |",
            median(&self.policy.queued_ms),
            median(&self.policy.plan_ms),
            median(&self.policy.nft_ms)
        );
        println!(
            "| agent RSS after the first sync | {:.1} MiB | |",
            self.rss_first_mib
        );
        println!(
            "| agent RSS after the changes (high-water) | {:.1} MiB ({:.1}) | ≤ 64 MiB: {} |",
            self.rss_mib,
            self.hwm_mib,
            verdict(self.rss_mib <= 64.0)
        );
        println!(
            "| idle agent RSS (no objects) | {:.1} MiB | |",
            self.idle_rss_mib
        );
        let (all_ratio, last_ratio) = self.conn.print(s);
        format!(
            "policy full_ms={:.0} change_ms={change_ms:.2} pod_change_ms={pod_ms:.2} policy_change_ms={pol_ms:.2} \
             conn_ratio={all_ratio:.3} conn_ratio_last={last_ratio:.3} rss_mib={:.1} nodes={}",
            self.full_ms, self.rss_mib, s.nodes
        )
    }
}

impl Conn {
    /// The connection rows; returns the ratios (all allow, last allows) to no table.
    fn print(&self, s: &Settings) -> (f64, f64) {
        let ratio = |a: &[f64]| {
            let r: Vec<f64> = a.iter().zip(&self.none).map(|(x, n)| x / n).collect();
            median(&r)
        };
        let (unselected, all, last) =
            (ratio(&self.unselected), ratio(&self.all), ratio(&self.last));
        let n = s.conn_policies;
        let rows = [
            (
                format!("no policy table (median of {})", self.none.len()),
                median(&self.none),
                None,
            ),
            (
                "the node's table, the two pods in no chain".into(),
                median(&self.unselected),
                Some(unselected),
            ),
            (
                format!("{n} policies, all allow"),
                median(&self.all),
                Some(all),
            ),
            (
                format!(
                    "{n} policies, the last allows ({} policy rules walked)",
                    self.rules_walked
                ),
                median(&self.last),
                Some(last),
            ),
        ];
        for (what, rate, ratio) in rows {
            let target = if what.contains("all allow") {
                format!("≥ 0.95: {}", if all >= 0.95 { "met" } else { "MISSED" })
            } else {
                String::new()
            };
            let ratio = ratio.map_or("—".to_string(), |r| format!("{r:.3}"));
            println!("| conn/s, {what}; ratio to none (median per round) | {rate:.0}; {ratio} | {target} |");
        }
        println!("| failed connection attempts | {} | |", self.failed);
        (all, last)
    }
}
