//! A test's node and a CNI plugin driven against it the way a container runtime drives it: one
//! process per request, started inside the node's namespace, the `CNI_*` environment set and the
//! network config on stdin. With these a kernel test reads as its scenario ("ADD this pod, DEL
//! that one") rather than as seven positional arguments a request.

use std::net::IpAddr;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{unique, PluginRun, TestNs};

/// One test's node: its namespace (`<unique(tag)>-node`), a scratch directory for the IPAM
/// store, and the prefix its pods' namespaces share, so that parallel tests never meet.
pub struct Node {
    ns: TestNs,
    prefix: String,
    data: tempfile::TempDir,
}

impl Node {
    pub fn new(tag: &str) -> Self {
        let prefix = unique(tag);
        Self {
            ns: TestNs::new(&format!("{prefix}-node")),
            data: tempfile::tempdir().unwrap(),
            prefix,
        }
    }

    /// A namespace for a pod of this node, `<prefix>-<name>`, deleted on drop.
    pub fn pod(&self, name: &str) -> TestNs {
        TestNs::new(&format!("{}-{name}", self.prefix))
    }

    /// The scratch directory, deleted with the node: the `dataDir` of the tests' configs.
    pub fn data(&self) -> &Path {
        self.data.path()
    }

    /// The weir-cni binary of this build, run in this node's namespace.
    pub fn cni(&self) -> Cni<'_> {
        Cni::weir(&self.ns)
    }
}

impl Deref for Node {
    type Target = TestNs;
    fn deref(&self) -> &TestNs {
        &self.ns
    }
}

/// A CNI plugin binary as a runtime runs it in `node`'s namespace.
pub struct Cni<'a> {
    plugin: PathBuf,
    node: &'a TestNs,
    extra_env: Vec<(String, String)>,
}

impl<'a> Cni<'a> {
    pub fn new(plugin: &Path, node: &'a TestNs) -> Self {
        Self {
            plugin: plugin.to_path_buf(),
            node,
            extra_env: Vec::new(),
        }
    }

    /// The weir-cni binary cargo built for these tests.
    pub fn weir(node: &'a TestNs) -> Self {
        Self::new(Path::new(env!("CARGO_BIN_EXE_weir-cni")), node)
    }

    /// The same plugin with `key=value` in every request's environment (e.g. `CNI_ARGS`).
    pub fn with_env(mut self, key: &str, value: &str) -> Self {
        self.extra_env.push((key.into(), value.into()));
        self
    }

    /// ADD of container `id` as `eth0` in `pod`.
    pub fn add(&self, id: &str, pod: &TestNs, config: &str) -> PluginRun {
        self.run("ADD", id, Some(&pod.path()), "eth0", config)
    }

    /// CHECK of container `id`'s `eth0` in `pod`.
    pub fn check(&self, id: &str, pod: &TestNs, config: &str) -> PluginRun {
        self.run("CHECK", id, Some(&pod.path()), "eth0", config)
    }

    /// DEL of container `id`'s `eth0` in `pod`.
    pub fn del(&self, id: &str, pod: &TestNs, config: &str) -> PluginRun {
        self.run("DEL", id, Some(&pod.path()), "eth0", config)
    }

    /// A request that names no attachment (GC, STATUS, VERSION).
    pub fn network(&self, command: &str, config: &str) -> PluginRun {
        self.run(command, "", None, "", config)
    }

    /// Any request, spelled out.
    pub fn run(
        &self,
        command: &str,
        container_id: &str,
        netns: Option<&Path>,
        ifname: &str,
        config: &str,
    ) -> PluginRun {
        let ns = self.node.open();
        let mut cmd = Command::new(&self.plugin);
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", container_id)
            .env("CNI_IFNAME", ifname)
            .env("CNI_PATH", self.plugin.parent().unwrap());
        if let Some(n) = netns {
            cmd.env("CNI_NETNS", n);
        }
        cmd.envs(self.extra_env.iter().map(|(k, v)| (k, v)));
        ns.spawn_inside(&mut cmd);
        let out = weir_testkit::output_with_input(&mut cmd, config.as_bytes()).expect("run plugin");
        PluginRun {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// The address (without prefix length) of an ADD result's first `ips` entry.
pub fn pod_ip(result: &serde_json::Value) -> IpAddr {
    let addr = result["ips"][0]["address"]
        .as_str()
        .expect("ips[0].address");
    addr.split('/').next().unwrap().parse().unwrap()
}

/// The addresses the IPAM store in `data_dir` holds for `network` (one file each), sorted.
pub fn allocated_addresses(data_dir: &Path, network: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(data_dir.join(network))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.parse::<IpAddr>().is_ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// `config` with `prev` as its `prevResult` (a CHECK, or an ADD later in a conflist).
pub fn with_prev_result(config: &str, prev: impl std::fmt::Display) -> String {
    config.replacen('{', &format!("{{\"prevResult\":{prev},"), 1)
}

/// `config` as a GC request listing `valid` (container ID, ifname) pairs under the spec's key
/// only, `cni.dev/valid-attachments`.
pub fn with_valid_attachments(config: &str, valid: &[(&str, &str)]) -> String {
    let list = attachment_list(valid);
    config.replacen(
        '{',
        &format!(r#"{{"cni.dev/valid-attachments":[{list}],"#),
        1,
    )
}

/// `config` as libcni >= 1.2.3 sends a GC request: the list under both keys.
pub fn with_libcni_attachments(config: &str, valid: &[(&str, &str)]) -> String {
    let list = attachment_list(valid);
    config.replacen(
        '{',
        &format!(r#"{{"cni.dev/valid-attachments":[{list}],"cni.dev/attachments":[{list}],"#),
        1,
    )
}

fn attachment_list(valid: &[(&str, &str)]) -> String {
    let items: Vec<String> = valid
        .iter()
        .map(|(id, ifname)| format!(r#"{{"containerID":"{id}","ifname":"{ifname}"}}"#))
        .collect();
    items.join(",")
}
