//! `weir proxy` as a process (root only): the real binary in a throwaway network namespace,
//! fed by a manifest directory, observed through the kernel (`nft`, `iptables-save`), its
//! HTTP endpoints (`curl`) and real TCP connections to weir's echo server behind a ClusterIP.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::WEIR;

/// The port every endpoint serves on (weir's lab echo server).
pub const POD_PORT: u16 = 8080;

/// A namespace, a manifest directory and the running agent; all removed on drop.
pub struct Agent {
    pub ns: String,
    pub dir: tempfile::TempDir,
    pub log: PathBuf,
    pub mode: &'static str,
    /// Flags besides the ones every test uses.
    pub args: Vec<String>,
    /// A command the agent is started through (after `ip netns exec`), e.g. `setpriv …`.
    pub wrapper: Vec<String>,
    /// Pass `--manifests <dir>` (false when the test gives another source, e.g. `--master`).
    pub use_manifests: bool,
    /// The subcommand: `proxy`, or `agent` (the one node agent takes the proxy's flags).
    pub command: &'static str,
    child: Option<Child>,
    /// The echo server standing in for every pod (see [`Agent::serve_pods`]).
    pods: Option<Child>,
}

impl Agent {
    /// An agent fed the proxy crate's `services.yaml` fixture.
    pub fn new(tag: &str, mode: &'static str) -> Agent {
        let fixture =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../proxy/tests/fixtures/v1/services.yaml");
        Agent::with_manifest(tag, mode, &std::fs::read_to_string(fixture).unwrap())
    }

    /// An agent whose manifest directory holds `services.yaml` = `manifest`.
    pub fn with_manifest(tag: &str, mode: &'static str, manifest: &str) -> Agent {
        // Files first: once the namespace exists, nothing may panic before the guard
        // (`Agent`, whose drop deletes it) does, or the namespace leaks (a full /tmp did that).
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("proxy.log");
        let manifests = dir.path().join("manifests");
        std::fs::create_dir(&manifests).unwrap();
        std::fs::write(manifests.join("services.yaml"), manifest).unwrap();
        let ns = format!("wpa-{tag}-{}", std::process::id());
        let _ = Command::new("ip")
            .args(["netns", "del", &ns])
            .stderr(Stdio::null())
            .status();
        let added = Command::new("ip")
            .args(["netns", "add", &ns])
            .status()
            .is_ok_and(|s| s.success());
        let agent = Agent {
            ns,
            dir,
            log,
            mode,
            args: Vec::new(),
            wrapper: Vec::new(),
            use_manifests: true,
            command: "proxy",
            child: None,
            pods: None,
        };
        assert!(added, "ip netns add {}", agent.ns);
        agent.sh("ip link set lo up");
        agent
    }

    pub fn manifests(&self) -> PathBuf {
        self.dir.path().join("manifests")
    }

    /// Starts the agent and waits for /healthz 200.
    pub fn start(&mut self) {
        self.spawn();
        self.wait_for("healthz 200", || self.http("10256/healthz").0 == 200);
    }

