//! A real Kubernetes cluster (scripts/cluster/up.sh: control plane + two nodes, each
//! its own network namespace with containerd + kubelet, weir-cni as the CNI, weir proxy,
//! routes and dns on every node), driven through kubectl, and torn down (down.sh) when
//! dropped, also after a panic (the logs' tails are printed first).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The Kubernetes version the project builds: the one scripts/cluster/kube/go.mod pins (its
/// version.sh reads the same line).
pub fn pinned_version() -> String {
    let go_mod = std::fs::read_to_string(repo().join("scripts/cluster/kube/go.mod"))
        .expect("scripts/cluster/kube/go.mod");
    go_mod
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|w| w.len() >= 2 && w[0] == "k8s.io/kubernetes" && w[1].starts_with('v'))
        .map(|w| w[1].to_string())
        .expect("k8s.io/kubernetes in scripts/cluster/kube/go.mod")
}

/// Where scripts/cluster/kube/build.sh leaves the binaries (`bash scripts/dev.sh test` builds
/// them there once; `WEIR_KUBE_BUILD` overrides, a 1.20 build from build-kube.sh included).
pub fn kube_build() -> PathBuf {
    std::env::var_os("WEIR_KUBE_BUILD")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(format!("/opt/weir-tools/kube-{}", pinned_version())))
}

/// The version of that build: its VERSION file, or 1.20.2 (Debian's source build has none).
pub fn kube_version() -> String {
    std::fs::read_to_string(kube_build().join("VERSION"))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|_| "v1.20.2".into())
}

/// Whether the build is 1.20 (v1beta1 EndpointSlices, no Service field selector).
pub fn is_legacy() -> bool {
    kube_version() == "v1.20.2"
}

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// What is missing for a real cluster here, if anything (for `weir_testkit::can_run`: under
/// CI=true the test fails naming it, elsewhere it is skipped and counted).
pub fn missing() -> Option<String> {
    if !super::is_root() {
        return Some("root (network namespaces, containerd, kubelet)".into());
    }
    let kb = kube_build();
    for b in [
        "kube-apiserver",
        "kubelet",
        "kubectl",
        "kube-controller-manager",
    ] {
        if !kb.join("bin").join(b).exists() {
            return Some(format!(
                "{} (run scripts/cluster/kube/build.sh {}: builds Kubernetes {} from Go modules)",
                kb.join("bin").join(b).display(),
                kb.display(),
                pinned_version()
            ));
        }
    }
    // etcd, containerd and ctr: the build's own, or (1.20) Debian's
    let own = |tool: &str| !is_legacy() && kb.join("bin").join(tool).exists();
    for tool in ["etcd", "containerd", "runc", "ctr", "nft", "curl", "gcc"] {
        if own(tool) {
            continue;
        }
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            return Some(format!("the `{tool}` command"));
        }
    }
    None
}

pub struct Cluster {
    pub name: String,
    pub run: tempfile::TempDir,
    pub nodes: [&'static str; 2],
    pub node_ips: [&'static str; 2],
    pub cp_ip: &'static str,
    started: Instant,
}

impl Cluster {
    /// Brings the cluster up (about 15 s) with weir proxy in nftables mode; panics with the
    /// script's output if it cannot.
    pub fn up(tag: &str) -> Cluster {
        Cluster::up_with(tag, "nftables")
    }

    /// The same, the nodes' proxy being weir proxy in `mode`, or `kube-proxy-iptables` /
    /// `kube-proxy-nftables` (upstream kube-proxy of the build's version).
    pub fn up_with(tag: &str, mode: &str) -> Cluster {
        let name = format!("{tag}{}", std::process::id() % 1_000_000);
        assert!(name.len() <= 8, "{name}");
        let run = tempfile::Builder::new()
            .prefix(&format!("weir-cluster-{name}-"))
            .tempdir()
            .expect("tempdir");
        let cluster = Cluster {
            name,
            run,
            nodes: ["node-1", "node-2"],
            node_ips: ["10.77.0.11", "10.77.0.12"],
            cp_ip: "10.77.0.1",
            started: Instant::now(),
        };
        let weir_bin = Path::new(super::WEIR).parent().unwrap().to_path_buf();
        let out = Command::new("bash")
            .arg(repo().join("scripts/cluster/up.sh"))
            .args([&cluster.name, cluster.run.path().to_str().unwrap()])
            .env("WEIR_BIN", &weir_bin)
            .env("KUBE_BUILD", kube_build())
            .env("WEIR_PROXY_MODE", mode)
            .output()
            .expect("run up.sh");
        assert!(
            out.status.success(),
            "up.sh failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.step(&format!(
            "cluster {} up (2 nodes, Kubernetes {})",
            cluster.name,
            kube_version()
        ));
        cluster
    }

    pub fn step(&self, what: &str) {
        eprintln!("[{:>6.1}s] {what}", self.started.elapsed().as_secs_f64());
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.run.path().join(file)
    }

    pub fn node_ns(&self, node: usize) -> String {
        format!("{}-n{}", self.name, node + 1)
    }

    pub fn cp_ns(&self) -> String {
        format!("{}-cp", self.name)
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new(self.path("kubectl"))
            .args(args)
            .output()
            .expect("run kubectl")
    }

    /// kubectl's stdout; panics with its stderr when it fails.
    pub fn k(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.k(&a)).expect("kubectl JSON")
    }

