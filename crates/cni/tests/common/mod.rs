//! Test support: throw-away network namespaces standing for a node and its pods, and a way to run
//! a CNI plugin inside the node's namespace exactly as a container runtime would (env + stdin).
#![allow(dead_code)]

mod cni;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use weir_kernel::NetNs;

pub use cni::*;

/// A named namespace that is deleted on drop (even when the test panics).
pub struct TestNs {
    pub name: String,
}

impl TestNs {
    pub fn new(name: &str) -> Self {
        let _ = Command::new("ip")
            .args(["netns", "del", name])
            .stderr(Stdio::null())
            .status();
        let ok = Command::new("ip")
            .args(["netns", "add", name])
            .status()
            .expect("ip netns add")
            .success();
        assert!(ok, "cannot create netns {name}");
        Self {
            name: name.to_string(),
        }
    }
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }
    pub fn open(&self) -> NetNs {
        NetNs::named(&self.name).expect("open netns")
    }
    /// Runs a shell command inside the namespace and returns its stdout.
    pub fn sh(&self, cmd: &str) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.name, "sh", "-c", cmd])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
    /// `ip -o link show`: one line a link.
    pub fn links(&self) -> String {
        self.sh("ip -o link show")
    }
    pub fn mac(&self, ifname: &str) -> String {
        self.sh(&format!("cat /sys/class/net/{ifname}/address"))
            .trim()
            .to_string()
    }
}

impl Drop for TestNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// A unique, short prefix for this test's namespaces.
pub fn unique(tag: &str) -> String {
    format!("wc{}-{tag}", std::process::id() % 100000)
}

pub struct PluginRun {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl PluginRun {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.stdout))
    }
    pub fn error_code(&self) -> u64 {
        assert_ne!(
            self.code,
            Some(0),
            "expected failure, got success: {}",
            self.stdout
        );
        self.json()["code"].as_u64().expect("error JSON has a code")
    }
    pub fn ok(&self) -> &Self {
        assert_eq!(
            self.code,
            Some(0),
            "plugin failed: {} {}",
            self.stdout,
            self.stderr
        );
        self
    }
}

/// Runs `plugin` in `node`'s namespace with the given CNI environment and config.
pub fn run_plugin(
    plugin: &Path,
    node: &TestNs,
    command: &str,
    container_id: &str,
    netns: Option<&Path>,
    ifname: &str,
    config: &str,
) -> PluginRun {
    Cni::new(plugin, node).run(command, container_id, netns, ifname, config)
}

/// Inside `ns`, accepts one TCP connection on `port` and answers `reply` (in a background thread).
pub fn serve_once(ns: &TestNs, port: u16, reply: &str) -> std::thread::JoinHandle<()> {
    let handle = ns.open();
    let reply = reply.to_owned();
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let _g = handle.enter().unwrap();
        let l = std::net::TcpListener::bind(("0.0.0.0", port)).unwrap();
        tx.send(()).unwrap();
        if let Ok((mut s, _)) = l.accept() {
            let _ = s.write_all(reply.as_bytes());
        }
    });
    rx.recv().unwrap();
    t
}

/// From inside `ns`, connects to addr:port and returns what the server said.
pub fn fetch(ns: &TestNs, addr: std::net::IpAddr, port: u16) -> std::io::Result<String> {
    use std::io::Read;
    let handle = ns.open();
    std::thread::scope(|s| {
        s.spawn(|| {
            let _g = handle.enter()?;
            let mut c = std::net::TcpStream::connect_timeout(
                &(addr, port).into(),
                std::time::Duration::from_secs(3),
            )?;
            let mut out = String::new();
            c.read_to_string(&mut out)?;
            Ok(out)
        })
        .join()
        .unwrap()
    })
}

/// Asserts that a TCP connection from `client` to `addr:port` reaches a listener in `server`
/// (which answers with its namespace's name, so the answer proves where it landed).
pub fn assert_connects(client: &TestNs, server: &TestNs, addr: impl std::fmt::Display, port: u16) {
    let addr: std::net::IpAddr = addr.to_string().parse().unwrap();
    let listener = serve_once(server, port, &server.name);
    let answer = fetch(client, addr, port);
    assert_eq!(
        answer.unwrap(),
        server.name,
        "{} → {addr}:{port} did not reach {}",
        client.name,
        server.name
    );
    listener.join().unwrap();
}

/// Polls `cond` for up to three seconds (DEL removes the pod's veth in the background).
pub fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