    /// Starts the agent without waiting for it to become healthy.
    pub fn spawn(&mut self) {
        // A restart must not race the previous process's listeners (seen once under load:
        // "Address already in use"); wait until nothing listens on the agent's ports.
        self.wait_for("the previous agent's ports to be free", || {
            let listening = self.sh("ss -Hltn 'sport = :10256 or sport = :10249'");
            listening.trim().is_empty()
        });
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let source = match self.use_manifests {
            true => vec!["--manifests".into(), self.manifests()],
            false => vec![],
        };
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .args(&self.wrapper)
            .args([WEIR, self.command, "--proxy-mode", self.mode])
            .args(source)
            .arg("--state-dir")
            .arg(self.dir.path().join("state"))
            .args([
                "--cluster-cidr=10.244.0.0/16,fd00:244::/48",
                "--hostname-override=node-a",
                "--manifest-poll-interval=100ms",
                "--min-sync-period=0s",
                "--healthz-bind-address=127.0.0.1:10256",
                "--metrics-bind-address=127.0.0.1:10249",
            ])
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    /// The agent's pid (`ip netns exec` and any wrapper exec it, so it is weir's own).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Whether the agent process is still running.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    /// The pods: weir's lab echo server (`pod <peer>` on TCP port 8080 of every address in the
    /// namespace), on a veth (whose peer stays in the namespace) carrying the pod address
    /// 10.244.0.5, the node's address 192.168.0.10 and the route to the service range (a
    /// packet needs a route before nat OUTPUT can rewrite it); 10.244.9.9 on lo is a second
    /// pod address.
    pub fn serve_pods(&mut self) {
        self.sh(
            "ip link add pods0 type veth peer name pods1 && ip addr add 10.244.0.5/24 dev pods0 \
             && ip addr add 192.168.0.10/24 dev pods0 && ip link set pods0 up \
             && ip link set pods1 up && ip route add 10.96.0.0/16 dev pods0 \
             && ip addr add 10.244.9.9/32 dev lo",
        );
        let server = Command::new("ip")
            .args(["netns", "exec", &self.ns, WEIR, "lab", "echo-server"])
            .args(["--name", "pod", "--port", &POD_PORT.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.pods = Some(server);
        self.wait_for("the pods' echo server", || {
            self.answers("10.244.0.5", POD_PORT)
        });
    }

    /// [`Agent::serve_pods`] and the service `solo` (10.96.9.9:80 → 10.244.9.9:8080).
    pub fn serve_solo(&mut self) {
        self.serve_pods();
        std::fs::write(self.manifests().join("solo.yaml"), SOLO).unwrap();
    }

    /// Whether a real TCP connection to `ip:port` gets the echo server's greeting.
    pub fn answers(&self, ip: &str, port: u16) -> bool {
        self.sh(&format!(
            "timeout 2 bash -c 'exec 3<>/dev/tcp/{ip}/{port} && head -n1 <&3'"
        ))
        .starts_with("pod ")
    }

    /// Whether the `solo` ClusterIP answers.
    pub fn solo_answers(&self) -> bool {
        self.answers("10.96.9.9", 80)
    }

    /// Runs `f` with the agent stopped (SIGSTOP … SIGCONT), e.g. to see an outside flush
    /// break a service before the agent can repair it.
    pub fn frozen<T>(&self, f: impl FnOnce() -> T) -> T {
        use nix::sys::signal::{kill, Signal};
        let pid = nix::unistd::Pid::from_raw(self.pid().expect("running") as i32);
        kill(pid, Signal::SIGSTOP).unwrap();
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        kill(pid, Signal::SIGCONT).unwrap();
        out.unwrap_or_else(|p| std::panic::resume_unwind(p))
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Runs `script` with `sh -c` inside the namespace; its stdout.
    pub fn sh(&self, script: &str) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns, "sh", "-c", script])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs `script` inside the namespace and requires success.
    pub fn sh_ok(&self, script: &str) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns, "sh", "-c", script])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "`{script}`: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// (status, body) of `http://127.0.0.1:<port/path>` inside the namespace.
    pub fn http(&self, port_path: &str) -> (u16, String) {
        http(&self.ns, port_path)
    }

    /// /healthz's status and `reason` (empty when it gives none).
    pub fn health(&self) -> Health {
        health(&self.ns)
    }

    /// Samples /healthz every 100 ms until the returned watch is finished.
    pub fn watch_health(&self) -> HealthWatch {
        HealthWatch::start(self.ns.clone())
    }

    /// The rules weir owns in this mode's tables, as the tools print them.
    pub fn rules(&self) -> String {
        match self.mode {
            "nftables" => self.sh("nft list table inet weir 2>/dev/null"),
            _ => self.sh("iptables-save; ip6tables-save"),
        }
    }

