//! The project's CNI conformance suite: a table of cases over the spec's verbs and versions, the
//! reference `bridge` + `host-local` configuration keys, and the probes of issue 7, runnable against
//! any bridge-like plugin binary (weir-cni, Debian's reference plugins, or one named by
//! `WEIR_CNI_CONFORMANCE_PLUGIN`). Each case runs in its own node and pod namespaces, with its own
//! IPAM directory, and says in one short line what it saw when it fails.
//!
//! The runner lives in the test tree, not in crates/cni/src: it is test code (it drives namespaces
//! and other binaries), and the plugin's library must not grow a dependency on it.

pub mod cases;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::TestNs;

/// A plugin under test: its binary, the `type` its configurations name, the IPAM type to use
/// unless a case asks for another, and the CNI_PATH to run it with.
#[derive(Clone)]
pub struct Flavor {
    pub label: String,
    pub binary: PathBuf,
    pub kind: String,
    pub ipam: String,
    pub cni_path: String,
}

impl Flavor {
    pub fn weir() -> Self {
        let binary = PathBuf::from(env!("CARGO_BIN_EXE_weir-cni"));
        Self {
            label: "weir-cni".into(),
            cni_path: binary.parent().unwrap().display().to_string(),
            binary,
            kind: "weir-cni".into(),
            ipam: "weir-ipam".into(),
        }
    }

    pub fn reference() -> Self {
        Self::custom("reference", Path::new("/usr/lib/cni/bridge"), "host-local")
    }

    /// Any bridge-compatible plugin; its IPAM plugin is looked up beside it.
    pub fn custom(label: &str, binary: &Path, ipam: &str) -> Self {
        Self {
            label: label.into(),
            binary: binary.to_path_buf(),
            kind: binary.file_name().unwrap().to_string_lossy().into_owned(),
            ipam: ipam.into(),
            cni_path: binary.parent().unwrap().display().to_string(),
        }
    }
}

/// One plugin execution as a runtime makes it.
pub struct Invocation<'a> {
    pub command: &'a str,
    pub container_id: &'a str,
    pub netns: Option<&'a Path>,
    pub ifname: &'a str,
    pub cni_args: Option<&'a str>,
    pub stdin: &'a [u8],
    /// Extra CNI_* variables, e.g. the dummy values libcni sends with VERSION.
    pub extra_env: &'a [(&'a str, &'a str)],
    /// How long the plugin may take before the case calls it hung: generous, as debug builds on a
    /// loaded machine are slow (parsing 10 MB takes seconds).
    pub timeout: Duration,
}

impl<'a> Invocation<'a> {
    pub fn new(command: &'a str, stdin: &'a [u8]) -> Self {
        Self {
            command,
            container_id: "",
            netns: None,
            ifname: "",
            cni_args: None,
            stdin,
            extra_env: &[],
            timeout: Duration::from_secs(30),
        }
    }
    pub fn attachment(mut self, container_id: &'a str, netns: Option<&'a Path>) -> Self {
        self.container_id = container_id;
        self.netns = netns;
        self.ifname = "eth0";
        self
    }
}

pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub timed_out: bool,
}

impl Run {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
    pub fn json(&self) -> Result<Value, String> {
        serde_json::from_str(&self.stdout)
            .map_err(|e| format!("stdout is not JSON ({e}): {}", short(&self.stdout)))
    }
    /// The result of a successful run, or a one-line account of the failure.
    pub fn ok(&self) -> Result<Value, String> {
        if self.timed_out {
            return Err("hung (killed at the case's deadline)".into());
        }
        if !self.success() {
            return Err(format!("failed: {}", self.describe_error()));
        }
        if self.stdout.trim().is_empty() {
            return Ok(Value::Null);
        }
        self.json()
    }
    /// The error code of a failed run (an `Err` when it succeeded or hung).
    pub fn error_code(&self) -> Result<u64, String> {
        if self.timed_out {
            return Err("hung (killed at the case's deadline)".into());
        }
        if self.success() {
            // The address says enough; MACs would make the table change on every run.
            let what = self
                .json()
                .ok()
                .and_then(|r| first_ip(&r).ok())
                .map(|ip| format!(" with address {ip}"))
                .unwrap_or_else(|| match short(&self.stdout) {
                    out if out.is_empty() => String::new(),
                    out => format!(": {out}"),
                });
            return Err(format!("succeeded{what}"));
        }
        self.json()?["code"]
            .as_u64()
            .ok_or_else(|| format!("error without a code: {}", short(&self.stdout)))
    }
    pub fn error_msg(&self) -> String {
        self.json()
            .ok()
            .and_then(|v| v["msg"].as_str().map(str::to_string))
            .unwrap_or_default()
    }
    fn describe_error(&self) -> String {
        match self.json() {
            Ok(v) => format!(
                "code {} {}",
                v["code"],
                short(v["msg"].as_str().unwrap_or(""))
            ),
            Err(_) => format!("exit {:?} {}", self.code, short(&self.stderr)),
        }
    }
}

