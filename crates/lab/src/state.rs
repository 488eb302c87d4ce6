//! What a running lab is made of, as recorded in `<state dir>/<lab>/state.json`.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::topology::CniKind;

/// The root of all labs' state: `${WEIR_LAB_STATE:-/run/weir-lab}`.
pub fn state_root() -> PathBuf {
    std::env::var_os("WEIR_LAB_STATE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/weir-lab"))
}

/// The files of one lab.
#[derive(Debug, Clone)]
pub struct LabDir {
    pub dir: PathBuf,
}

impl LabDir {
    pub fn new(root: &Path, lab: &str) -> Self {
        Self {
            dir: root.join(lab),
        }
    }
    pub fn topology(&self) -> PathBuf {
        self.dir.join("topology.yaml")
    }
    pub fn state(&self) -> PathBuf {
        self.dir.join("state.json")
    }
    pub fn node_cni(&self, node: &str) -> PathBuf {
        self.dir.join("nodes").join(node).join("cni")
    }
    pub fn ipam(&self, node: &str) -> PathBuf {
        self.node_cni(node).join("ipam")
    }
    pub fn log(&self, netns: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{netns}.log"))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeState {
    pub name: String,
    pub netns: String,
    pub underlay_ip: Ipv4Addr,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodState {
    pub node: String,
    pub name: String,
    pub netns: String,
    pub ip: Ipv4Addr,
    pub prefix_len: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EchoState {
    pub netns: String,
    pub name: String,
    pub pid: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabState {
    pub lab: String,
    pub cni: CniKind,
    pub outside: Ipv4Addr,
    pub nodes: Vec<NodeState>,
    pub pods: Vec<PodState>,
    pub echo: Vec<EchoState>,
}

impl LabState {
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parse {}", path.display()))
    }

    /// Writes atomically (temp file + rename), so a crash never leaves half a file.
    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)
            .with_context(|| format!("write {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("rename to {}", path.display()))?;
        Ok(())
    }
}
