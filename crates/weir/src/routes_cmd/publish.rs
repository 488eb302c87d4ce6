//! What the routes agent tells the world: this node's annotations (a Node patch) and the
//! per-node status, written atomically and logged when they change.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;
use tracing::{info, warn};
use weir_routes::annotations::{Annotations, VtepData};
use weir_routes::plan::Desired;
use weir_routes::{Backend, Config, NodeStatus};

pub struct Publisher {
    node_name: String,
    backend: Backend,
    keys: Annotations,
    publish: Option<PathBuf>,
    status: Option<PathBuf>,
    mtu_file: PathBuf,
    /// What the MTU file holds as far as this process knows (None: not written yet).
    last_mtu: Option<Option<u32>>,
    last_annotations: Option<BTreeMap<String, String>>,
    last_status: Option<Status>,
    /// Patches this node's annotations onto its Node in the API (with the API source).
    patch_node: Option<NodePatcher>,
}

/// Puts annotations on this node's Node object; an error is retried at the next report.
pub type NodePatcher = Box<dyn FnMut(&BTreeMap<String, String>) -> anyhow::Result<()>>;

/// The status file: the overlay MTU (for the CNI plugin's pod MTU) and every remote node's state.
#[derive(Debug, Clone, PartialEq, Serialize)]
struct Status {
    node: String,
    backend: &'static str,
    /// The VTEP's MTU (vxlan); pods should use it.
    #[serde(skip_serializing_if = "Option::is_none")]
    mtu: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    blocked: Option<String>,
    nodes: BTreeMap<String, NodeReport>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
struct NodeReport {
    routed: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    refused: Vec<String>,
}

#[derive(Serialize)]
struct NodePatch<'a> {
    metadata: PatchMetadata<'a>,
}
#[derive(Serialize)]
struct PatchMetadata<'a> {
    annotations: &'a BTreeMap<String, String>,
}

impl Publisher {
    pub fn new(
        cfg: &Config,
        publish: Option<PathBuf>,
        status: Option<PathBuf>,
        mtu_file: PathBuf,
    ) -> Self {
        Publisher {
            node_name: cfg.node_name.clone(),
            backend: cfg.backend.clone(),
            keys: Annotations::new(&cfg.annotation_prefix),
            publish,
            status,
            mtu_file,
            last_mtu: None,
            last_annotations: None,
            last_status: None,
            patch_node: None,
        }
    }

    /// Also publish through the API: the annotations are merged into this node's Node.
    pub fn patch_node_with(mut self, patcher: NodePatcher) -> Self {
        self.patch_node = Some(patcher);
        self
    }

    pub fn report(&mut self, desired: &Desired) -> anyhow::Result<()> {
        self.report_status(desired)?;
        if desired.blocked.is_none() {
            self.report_mtu(desired)?;
            self.report_annotations(desired)?;
        }
        Ok(())
    }

    /// The pod MTU file: the VTEP's MTU (vxlan), one decimal line; absent under host-gw, where
    /// pods keep the MTU their conflist (or weir-cni's default) gives them.
    fn report_mtu(&mut self, desired: &Desired) -> anyhow::Result<()> {
        let mtu = desired.vtep.as_ref().map(|v| v.mtu);
        if self.last_mtu == Some(mtu) {
            return Ok(());
        }
        match mtu {
            Some(m) => {
                write_atomic(&self.mtu_file, &format!("{m}\n"))?;
                info!(mtu = m, file = %self.mtu_file.display(), "pod MTU for weir-cni");
            }
            None => match std::fs::remove_file(&self.mtu_file) {
                Ok(()) => info!(file = %self.mtu_file.display(), "host-gw: pod MTU file removed"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(e).with_context(|| format!("remove {}", self.mtu_file.display()))
                }
            },
        }
        self.last_mtu = Some(mtu);
        Ok(())
    }

    fn report_annotations(&mut self, desired: &Desired) -> anyhow::Result<()> {
        let (vtep, underlay) = match (&self.backend, &desired.vtep) {
            (Backend::Vxlan(vx), Some(v)) => (
                Some(VtepData {
                    vni: Some(vx.vni),
                    mac: v.mac,
                }),
                Some(v.local),
            ),
            _ => (None, None),
        };
        let annotations = self
            .keys
            .publish(self.backend.type_name(), vtep.as_ref(), underlay);
        if self.last_annotations.as_ref() == Some(&annotations) {
            return Ok(());
        }
        let patch = NodePatch {
            metadata: PatchMetadata {
                annotations: &annotations,
            },
        };
        let yaml = serde_saphyr::to_string(&patch)?;
        info!(node = %self.node_name, ?annotations, "publish on this Node");
        if let Some(path) = &self.publish {
            let text = format!(
                "# weir routes: this node's overlay annotations\n# kubectl patch node {} --patch-file {}\n{yaml}",
                self.node_name,
                path.display()
            );
            write_atomic(path, &text)?;
        }
        if let Some(patch) = &mut self.patch_node {
            if let Err(e) = patch(&annotations) {
                // Not recorded as published: the next reconciliation tries again.
                warn!(node = %self.node_name, error = %e, "cannot publish on this Node yet");
                return Ok(());
            }
            info!(node = %self.node_name, "published on this Node through the API");
        }
        self.last_annotations = Some(annotations);
        Ok(())
    }

    fn report_status(&mut self, desired: &Desired) -> anyhow::Result<()> {
        let nodes = desired
            .status
            .iter()
            .map(|(name, s)| {
                let report = match s {
                    NodeStatus::Routed { pod_cidrs } => NodeReport {
                        routed: pod_cidrs.iter().map(|c| c.to_string()).collect(),
                        refused: Vec::new(),
                    },
                    NodeStatus::Refused { routed, reasons } => NodeReport {
                        routed: routed.iter().map(|c| c.to_string()).collect(),
                        refused: reasons.clone(),
                    },
                };
                (name.clone(), report)
            })
            .collect();
        let status = Status {
            node: self.node_name.clone(),
            backend: self.backend.type_name(),
            mtu: desired.vtep.as_ref().map(|v| v.mtu),
            blocked: desired.blocked.clone(),
            nodes,
        };
        if self.last_status.as_ref() == Some(&status) {
            return Ok(());
        }
        if let Some(b) = &status.blocked {
            warn!(reason = %b, "routes: nothing programmed");
        }
        for (name, n) in &status.nodes {
            let before = self.last_status.as_ref().and_then(|s| s.nodes.get(name));
            if before != Some(n) && !n.refused.is_empty() {
                warn!(node = %name, reasons = ?n.refused, "routes refused");
            }
        }
        if let Some(path) = &self.status {
            write_atomic(path, &(serde_json::to_string_pretty(&status)? + "\n"))?;
        }
        self.last_status = Some(status);
        Ok(())
    }
}

/// Writes through a temporary file and a rename, so readers never see half a file.
fn write_atomic(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("rename to {}", path.display()))
}
