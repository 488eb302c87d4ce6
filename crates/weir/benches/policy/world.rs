//! The bench's network namespaces, removed on drop (also after a panic): a node that
//! forwards, and two pods on veths into it, routed (no bridge), so a pod-to-pod connection
//! crosses the node's forward hook as it does on a routed node.

use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::cluster::{CLIENT_IP, SERVER_IP};

pub fn sh(script: &str) -> Result<String, String> {
    sh_with_input(script, "")
}

/// `sh -ec script` with `input` on its standard input (a table is too large for an argument).
pub fn sh_with_input(script: &str, input: &str) -> Result<String, String> {
    let mut child = Command::new("sh")
        .args(["-ec", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("sh: {e}"))?;
    let mut stdin = child.stdin.take().expect("piped");
    let input = input.to_string();
    // Written from a thread: a large input must not deadlock against the child's output.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(input.as_bytes());
    });
    let out = child.wait_with_output().map_err(|e| format!("sh: {e}"))?;
    let _ = writer.join();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{}: {}",
            script.lines().next().unwrap_or("").trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Runs `f` on a thread that entered network namespace `ns` (a name under /run/netns).
pub fn in_ns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    let path = format!("/run/netns/{ns}");
    std::thread::scope(|s| {
        s.spawn(|| {
            let file = File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET)
                .unwrap_or_else(|e| panic!("setns {path}: {e}"));
            f()
        })
        .join()
        .expect("namespace thread")
    })
}

pub struct World {
    tag: String,
}

impl World {
    /// The node (forwarding, with a NAT chain so connections are tracked as on any node a
    /// service proxy runs on) and the two pods, with addresses the bench pods' objects name.
    pub fn create() -> Result<World, String> {
        let w = World {
            tag: format!("wpb{}", std::process::id()),
        };
        for ns in w.all() {
            let _ = sh(&format!("ip netns del {ns} 2>/dev/null"));
        }
        let (node, client, server) = (w.node(), w.client(), w.server());
        sh(&format!(
            "ip netns add {node}; ip -n {node} link set lo up
             ip netns exec {node} sysctl -qw net.ipv4.ip_forward=1
             ip netns exec {node} nft add table ip node-nat
             ip netns exec {node} nft add chain ip node-nat postrouting \
               '{{ type nat hook postrouting priority srcnat; }}'"
        ))?;
        for (ns, dev, ip, gw) in [
            (&client, "pc", CLIENT_IP, "10.250.1.1"),
            (&server, "ps", SERVER_IP, "10.250.2.1"),
        ] {
            sh(&format!(
                "ip netns add {ns}; ip -n {ns} link set lo up
                 ip -n {node} link add {dev} type veth peer name eth0 netns {ns}
                 ip -n {node} addr add {gw}/24 dev {dev}; ip -n {node} link set {dev} up
                 ip -n {ns} addr add {ip}/24 dev eth0; ip -n {ns} link set eth0 up
                 ip -n {ns} route add default via {gw}"
            ))?;
        }
        Ok(w)
    }

    pub fn node(&self) -> String {
        format!("{}-node", self.tag)
    }
    pub fn client(&self) -> String {
        format!("{}-client", self.tag)
    }
    pub fn server(&self) -> String {
        format!("{}-server", self.tag)
    }
    fn all(&self) -> [String; 3] {
        [self.node(), self.client(), self.server()]
    }

    /// `nft ARGS` in the node (stdin: `input`).
    pub fn nft(&self, args: &str, input: &str) -> Result<String, String> {
        sh_with_input(&format!("ip netns exec {} nft {args}", self.node()), input)
    }

    /// The body of `GET path` from the node's loopback `port`.
    pub fn http_get(&self, port: u16, path: &str) -> Result<String, String> {
        in_ns(&self.node(), || {
            let mut s =
                TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(2))
                    .map_err(|e| format!("metrics: {e}"))?;
            s.set_read_timeout(Some(Duration::from_secs(5)))
                .map_err(|e| e.to_string())?;
            write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n")
                .map_err(|e| e.to_string())?;
            let mut text = String::new();
            s.read_to_string(&mut text).map_err(|e| e.to_string())?;
            Ok(text
                .split_once("\r\n\r\n")
                .map_or(text.clone(), |(_, b)| b.to_string()))
        })
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for ns in self.all() {
            let _ = sh(&format!("ip netns del {ns}"));
        }
    }
}

/// A Prometheus sample `name` (with its labels, if any, as written) from a metrics text.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}
