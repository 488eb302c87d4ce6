//! `weir routes` on every node of a lab (bridge network): its command line (pure), starting it
//! inside the node's namespace, reading what it publishes, waiting until it has routed every
//! other node.
//!
//! The lab plays the API server: the agent publishes its Node annotations as a patch file
//! (`--publish`, docs/routes.md), and the lab merges them into the Node objects it writes, as
//! `kubectl patch node` would. A vxlan node is usable by the others only once its VTEP MAC and
//! underlay address are on its Node, so bringing the overlay up is: start every agent, wait for
//! each patch, rewrite the Nodes, wait until every agent's status routes every other node.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Deserialize;

use crate::ns;
use crate::process::{indent, log_tail, spawn_detached};
use crate::topology::Overlay;

/// How long an agent may take to publish, and the overlay to converge.
pub const CONVERGE_TIMEOUT: Duration = Duration::from_secs(20);

/// How often the agents re-read the manifest directory (the default 1 s would make every node
/// join of the lab's tests a second long).
pub const MANIFEST_POLL: &str = "200ms";

/// Everything needed to start the routes agent of one node.
#[derive(Debug, Clone)]
pub struct Launch {
    pub weir: PathBuf,
    pub backend: Overlay,
    pub manifests: PathBuf,
    pub node: String,
    /// The node's namespace name.
    pub netns: String,
    pub log: PathBuf,
    /// `--publish`: the Node patch with this node's annotations.
    pub publish: PathBuf,
    /// `--status`: per remote node, routed or refused; the VTEP MTU.
    pub status: PathBuf,
    /// `--mtu-file`: the pod MTU weir-cni reads (vxlan).
    pub mtu_file: PathBuf,
}

impl Launch {
    /// `weir routes`' arguments (docs/routes.md).
    pub fn args(&self) -> Vec<String> {
        vec![
            "routes".into(),
            "--manifests".into(),
            self.manifests.display().to_string(),
            "--node-name".into(),
            self.node.clone(),
            "--backend".into(),
            self.backend.as_str().into(),
            "--iface".into(),
            "eth0".into(),
            "--publish".into(),
            self.publish.display().to_string(),
            "--status".into(),
            self.status.display().to_string(),
            "--mtu-file".into(),
            self.mtu_file.display().to_string(),
            "--manifest-poll-interval".into(),
            MANIFEST_POLL.into(),
        ]
    }

    pub fn command_line(&self) -> String {
        format!(
            "ip netns exec {} {} {}",
            self.netns,
            self.weir.display(),
            self.args().join(" ")
        )
    }