/// At most 100 characters of `s`, on one line.
pub fn short(s: &str) -> String {
    let one_line: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() > 100 {
        format!("{}…", one_line.chars().take(100).collect::<String>())
    } else {
        one_line
    }
}

/// Where one case runs: a node namespace (the plugin runs there, as under a runtime), pods on
/// demand, a private IPAM directory.
pub struct Ctx<'f> {
    pub flavor: &'f Flavor,
    pub node: TestNs,
    tag: String,
    pods: std::cell::RefCell<Vec<TestNs>>,
    data: tempfile::TempDir,
}

pub const SUBNET_PREFIX: &str = "10.99.0";
pub const BRIDGE: &str = "cnf0";

impl<'f> Ctx<'f> {
    pub fn new(flavor: &'f Flavor, tag: String) -> Self {
        let node = TestNs::new(&format!("{tag}-n"));
        node.sh("ip link set lo up");
        Self {
            flavor,
            node,
            tag,
            pods: Default::default(),
            data: tempfile::tempdir().unwrap(),
        }
    }

    /// A new pod namespace; lives as long as the case.
    pub fn pod(&self) -> PathBuf {
        let mut pods = self.pods.borrow_mut();
        let ns = TestNs::new(&format!("{}-p{}", self.tag, pods.len()));
        let path = ns.path();
        pods.push(ns);
        path
    }

    /// Deletes a pod namespace early (the "netns already gone" probes).
    pub fn delete_pod(&self, path: &Path) {
        self.pods.borrow_mut().retain(|p| p.path() != path);
    }

    pub fn data_dir(&self) -> &Path {
        self.data.path()
    }

    /// The case's network configuration: bridge `cnf0`, one /24, the flavor's IPAM. `edit` adds or
    /// changes keys.
    pub fn conf(&self, version: &str, edit: impl FnOnce(&mut Value)) -> Value {
        self.named_conf("conformance", version, edit)
    }

    pub fn named_conf(&self, name: &str, version: &str, edit: impl FnOnce(&mut Value)) -> Value {
        let mut c = json!({
            "cniVersion": version,
            "name": name,
            "type": self.flavor.kind,
            "bridge": BRIDGE,
            "isGateway": true,
            "ipam": {
                "type": self.flavor.ipam,
                "ranges": [[{"subnet": format!("{SUBNET_PREFIX}.0/24")}]],
                "dataDir": self.data.path(),
                "routes": [{"dst": "0.0.0.0/0"}],
            },
        });
        edit(&mut c);
        c
    }