    /// The HTTP status of `url` fetched inside the namespace (0: no answer within 1 s).
    pub fn status(&self, url: &str) -> u16 {
        let out = self.sh(&format!(
            "curl -s -o /dev/null -m 1 -w '%{{http_code}}' {url}"
        ));
        out.trim().parse().unwrap_or(0)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log's lines containing every one of `words`.
    pub fn log_lines(&self, words: &[&str]) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| words.iter().all(|w| l.contains(w)))
            .map(str::to_string)
            .collect()
    }

    /// Polls `cond` every 50 ms for up to 15 s; panics with the proxy's log on timeout.
    /// Polls `cond` every 50 ms until it holds (true) or `limit` passes (false).
    pub fn wait_until(&self, limit: Duration, cond: impl Fn() -> bool) -> bool {
        let deadline = Instant::now() + limit;
        while !cond() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    }

    pub fn wait_for(&self, what: &str, cond: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while !cond() {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; proxy log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
        if let Some(mut s) = self.pods.take() {
            let _ = s.kill();
            let _ = s.wait();
        }
        // Whatever a test left running in the namespace (a second writer) goes with it.
        let _ = Command::new("ip")
            .args(["netns", "pids", &self.ns])
            .output()
            .map(|o| {
                for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                    if let Ok(pid) = pid.parse::<i32>() {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                }
            });
        // Make an unreadable manifest directory removable again.
        let _ = Command::new("chmod")
            .args(["-R", "u+rwx"])
            .arg(self.dir.path())
            .status();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

fn http(ns: &str, port_path: &str) -> (u16, String) {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "curl",
            "-s",
            "-m",
            "2",
            "-w",
            "\n%{http_code}",
        ])
        .arg(format!("http://127.0.0.1:{port_path}"))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&out.stdout);
    let (body, code) = out.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// What /healthz said: its status and the body's `reason` ("" when none).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Health {
    pub code: u16,
    pub reason: String,
}

fn health(ns: &str) -> Health {
    let (code, body) = http(ns, "10256/healthz");
    let reason = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("reason")?.as_str().map(str::to_string))
        .unwrap_or_default();
    Health { code, reason }
}

/// /healthz sampled in the background: each distinct answer and how often it was seen.
pub struct HealthWatch {
    ns: String,
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<BTreeMap<Health, usize>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HealthWatch {
    fn start(ns: String) -> HealthWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(BTreeMap::new()));
        let (stopped, record) = (stop.clone(), seen.clone());
        let inside = ns.clone();
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                let h = health(&inside);
                *record.lock().unwrap().entry(h).or_insert(0) += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        HealthWatch {
            ns,
            stop,
            seen,
            thread: Some(thread),
        }
    }

    /// Stops sampling after one last sample (so the answer of now is always in); every
    /// distinct answer with its count.
    pub fn finish(mut self) -> BTreeMap<Health, usize> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let mut seen = self.seen.lock().unwrap().clone();
        *seen.entry(health(&self.ns)).or_insert(0) += 1;
        seen
    }
}

impl Drop for HealthWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A service `solo` (10.96.9.9:80) whose one endpoint is 10.244.9.9:8080.
/// A second service, 10.96.7.7:80 → the pods' 10.244.0.5:8080 ([`Agent::serve_pods`]): proof
/// that the watcher follows changes.
pub const EXTRA: &str = "apiVersion: v1
kind: Service
metadata: {name: extra, namespace: default}
spec:
  clusterIP: 10.96.7.7
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: extra-1, namespace: default, labels: {kubernetes.io/service-name: extra}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
  - {addresses: [10.244.0.5], nodeName: node-a}
";

pub const SOLO: &str = "apiVersion: v1
kind: Service
metadata: {name: solo, namespace: default}
spec:
  clusterIP: 10.96.9.9
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: solo-1, namespace: default, labels: {kubernetes.io/service-name: solo}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
  - {addresses: [10.244.9.9], nodeName: node-a}
";