    /// Starts the agent, detached; returns its pid. A stale patch or status file of an earlier
    /// agent is removed first, so that waiting reads this one's.
    pub fn spawn(&self) -> anyhow::Result<u32> {
        for f in [&self.publish, &self.status] {
            match std::fs::remove_file(f) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(e).with_context(|| format!("remove {}", f.display()))
                }
                _ => {}
            }
        }
        spawn_detached(&self.weir, &self.args(), &self.netns, &self.log)
    }

    fn failed(&self, pid: u32, what: &str) -> anyhow::Error {
        anyhow::anyhow!(
            "weir routes on node {} (pid {pid}) {what}\n  command: {}\n  log {}:\n{}",
            self.node,
            self.command_line(),
            self.log.display(),
            indent(&log_tail(&self.log, 20))
        )
    }

    /// Waits for the agent's Node patch and returns its annotations.
    pub fn wait_published(
        &self,
        pid: u32,
        timeout: Duration,
    ) -> anyhow::Result<BTreeMap<String, String>> {
        let started = Instant::now();
        loop {
            if let Ok(text) = std::fs::read_to_string(&self.publish) {
                return annotations_of_patch(&text)
                    .with_context(|| format!("{}", self.publish.display()));
            }
            if !ns::alive(pid) {
                return Err(self.failed(pid, "exited before publishing"));
            }
            if started.elapsed() > timeout {
                return Err(self.failed(
                    pid,
                    &format!("published nothing in {} s", timeout.as_secs()),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the agent's status routes exactly the nodes `others` (each with no refusal).
    pub fn wait_converged(
        &self,
        pid: u32,
        others: &BTreeSet<String>,
        timeout: Duration,
    ) -> anyhow::Result<Duration> {
        let started = Instant::now();
        loop {
            let last = match std::fs::read_to_string(&self.status) {
                Ok(text) => match converged(&text, others) {
                    Ok(()) => return Ok(started.elapsed()),
                    Err(why) => why,
                },
                Err(e) => format!("no status yet ({e})"),
            };
            if !ns::alive(pid) {
                return Err(self.failed(pid, "exited before routing every node"));
            }
            if started.elapsed() > timeout {
                return Err(self.failed(
                    pid,
                    &format!("not converged after {} s: {last}", timeout.as_secs()),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[derive(Deserialize)]
struct Patch {
    metadata: PatchMetadata,
}

#[derive(Deserialize)]
struct PatchMetadata {
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

/// The annotations of a Node patch (`metadata.annotations`, YAML).
pub fn annotations_of_patch(text: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let patch: Patch = weir_source::yaml::from_str(text).context("not a Node patch")?;
    Ok(patch.metadata.annotations)
}

#[derive(Deserialize)]
struct Status {
    #[serde(default)]
    blocked: Option<String>,
    #[serde(default)]
    nodes: BTreeMap<String, NodeReport>,
}

#[derive(Deserialize)]
struct NodeReport {
    #[serde(default)]
    routed: Vec<String>,
    #[serde(default)]
    refused: Vec<String>,
}

/// Ok when the status file `text` routes exactly `others`, none refused; else why not.
pub fn converged(text: &str, others: &BTreeSet<String>) -> Result<(), String> {
    let status: Status = serde_json::from_str(text).map_err(|e| format!("status: {e}"))?;
    if let Some(b) = status.blocked {
        return Err(format!("blocked: {b}"));
    }
    let seen: BTreeSet<String> = status.nodes.keys().cloned().collect();
    if &seen != others {
        return Err(format!("sees nodes {seen:?}, expected {others:?}"));
    }
    for (name, n) in &status.nodes {
        if !n.refused.is_empty() {
            return Err(format!("node {name} refused: {}", n.refused.join("; ")));
        }
        if n.routed.is_empty() {
            return Err(format!("node {name}: nothing routed"));
        }
    }
    Ok(())
}

/// True when `pid` is a `weir routes` agent of the lab whose manifests are `manifests`.
pub fn is_weir_routes(pid: u32, manifests: &Path) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let args: Vec<String> = cmdline
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    args.get(1).map(String::as_str) == Some("routes")
        && args.iter().any(|a| Path::new(a) == manifests)
}

/// Waits until every launched agent has published, returning the annotations per node, and
/// fails with the agent's log when one does not.
pub fn wait_all_published(
    started: &[(Launch, u32)],
) -> anyhow::Result<BTreeMap<String, BTreeMap<String, String>>> {
    let mut out = BTreeMap::new();
    for (launch, pid) in started {
        out.insert(
            launch.node.clone(),
            launch.wait_published(*pid, crate::timeout::startup_timeout(CONVERGE_TIMEOUT))?,
        );
    }
    Ok(out)
}

/// Waits until every agent routes every other node of `nodes`; per node, how long it took.
pub fn wait_all_converged(
    started: &[(Launch, u32)],
    nodes: &BTreeSet<String>,
) -> anyhow::Result<Vec<(String, Duration)>> {
    let mut out = Vec::new();
    for (launch, pid) in started {
        let mut others = nodes.clone();
        others.remove(&launch.node);
        let took = launch.wait_converged(
            *pid,
            &others,
            crate::timeout::startup_timeout(CONVERGE_TIMEOUT),
        )?;
        out.push((launch.node.clone(), took));
    }
    if out.is_empty() {
        bail!("no routes agent to wait for");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_follows_the_contract() {
        let l = Launch {
            weir: "/usr/bin/weir".into(),
            backend: Overlay::Vxlan,
            manifests: "/run/weir-lab/x/manifests".into(),
            node: "a".into(),
            netns: "wl-x-a".into(),
            log: "/x/routes-a.log".into(),
            publish: "/x/routes/a/node.patch.yaml".into(),
            status: "/x/routes/a/status.json".into(),
            mtu_file: "/x/routes/a/mtu".into(),
        };
        assert_eq!(
            l.command_line(),
            "ip netns exec wl-x-a /usr/bin/weir routes --manifests /run/weir-lab/x/manifests \
             --node-name a --backend vxlan --iface eth0 --publish /x/routes/a/node.patch.yaml \
             --status /x/routes/a/status.json --mtu-file /x/routes/a/mtu \
             --manifest-poll-interval 200ms"
        );
    }

    #[test]
    fn reads_the_published_patch() {
        let text = "# weir routes: this node's overlay annotations\n# kubectl patch node a --patch-file p\n\
                    metadata:\n  annotations:\n    weir.dev/backend-data: '{\"VNI\":1,\"VtepMAC\":\"a6:5b:00:00:00:01\"}'\n    \
                    weir.dev/backend-type: vxlan\n    weir.dev/public-ip: 172.31.0.18\n";
        let a = annotations_of_patch(text).unwrap();
        assert_eq!(a["weir.dev/backend-type"], "vxlan");
        assert_eq!(a["weir.dev/public-ip"], "172.31.0.18");
        assert!(a["weir.dev/backend-data"].contains("VtepMAC"));
        assert!(annotations_of_patch("[1, 2]").is_err());
    }

    #[test]
    fn convergence_needs_every_other_node_routed() {
        let others: BTreeSet<String> = ["b".to_string(), "c".to_string()].into();
        let ok = r#"{"node":"a","backend":"vxlan","mtu":1450,"nodes":{
            "b":{"routed":["10.244.2.0/24"]},"c":{"routed":["10.244.3.0/24"]}}}"#;
        assert_eq!(converged(ok, &others), Ok(()));
        let refused = r#"{"nodes":{"b":{"routed":["10.244.2.0/24"]},
            "c":{"routed":[],"refused":["no VTEP published yet (weir.dev/backend-data)"]}}}"#;
        assert!(converged(refused, &others)
            .unwrap_err()
            .contains("c refused: no VTEP"));
        let missing = r#"{"nodes":{"b":{"routed":["10.244.2.0/24"]}}}"#;
        assert!(converged(missing, &others)
            .unwrap_err()
            .contains("expected"));
        let blocked = r#"{"blocked":"no Node object named \"a\"","nodes":{}}"#;
        assert!(converged(blocked, &others).unwrap_err().contains("blocked"));
        // A node that left must be gone from the status too.
        let one: BTreeSet<String> = ["b".to_string()].into();
        assert!(converged(ok, &one).is_err());
    }
}