    pub fn apply(&self, yaml: &str) {
        let out = weir_testkit::output_with_input(
            Command::new(self.path("kubectl")).args(["apply", "-f", "-"]),
            yaml.as_bytes(),
        )
        .expect("kubectl apply");
        assert!(
            out.status.success(),
            "kubectl apply: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Runs `script` with `sh -c` in a network namespace (the host's tools: curl, nft, ip).
    pub fn in_ns(&self, ns: &str, script: &str) -> Output {
        Command::new("nsenter")
            .arg(format!("--net=/run/netns/{ns}"))
            .args(["sh", "-c", script])
            .output()
            .expect("nsenter")
    }

    pub fn in_ns_text(&self, ns: &str, script: &str) -> String {
        String::from_utf8_lossy(&self.in_ns(ns, script).stdout).into_owned()
    }

    /// The nftables ruleset of a node.
    pub fn nft(&self, node: usize) -> String {
        self.in_ns_text(&self.node_ns(node), "nft list ruleset")
    }

    /// `kubectl exec POD -- sh -c SCRIPT` (the image's busybox); stdout and success.
    pub fn exec(&self, pod: &str, script: &str) -> (bool, String) {
        let out = self.kubectl(&["exec", pod, "--", "sh", "-c", script]);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    /// An HTTP GET from inside a pod (busybox nc: the image has no wget that works here); the
    /// body's last line (the serving pod's name), or None.
    pub fn http_from_pod(&self, pod: &str, host: &str, port: u16) -> Option<String> {
        let script = format!(
            "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | busybox nc -w 2 {host} {port} | busybox tail -n 1"
        );
        let (_, out) = self.exec(pod, &script);
        let line = out.trim();
        (!line.is_empty()).then(|| line.to_string())
    }

    /// An HTTP GET with curl from a network namespace; the body, or None.
    pub fn curl_from(&self, ns: &str, url: &str) -> Option<String> {
        let out = self.in_ns(ns, &format!("curl -sf -m 3 {url}"));
        let body = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out.status.success() && !body.is_empty()).then_some(body)
    }

    /// The network namespace (under /run/netns) holding a pod's address: the pod's own, made
    /// by containerd.
    pub fn pod_netns(&self, node: usize, pod_ip: &str) -> Option<String> {
        let list = self.in_ns_text(&self.node_ns(node), "ip netns list");
        list.lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|n| n.starts_with("cni-"))
            .find(|n| {
                let out = Command::new("ip")
                    .args(["-n", n, "-4", "-o", "addr", "show"])
                    .output();
                out.is_ok_and(|o| {
                    String::from_utf8_lossy(&o.stdout).contains(&format!(" {pod_ip}/"))
                })
            })
            .map(str::to_string)
    }

    /// The pods matching a label selector: (name, IP, node), Running ones with an IP.
    pub fn pods(&self, selector: &str) -> Vec<(String, String, String)> {
        let v = self.json(&["get", "pods", "-l", selector]);
        let mut pods: Vec<(String, String, String)> = v["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .filter(|p| p["status"]["phase"] == "Running")
            .filter_map(|p| {
                Some((
                    p["metadata"]["name"].as_str()?.to_string(),
                    p["status"]["podIP"].as_str()?.to_string(),
                    p["spec"]["nodeName"].as_str()?.to_string(),
                ))
            })
            .collect();
        pods.sort();
        pods
    }

    /// Waits for `cond`, up to `limit`; how long it took, or a panic naming `what`.
    pub fn wait(&self, what: &str, limit: Duration, cond: impl Fn() -> bool) -> Duration {
        let t0 = Instant::now();
        loop {
            if cond() {
                return t0.elapsed();
            }
            assert!(t0.elapsed() < limit, "timed out after {limit:?}: {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// ctl.sh: stop, start or restart one of the cluster's processes.
    pub fn ctl(&self, op: &str, process: &str) {
        let out = Command::new("bash")
            .arg(repo().join("scripts/cluster/ctl.sh"))
            .args([self.run.path().to_str().unwrap(), op, process])
            .output()
            .expect("ctl.sh");
        assert!(
            out.status.success(),
            "ctl.sh {op} {process}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The HTTP status of a node-local health endpoint (0: no answer).
    pub fn health(&self, node: usize, port: u16) -> u16 {
        let out = self.in_ns_text(
            &self.node_ns(node),
            &format!(
                "curl -s -o /dev/null -w '%{{http_code}}' -m 2 http://127.0.0.1:{port}/healthz"
            ),
        );
        out.trim().parse().unwrap_or(0)
    }

    /// The kube-proxy binary of the build.
    pub fn kube_proxy(&self) -> String {
        kube_build().join("bin/kube-proxy").display().to_string()
    }

    /// Starts weir proxy in `mode` on a node (as up.sh would, with the mode changed).
    pub fn start_weir_proxy(&self, node: usize, mode: &str) {
        let name = self.nodes[node];
        let n = self.path(name);
        let cmd = [
            self.node_ns(node),
            "env".into(),
            "RUST_LOG=info".into(),
            super::WEIR.into(),
            "proxy".into(),
            format!("--kubeconfig={}", self.path("kubeconfig").display()),
            format!("--hostname-override={name}"),
            format!("--proxy-mode={mode}"),
            "--cluster-cidr=10.244.0.0/16".into(),
            format!("--state-dir={}", n.join("weir-proxy").display()),
            "--healthz-bind-address=127.0.0.1:10256".into(),
            "--metrics-bind-address=127.0.0.1:10249".into(),
        ];
        std::fs::write(
            self.path(&format!("{name}-proxy.cmd")),
            cmd.join("\n") + "\n",
        )
        .unwrap();
        self.ctl("start", &format!("{name}-proxy"));
    }

    pub fn log(&self, process: &str) -> String {
        std::fs::read_to_string(self.path(&format!("{process}.log"))).unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // What the scheduler saw: a tainted or NotReady node explains pods that never come.
            for args in [
                &["get", "nodes", "-o", "custom-columns=NODE:.metadata.name,CONDITIONS:.status.conditions[?(@.status==\"True\")].type,TAINTS:.spec.taints[*].key"][..],
                &["get", "pods", "-o", "wide"][..],
                &["get", "events", "--sort-by=.lastTimestamp"][..],
            ] {
                let out = self.kubectl(args);
                eprintln!("--- kubectl {}", args.join(" "));
                let text = String::from_utf8_lossy(&out.stdout);
                let tail: Vec<&str> = text.lines().rev().take(20).collect();
                for l in tail.iter().rev() {
                    eprintln!("{l}");
                }
            }
            for p in [
                "kube-apiserver",
                "node-1-kubelet",
                "node-1-proxy",
                "node-1-routes",
                "node-1-dns",
                "node-2-proxy",
            ] {
                let log = self.log(p);
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                eprintln!("--- {p}.log (last lines)");
                for l in tail.iter().rev() {
                    eprintln!("{l}");
                }
            }
        }
        let out = Command::new("bash")
            .arg(repo().join("scripts/cluster/down.sh"))
            .arg(self.run.path())
            .output();
        if let Ok(o) = out {
            if !o.status.success() {
                eprintln!("down.sh: {}", String::from_utf8_lossy(&o.stderr));
            }
        }
    }
}
