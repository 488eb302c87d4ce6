//! `weir policy` as a process (root only), proven with real packets: one "node" network
//! namespace with a bridge (br_netfilter on, inside the node's namespace only), three "pods"
//! (namespaces on veths into the bridge) and one routed "outside" peer; weir's echo server
//! in every pod and outside; the real binary fed a manifest directory. Every namespace is
//! the test's own and is removed on drop, also after a panic.
//!
//! Probes are TCP connections made from a thread that entered the client's namespace: a
//! connection the rules allow is answered in milliseconds with the echo server's greeting;
//! one they drop never gets past its SYN.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{FromRawFd, IntoRawFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::WEIR;

const NODE_IP: &str = "10.244.1.1";
const OUT_IP: &str = "192.168.77.2";
/// A second outside address, the `except` of an ipBlock.
const OUT_IP_EXCEPT: &str = "192.168.77.3";
const HTTP: u16 = 8080;
const METRICS: u16 = 9090;
/// The agent's --sync-period.
const SYNC_PERIOD: Duration = Duration::from_secs(1);

fn pod_ip(i: usize) -> String {
    format!("10.244.1.1{i}")
}

fn sh(cmd: &str) -> String {
    let out = Command::new("sh").args(["-ec", cmd]).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What the test needs besides root and the tools: br_netfilter (the bridge hands frames to
/// the inet hooks), loaded if it is a module.
fn missing() -> Option<String> {
    if let Some(m) = weir_testkit::missing(true, &["ip", "nft", "sysctl", "curl"]) {
        return Some(m);
    }
    let present = || Path::new("/proc/sys/net/bridge/bridge-nf-call-iptables").exists();
    if !present() {
        let _ = Command::new("modprobe").arg("br_netfilter").status();
    }
    (!present()).then(|| "br_netfilter (modprobe br_netfilter)".to_string())
}

/// The node, its pods and the outside peer; the agent and the echo servers. All removed on
/// drop.
struct World {
    tag: String,
    dir: tempfile::TempDir,
    agent: Option<Child>,
    servers: Vec<Child>,
}

impl Drop for World {
    fn drop(&mut self) {
        self.stop_agent();
        for s in &mut self.servers {
            let _ = s.kill();
            let _ = s.wait();
        }
        for ns in self.all_ns() {
            let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        }
    }
}

impl World {
    fn new(tag: &str) -> World {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("manifests")).unwrap();
        let w = World {
            tag: format!("wpo-{tag}-{}", std::process::id()),
            dir,
            agent: None,
            servers: Vec::new(),
        };
        for ns in w.all_ns() {
            let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        }
        let node = w.node();
        let mut script = format!(
            "ip netns add {node}
             ip -n {node} link set lo up
             ip -n {node} link add br0 type bridge
             ip -n {node} addr add {NODE_IP}/24 dev br0
             ip -n {node} link set br0 up
             ip netns exec {node} sysctl -qw net.ipv4.ip_forward=1
             ip netns exec {node} sysctl -qw net.bridge.bridge-nf-call-iptables=1
            "
        );
        for i in 1..=3 {
            let (pod, ip) = (w.pod(i), pod_ip(i));
            script += &format!(
                "ip netns add {pod}
                 ip -n {pod} link set lo up
                 ip -n {node} link add vp{i} type veth peer name eth0 netns {pod}
                 ip -n {node} link set vp{i} master br0 up
                 ip -n {pod} addr add {ip}/24 dev eth0
                 ip -n {pod} link set eth0 up
                 ip -n {pod} route add default via {NODE_IP}
                "
            );
        }
        let out = w.outside();
        script += &format!(
            "ip netns add {out}
             ip -n {out} link set lo up
             ip -n {node} link add out0 type veth peer name eth0 netns {out}
             ip -n {node} addr add 192.168.77.1/24 dev out0
             ip -n {node} link set out0 up
             ip -n {out} addr add {OUT_IP}/24 dev eth0
             ip -n {out} addr add {OUT_IP_EXCEPT}/24 dev eth0
             ip -n {out} link set eth0 up
             ip -n {out} route add 10.244.1.0/24 via 192.168.77.1
            "
        );
        let w = w;
        sh(&script);
        w
    }

    fn node(&self) -> String {
        format!("{}-node", self.tag)
    }
    fn pod(&self, i: usize) -> String {
        format!("{}-p{i}", self.tag)
    }
    fn outside(&self) -> String {
        format!("{}-out", self.tag)
    }
    fn all_ns(&self) -> Vec<String> {
        let mut v = vec![self.node(), self.outside()];
        v.extend((1..=3).map(|i| self.pod(i)));
        v
    }

    fn manifests(&self) -> PathBuf {
        self.dir.path().join("manifests")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("policy.log")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Replaces manifest `name` (written beside it, then renamed: never read half-written).
    fn write(&self, name: &str, yaml: &str) {
        let tmp = self.manifests().join(format!(".{name}.tmp"));
        std::fs::write(&tmp, yaml).unwrap();
        std::fs::rename(tmp, self.manifests().join(name)).unwrap();
    }

    fn remove(&self, name: &str) {
        std::fs::remove_file(self.manifests().join(name)).unwrap();
    }

    /// Echo servers on 8080 and 9090 in every pod, on 8080 outside.
    fn serve(&mut self) {
        let mut wanted: Vec<(String, String, u16)> = Vec::new();
        for i in 1..=3 {
            for port in [HTTP, METRICS] {
                wanted.push((self.pod(i), format!("p{i}"), port));
            }
        }
        wanted.push((self.outside(), "out".into(), HTTP));
        for (ns, name, port) in wanted {
            let child = Command::new(WEIR)
                .args(["lab", "echo-server", "--netns"])
                .arg(format!("/run/netns/{ns}"))
                .args(["--name", &name, "--port", &port.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            self.servers.push(child);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for i in 1..=3 {
            for port in [HTTP, METRICS] {
                while connect(&self.node(), &pod_ip(i), port, None, ms(500)).is_none() {
                    assert!(Instant::now() < deadline, "echo server p{i}:{port}");
                    std::thread::sleep(ms(50));
                }
            }
        }
        while connect(&self.node(), OUT_IP, HTTP, None, ms(500)).is_none() {
            assert!(Instant::now() < deadline, "echo server outside");
            std::thread::sleep(ms(50));
        }
    }

    fn start_agent(&mut self) {
        let source = vec!["--manifests".into(), self.manifests().display().to_string()];
        self.start_agent_with(&source);
    }

    /// The agent with `source` (its object source's flags).
    fn start_agent_with(&mut self, source: &[String]) {
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &self.node(), WEIR, "policy"])
            .args(source)
            .args([
                "--node-name=node-a",
                "--sync-period=1s",
                "--min-sync-period=0s",
                "--manifest-poll-interval=100ms",
                "--healthz-bind-address=127.0.0.1:10258",
                "--metrics-bind-address=127.0.0.1:10258",
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.agent = Some(child);
        self.wait_for("the first sync", || self.synced() >= 1);
    }

    fn stop_agent(&mut self) {
        if let Some(mut c) = self.agent.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Syncs the agent has logged (whole table or diff).
    fn synced(&self) -> usize {
        self.log()
            .lines()
            .filter(|l| l.contains("policy: synced"))
            .count()
    }

    /// Writes a manifest and waits for the agent to have synced it.
    fn apply(&self, name: &str, yaml: &str) {
        let before = self.synced();
        self.write(name, yaml);
        self.wait_for(&format!("the sync of {name}"), || self.synced() > before);
    }

    fn unapply(&self, name: &str) {
        let before = self.synced();
        self.remove(name);
        self.wait_for(&format!("the sync without {name}"), || {
            self.synced() > before
        });
    }

    fn wait_for(&self, what: &str, cond: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cond() {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; agent log:\n{}",
                self.log()
            );
            std::thread::sleep(ms(50));
        }
    }

    fn nft(&self, args: &str) -> String {
        let out = Command::new("sh")
            .args(["-c", &format!("ip netns exec {} nft {args}", self.node())])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `curl` inside the node: (status, body).
    fn http(&self, path: &str) -> (u16, String) {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.node(), "curl", "-s", "-m", "2"])
            .args(["-w", "\n%{http_code}"])
            .arg(format!("http://127.0.0.1:10258{path}"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }

    /// The client `from`: p1..p3 or the outside peer (from its first or its `except`
    /// address).
    fn ns_of(&self, from: From) -> (String, Option<&'static str>) {
        match from {
            From::Pod(i) => (self.pod(i), None),
            From::Out => (self.outside(), Some(OUT_IP)),
            From::OutExcept => (self.outside(), Some(OUT_IP_EXCEPT)),
        }
    }

    /// Asserts whether a new TCP connection from `from` to `to:port` is answered.
    fn expect(&self, from: From, to: To, port: u16, allowed: bool) {
        let (ns, src) = self.ns_of(from);
        let ip = to.ip();
        // An allowed connection answers in milliseconds; a dropped one never does.
        let timeout = if allowed { ms(2000) } else { ms(400) };
        let got = connect(&ns, &ip, port, src, timeout).is_some();
        assert_eq!(
            got,
            allowed,
            "{from:?} → {to:?}:{port}: expected {}, got {}; table:\n{}",
            if allowed { "allowed" } else { "dropped" },
            if got { "allowed" } else { "dropped" },
            self.nft("list table inet weir-policy")
        );
    }
}

#[derive(Debug, Clone, Copy)]
enum From {
    Pod(usize),
    Out,
    OutExcept,
}

#[derive(Debug, Clone, Copy)]
enum To {
    Pod(usize),
    Out,
}

impl To {
    fn ip(self) -> String {
        match self {
            To::Pod(i) => pod_ip(i),
            To::Out => OUT_IP.into(),
        }
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A TCP connection from a thread in network namespace `ns` (from source address `src`, if
/// given) to `ip:port` that got the echo server's greeting within `timeout`.
fn connect(
    ns: &str,
    ip: &str,
    port: u16,
    src: Option<&str>,
    timeout: Duration,
) -> Option<(TcpStream, BufReader<TcpStream>)> {
    let ns = format!("/run/netns/{ns}");
    let to: SocketAddr = format!("{ip}:{port}").parse().unwrap();
    let src: Option<SocketAddr> = src.map(|s| format!("{s}:0").parse().unwrap());
    std::thread::scope(|s| {
        s.spawn(|| {
            let f = File::open(&ns).unwrap();
            nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let stream = match src {
                None => TcpStream::connect_timeout(&to, timeout).ok()?,
                Some(src) => connect_from(src, to, timeout)?,
            };
            stream.set_read_timeout(Some(timeout)).unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            reader.read_line(&mut line).ok()?;
            (!line.is_empty()).then_some((stream, reader))
        })
        .join()
        .unwrap()
    })
}

/// `connect` from a given source address (bind, then connect with a send timeout).
fn connect_from(src: SocketAddr, to: SocketAddr, timeout: Duration) -> Option<TcpStream> {
    use nix::sys::socket::{
        bind, connect, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn,
    };
    let (SocketAddr::V4(src), SocketAddr::V4(to)) = (src, to) else {
        return None;
    };
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .ok()?;
    let tv = nix::sys::time::TimeVal::new(timeout.as_secs() as i64, timeout.subsec_micros() as i64);
    setsockopt(&fd, sockopt::SendTimeout, &tv).ok()?;
    use std::os::fd::AsRawFd;
    bind(fd.as_raw_fd(), &SockaddrIn::from(src)).ok()?;
    connect(fd.as_raw_fd(), &SockaddrIn::from(to)).ok()?;
    // SAFETY: `fd` is a connected TCP socket we own; the stream takes it over.
    Some(unsafe { TcpStream::from_raw_fd(fd.into_raw_fd()) })
}

/// The cluster: namespaces shop (team a) and other (team b); p1 shop/web, p2 shop/db, p3
/// other/client, all on node-a with container ports http 8080 and metrics 9090.
fn cluster_yaml() -> String {
    let mut y = String::from(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop, labels: {team: a}}\n---\n\
         apiVersion: v1\nkind: Namespace\nmetadata: {name: other, labels: {team: b}}\n",
    );
    for (i, ns, app) in [
        (1, "shop", "web"),
        (2, "shop", "db"),
        (3, "other", "client"),
    ] {
        y += &format!(
            "---\napiVersion: v1\nkind: Pod\n\
             metadata: {{name: p{i}, namespace: {ns}, labels: {{app: {app}}}}}\n\
             spec: {{nodeName: node-a, containers: [{{name: c, ports: [{{name: http, containerPort: {HTTP}}}, {{name: metrics, containerPort: {METRICS}}}]}}]}}\n\
             status: {{phase: Running, podIP: {}}}\n",
            pod_ip(i)
        );
    }
    y
}

fn policy(ns: &str, name: &str, spec: &str) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
         metadata: {{name: {name}, namespace: {ns}}}\nspec: {spec}\n"
    )
}

const DB_FROM_WEB: &str = "{podSelector: {matchLabels: {app: db}}, \
    ingress: [{from: [{podSelector: {matchLabels: {app: web}}}], ports: [{port: http}]}]}";

#[test]
fn policies_allow_exactly_what_they_say_with_real_packets() {
    if !weir_testkit::can_run(missing()) {
        return;
    }
    let mut w = World::new("sem");
    w.serve();
    w.write("cluster.yaml", &cluster_yaml());
    w.start_agent();

    // No policy: everything is allowed.
    for (from, to) in [
        (From::Pod(1), To::Pod(2)),
        (From::Pod(3), To::Pod(2)),
        (From::Pod(2), To::Pod(3)),
        (From::Out, To::Pod(2)),
        (From::Pod(2), To::Out),
    ] {
        w.expect(from, to, HTTP, true);
    }
    let (code, _) = w.http("/healthz");
    assert_eq!(code, 200, "{}", w.log());

    // Default deny for ingress in shop: new connections to p1 and p2 are dropped, even from
    // their own namespace; p2's own outgoing connections (and their replies) still work.
    w.apply("deny.yaml", &policy("shop", "deny", "{podSelector: {}}"));
    w.expect(From::Pod(3), To::Pod(2), HTTP, false);
    w.expect(From::Pod(1), To::Pod(2), HTTP, false);
    w.expect(From::Out, To::Pod(1), HTTP, false);
    w.expect(From::Pod(2), To::Pod(3), HTTP, true);
    w.expect(From::Pod(2), To::Out, HTTP, true);

    // Allow rules on top of it, each exactly: by podSelector with a named port, by
    // namespaceSelector on a number, by ipBlock with an except.
    w.apply(
        "db-from-web.yaml",
        &policy("shop", "db-from-web", DB_FROM_WEB),
    );
    w.apply(
        "db-from-team-b.yaml",
        &policy(
            "shop",
            "db-from-team-b",
            "{podSelector: {matchLabels: {app: db}}, ingress: [{from: [{namespaceSelector: {matchLabels: {team: b}}}], ports: [{port: 9090}]}]}",
        ),
    );
    w.apply(
        "db-from-outside.yaml",
        &policy(
            "shop",
            "db-from-outside",
            "{podSelector: {matchLabels: {app: db}}, ingress: [{from: [{ipBlock: {cidr: 192.168.77.0/24, except: [192.168.77.3/32]}}], ports: [{port: 8080}]}]}",
        ),
    );
    w.expect(From::Pod(1), To::Pod(2), HTTP, true);
    w.expect(From::Pod(1), To::Pod(2), METRICS, false);
    w.expect(From::Pod(3), To::Pod(2), METRICS, true);
    w.expect(From::Pod(3), To::Pod(2), HTTP, false);
    w.expect(From::Out, To::Pod(2), HTTP, true);
    w.expect(From::OutExcept, To::Pod(2), HTTP, false);
    w.expect(From::Out, To::Pod(2), METRICS, false);
    // p1 (web) is still under the namespace's default deny.
    w.expect(From::Pod(3), To::Pod(1), HTTP, false);

    // Egress: web may send nothing; then only to db's http.
    w.unapply("deny.yaml");
    w.apply(
        "web-egress.yaml",
        &policy(
            "shop",
            "web-egress",
            "{podSelector: {matchLabels: {app: web}}, policyTypes: [Egress]}",
        ),
    );
    w.expect(From::Pod(1), To::Pod(3), HTTP, false);
    w.expect(From::Pod(1), To::Out, HTTP, false);
    w.expect(From::Pod(1), To::Pod(2), HTTP, false);
    // Ingress to web is not isolated any more; the reply to p3 is not a new connection.
    w.expect(From::Pod(3), To::Pod(1), HTTP, true);
    w.apply(
        "web-egress.yaml",
        &policy(
            "shop",
            "web-egress",
            "{podSelector: {matchLabels: {app: web}}, policyTypes: [Egress], egress: [{to: [{podSelector: {matchLabels: {app: db}}}], ports: [{port: http}]}]}",
        ),
    );
    w.expect(From::Pod(1), To::Pod(2), HTTP, true);
    w.expect(From::Pod(1), To::Pod(2), METRICS, false);
    w.expect(From::Pod(1), To::Pod(3), HTTP, false);

    // The metrics say what is enforced.
    let (code, metrics) = w.http("/metrics");
    assert_eq!(code, 200);
    for line in [
        "weir_policy_local_pods 3\n",
        "weir_policy_pods_isolated{direction=\"ingress\"} 1\n",
        "weir_policy_pods_isolated{direction=\"egress\"} 1\n",
        "weir_policy_sync_errors_total 0\n",
        "weir_policy_conversion_warnings 0\n",
    ] {
        assert!(metrics.contains(line), "{line} not in:\n{metrics}");
    }
    w.unapply("web-egress.yaml");
    w.expect(From::Pod(1), To::Pod(3), HTTP, true);
}

/// Runs `probers` threads in `ns` connecting to `ip:port` until stopped; counts attempts and
/// connections that were answered.
struct Prober {
    stop: Arc<AtomicBool>,
    attempts: Arc<AtomicUsize>,
    answered: Arc<AtomicUsize>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Prober {
    fn start(ns: &str, ip: &str, port: u16, probers: usize) -> Prober {
        let p = Prober {
            stop: Arc::default(),
            attempts: Arc::default(),
            answered: Arc::default(),
            threads: Vec::new(),
        };
        let mut threads = Vec::new();
        let to: SocketAddr = format!("{ip}:{port}").parse().unwrap();
        for _ in 0..probers {
            let (stop, attempts, answered) =
                (p.stop.clone(), p.attempts.clone(), p.answered.clone());
            let ns = format!("/run/netns/{ns}");
            threads.push(std::thread::spawn(move || {
                let f = File::open(&ns).unwrap();
                nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    attempts.fetch_add(1, Ordering::Relaxed);
                    // Any connection that completes counts, greeting or not.
                    if TcpStream::connect_timeout(&to, ms(100)).is_ok() {
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        Prober { threads, ..p }
    }

    /// (attempts, answered).
    fn finish(self) -> (usize, usize) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        (
            self.attempts.load(Ordering::Relaxed),
            self.answered.load(Ordering::Relaxed),
        )
    }
}

#[test]
fn changes_keep_established_connections_open_no_window_flush_repaired_cleanup() {
    if !weir_testkit::can_run(missing()) {
        return;
    }
    let mut w = World::new("chg");
    w.serve();
    w.write("cluster.yaml", &cluster_yaml());
    w.write("db.yaml", &policy("shop", "db", DB_FROM_WEB));
    w.start_agent();
    w.expect(From::Pod(1), To::Pod(2), HTTP, true);
    w.expect(From::Pod(3), To::Pod(2), HTTP, false);

    // An established connection survives a change that still allows it (p2's chain is
    // rewritten: flushed and refilled in one transaction)...
    let (mut conn, mut reader) =
        connect(&w.pod(1), &pod_ip(2), HTTP, None, ms(2000)).expect("p1 → p2");
    let talk = |conn: &mut TcpStream, reader: &mut BufReader<TcpStream>, word: &str| {
        conn.write_all(format!("{word}\n").as_bytes()).unwrap();
        let mut line = String::new();
        reader.read_line(&mut line).is_ok() && line.trim_end().ends_with(word)
    };
    assert!(talk(&mut conn, &mut reader, "before"));
    let wider = "{podSelector: {matchLabels: {app: db}}, ingress: [\
        {from: [{podSelector: {matchLabels: {app: web}}}], ports: [{port: http}]},\
        {from: [{ipBlock: {cidr: 192.168.77.0/24}}], ports: [{port: 9090}]}]}";
    w.apply("db.yaml", &policy("shop", "db", wider));
    assert!(talk(&mut conn, &mut reader, "after"), "{}", w.log());
    w.expect(From::Pod(1), To::Pod(2), HTTP, true);
    // ... and, as documented, a tightening that denies new ones (replies and the rest of
    // an established connection are not first packets).
    w.apply(
        "db.yaml",
        &policy("shop", "db", "{podSelector: {matchLabels: {app: db}}}"),
    );
    w.expect(From::Pod(1), To::Pod(2), HTTP, false);
    assert!(talk(&mut conn, &mut reader, "still"), "{}", w.log());
    drop((conn, reader));

    // No window: while p3 hammers p2 (denied by every version below), p2's chain is
    // rewritten, p3 gains and loses a chain of its own, the map elements move.
    let prober = Prober::start(&w.pod(3), &pod_ip(2), HTTP, 8);
    let versions = [
        policy("shop", "db", DB_FROM_WEB),
        policy("shop", "db", wider),
        policy("shop", "db", "{podSelector: {matchLabels: {app: db}}}"),
        policy(
            "shop",
            "db",
            "{podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.244.1.11/32}}]}]}",
        ),
    ];
    let isolate_p3 = policy(
        "other",
        "iso",
        "{podSelector: {}, policyTypes: [Ingress, Egress], egress: [{}]}",
    );
    let mut changes = 0;
    for _round in 0..3 {
        for v in &versions {
            w.apply("db.yaml", v);
            if w.manifests().join("other.yaml").exists() {
                w.unapply("other.yaml");
            } else {
                w.apply("other.yaml", &isolate_p3);
            }
            changes += 2;
        }
    }
    let (attempts, answered) = prober.finish();
    assert_eq!(
        answered, 0,
        "a denied connection got through during a change"
    );
    assert!(attempts >= 40, "the prober ran only {attempts} times");
    eprintln!("prober: {attempts} attempts during {changes} policy changes, none answered");

    // An outside `nft flush ruleset` is repaired within the sync period.
    w.apply("db.yaml", &policy("shop", "db", DB_FROM_WEB));
    if w.manifests().join("other.yaml").exists() {
        w.unapply("other.yaml");
    }
    w.expect(From::Pod(3), To::Pod(2), HTTP, false);
    w.nft("flush ruleset");
    let flushed = Instant::now();
    assert!(w.nft("list tables").trim().is_empty());
    w.wait_for("the table to be rewritten", || {
        w.nft("list tables").contains("weir-policy")
    });
    let repaired = flushed.elapsed();
    assert!(
        repaired <= SYNC_PERIOD + ms(1500),
        "repaired after {repaired:?} (sync period {SYNC_PERIOD:?})"
    );
    w.expect(From::Pod(3), To::Pod(2), HTTP, false);
    w.expect(From::Pod(1), To::Pod(2), HTTP, true);
    assert!(
        w.log().contains("changed behind weir's back"),
        "{}",
        w.log()
    );

    // `weir policy cleanup` leaves no table (and so no policy).
    w.stop_agent();
    let out = Command::new("ip")
        .args(["netns", "exec", &w.node(), WEIR, "policy", "cleanup"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!w.nft("list tables").contains("weir-policy"));
    w.expect(From::Pod(3), To::Pod(2), HTTP, true);
}

/// The same agent fed by the Kubernetes API (weir's fake API server on the node's loopback):
/// Namespaces, Pods and NetworkPolicies listed and watched, each change enforced.
#[test]
fn the_kubernetes_api_feeds_the_agent() {
    if !weir_testkit::can_run(missing()) {
        return;
    }
    let mut w = World::new("api");
    w.serve();
    let api =
        weir_fakeapi::FakeApi::start(Some(&w.node()), "127.0.0.1:6443".parse().unwrap()).unwrap();
    api.set_faults(|f| f.bookmark_interval = ms(500));
    api.apply_yaml(&cluster_yaml()).unwrap();
    api.apply_yaml(&policy("shop", "db", DB_FROM_WEB)).unwrap();
    w.start_agent_with(&["--master=http://127.0.0.1:6443".into()]);
    w.expect(From::Pod(1), To::Pod(2), HTTP, true);
    w.expect(From::Pod(3), To::Pod(2), HTTP, false);

    // A watched change: the policy now admits nobody.
    let before = w.synced();
    api.apply_yaml(&policy(
        "shop",
        "db",
        "{podSelector: {matchLabels: {app: db}}}",
    ))
    .unwrap();
    w.wait_for("the changed policy", || w.synced() > before);
    w.expect(From::Pod(1), To::Pod(2), HTTP, false);

    // A pod relabelled into the policy's reach (p1 becomes a db), then the policy deleted.
    w.expect(From::Pod(3), To::Pod(1), HTTP, true);
    let before = w.synced();
    let p1_as_db = cluster_yaml().replace("labels: {app: web}", "labels: {app: db}");
    api.apply_yaml(&p1_as_db).unwrap();
    w.wait_for("the relabelled pod", || w.synced() > before);
    w.expect(From::Pod(3), To::Pod(1), HTTP, false);
    let before = w.synced();
    assert!(api.delete("NetworkPolicy", "shop", "db"));
    w.wait_for("the deleted policy", || w.synced() > before);
    w.expect(From::Pod(1), To::Pod(2), HTTP, true);
    w.expect(From::Pod(3), To::Pod(2), HTTP, true);
    let reqs = api.requests();
    assert!(
        reqs.iter()
            .all(|q| !q.contains("/services") && !q.contains("/nodes")),
        "only the policy kinds are asked for: {reqs:#?}"
    );
}