    /// Runs the plugin in the node namespace with a deadline.
    pub fn invoke(&self, inv: &Invocation) -> Run {
        let mut cmd = Command::new(&self.flavor.binary);
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("CNI_COMMAND", inv.command)
            .env("CNI_PATH", &self.flavor.cni_path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if !inv.container_id.is_empty() {
            cmd.env("CNI_CONTAINERID", inv.container_id);
        }
        if !inv.ifname.is_empty() {
            cmd.env("CNI_IFNAME", inv.ifname);
        }
        if let Some(ns) = inv.netns {
            cmd.env("CNI_NETNS", ns);
        }
        if let Some(a) = inv.cni_args {
            cmd.env("CNI_ARGS", a);
        }
        for (k, v) in inv.extra_env {
            cmd.env(k, v);
        }
        // The handle must outlive spawn: the child's pre_exec calls setns on its fd.
        let node = self.node.open();
        node.spawn_inside(&mut cmd);
        let mut child = cmd.spawn().expect("spawn plugin");
        let stdin = inv.stdin.to_vec();
        let mut pipe = child.stdin.take().unwrap();
        // Writer and reader threads: a big stdin or stdout must not block us (or the plugin) while
        // we watch the clock.
        let writer = std::thread::spawn(move || {
            let _ = pipe.write_all(&stdin);
        });
        let drain = |mut r: Box<dyn std::io::Read + Send>| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let _ = r.read_to_end(&mut buf);
                String::from_utf8_lossy(&buf).into_owned()
            })
        };
        let stdout = drain(Box::new(child.stdout.take().unwrap()));
        let stderr = drain(Box::new(child.stderr.take().unwrap()));
        let deadline = Instant::now() + inv.timeout;
        let mut timed_out = false;
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                timed_out = true;
                break None;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let _ = writer.join();
        Run {
            code: status.and_then(|s| s.code()),
            stdout: stdout.join().unwrap(),
            stderr: stderr.join().unwrap(),
            timed_out,
        }
    }

    /// ADD of `id` into a new pod; returns the pod's namespace and the result.
    pub fn add(&self, conf: &Value, id: &str) -> Result<(PathBuf, Value), String> {
        let pod = self.pod();
        let stdin = conf.to_string();
        let res = self
            .invoke(&Invocation::new("ADD", stdin.as_bytes()).attachment(id, Some(&pod)))
            .ok()
            .map_err(|e| format!("ADD {e}"))?;
        Ok((pod, res))
    }

    pub fn run(&self, command: &str, conf: &Value, id: &str, netns: Option<&Path>) -> Run {
        let stdin = conf.to_string();
        self.invoke(&Invocation::new(command, stdin.as_bytes()).attachment(id, netns))
    }

    /// The address files of network `name` (what IPAM holds).
    pub fn allocated(&self, name: &str) -> Vec<String> {
        let mut ips: Vec<String> = std::fs::read_dir(self.data.path().join(name))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
                    .collect()
            })
            .unwrap_or_default();
        ips.sort();
        ips
    }

    /// Host-side veths attached to the case's bridge.
    pub fn bridge_ports(&self, bridge: &str) -> usize {
        self.node
            .sh(&format!("ip -o link show master {bridge}"))
            .lines()
            .count()
    }
}

/// The first address of a result, without its prefix length.
pub fn first_ip(result: &Value) -> Result<String, String> {
    result["ips"][0]["address"]
        .as_str()
        .and_then(|a| a.split('/').next())
        .map(str::to_string)
        .ok_or_else(|| {
            format!(
                "result has no ips[0].address: {}",
                short(&result.to_string())
            )
        })
}

/// The pod interface's MAC in a result.
pub fn pod_mac(result: &Value) -> Option<String> {
    result["interfaces"]
        .as_array()?
        .iter()
        .find(|i| i["sandbox"].as_str().is_some_and(|s| !s.is_empty()))
        .and_then(|i| i["mac"].as_str())
        .map(str::to_lowercase)
}

/// What the pod namespace shows on eth0: (IPv4 address, MAC), if eth0 exists.
pub fn pod_eth0(pod: &Path) -> Option<(String, String)> {
    let name = pod.file_name()?.to_string_lossy().into_owned();
    let out = Command::new("ip")
        .args(["-n", &name, "-j", "addr", "show", "dev", "eth0"])
        .output()
        .ok()?;
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    let link = v.get(0)?;
    let ip = link["addr_info"]
        .as_array()?
        .iter()
        .find(|a| a["family"] == "inet")
        .and_then(|a| a["local"].as_str())
        .unwrap_or("")
        .to_string();
    Some((ip, link["address"].as_str()?.to_lowercase()))
}

pub fn ensure(cond: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(what())
    }
}
