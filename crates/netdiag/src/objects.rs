//! Kubernetes objects for doctor's NetworkPolicy checks: Namespaces, Pods and
//! NetworkPolicies from manifests or a `kubectl get namespaces,pods,networkpolicies -A -o
//! yaml` (or `-o json`) dump, read as `weir policy --manifests` reads them (weir-source's
//! parser with the policy kinds) into weir-policy's [`Cluster`]. Files are told apart by
//! content, not by name: any YAML or JSON holding `apiVersion` and `kind` is tried.

use std::path::Path;

use weir_policy::Cluster;
use weir_source::{parse_manifest_with, Object, ParseOptions};

/// The objects read and what was wrong with them.
#[derive(Debug, Clone, Default)]
pub struct Objects {
    pub cluster: Cluster,
    /// The files that held policy objects.
    pub files: Vec<String>,
    /// Objects or files that could not be read (file: object: message).
    pub errors: Vec<String>,
    /// What conversion could not read as written, and its safe outcome.
    pub warnings: Vec<String>,
}

/// Whether `text` looks like Kubernetes objects: keys `apiVersion` and `kind`, at the start
/// of a YAML line or quoted as JSON keys.
pub fn looks_like_objects(text: &str) -> bool {
    let has = |key: &str| {
        text.contains(&format!("\"{key}\":"))
            || text.contains(&format!("\"{key}\" :"))
            || text.lines().any(|l| {
                let l = l.trim_start().trim_start_matches(['-', ' ']);
                l.starts_with(&format!("{key}:"))
            })
    };
    has("apiVersion") && has("kind")
}

impl Objects {
    /// Whether any object was read.
    pub fn is_empty(&self) -> bool {
        self.cluster.namespaces.is_empty()
            && self.cluster.pods.is_empty()
            && self.cluster.policies.is_empty()
    }

    /// Reads one file's text; returns how many Namespaces, Pods and NetworkPolicies it
    /// held (other kinds are not doctor's business here).
    pub fn add_text(&mut self, file: &str, text: &str) -> usize {
        let opts = ParseOptions {
            policy: true,
            ..ParseOptions::default()
        };
        let parsed = parse_manifest_with(Path::new(file), text, &opts);
        self.errors
            .extend(parsed.errors.iter().map(ToString::to_string));
        let mut read = 0;
        for o in parsed.objects {
            match o {
                Object::Namespace(ns) => self.cluster.insert_namespace(ns),
                Object::Pod(p) => {
                    let Some(part) = &p.policy else { continue };
                    self.warnings
                        .extend(part.warnings.iter().map(ToString::to_string));
                    self.cluster.insert_pod(part.value.clone());
                }
                Object::NetworkPolicy(np) => {
                    self.warnings
                        .extend(np.warnings.iter().map(ToString::to_string));
                    self.cluster.insert_policy(np.value.clone());
                }
                _ => continue,
            }
            read += 1;
        }
        if read > 0 && !self.files.iter().any(|f| f == file) {
            self.files.push(file.to_string());
        }
        read
    }

    /// Reads a file, or every `.yaml`, `.yml` and `.json` file under a directory (symlinks
    /// to directories are not followed).
    pub fn add_path(&mut self, path: &Path) -> std::io::Result<()> {
        let meta = std::fs::metadata(path)?;
        if meta.is_file() {
            let text = std::fs::read_to_string(path)
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
            self.add_text(&path.display().to_string(), &text);
            return Ok(());
        }
        let mut entries: Vec<_> = std::fs::read_dir(path)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let name = e.file_name().to_string_lossy().into_owned();
            let kind = e.file_type()?;
            let manifest = [".yaml", ".yml", ".json"].iter().any(|s| name.ends_with(s));
            if kind.is_dir() || kind.is_file() && manifest {
                self.add_path(&e.path())?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubectl_list_is_read_by_content_and_other_kinds_are_left_out() {
        let dump = r#"apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Namespace
  metadata: {name: shop, labels: {team: x}}
- apiVersion: v1
  kind: Pod
  metadata: {namespace: shop, name: web-0, labels: {app: web}}
  spec: {nodeName: n1, containers: [{name: c, ports: [{name: http, containerPort: 8080}]}]}
  status: {phase: Running, podIP: 10.0.0.1}
- apiVersion: v1
  kind: Service
  metadata: {namespace: shop, name: web}
  spec: {ports: [{port: 80}]}
- apiVersion: networking.k8s.io/v1
  kind: NetworkPolicy
  metadata: {namespace: shop, name: deny}
  spec: {podSelector: {}, ingress: [{ports: [{port: 99999}]}]}
"#;
        assert!(looks_like_objects(dump));
        assert!(!looks_like_objects(
            "Chain FORWARD (policy DROP)\nkind of\n"
        ));
        let mut o = Objects::default();
        assert_eq!(o.add_text("objects.yaml", dump), 3);
        assert_eq!(o.cluster.pods.len(), 1);
        assert_eq!(o.cluster.policies.len(), 1);
        assert!(o.cluster.namespaces.contains_key("shop"));
        assert_eq!(o.files, ["objects.yaml"]);
        // The out-of-range port is said with its field and safe outcome.
        assert!(
            o.warnings
                .iter()
                .any(|w| w.contains("spec.ingress[0].ports[0]")),
            "{:?}",
            o.warnings
        );
        let json = r#"{"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
             "metadata": {"namespace": "a", "name": "b"}, "spec": {"podSelector": {}}}]}"#;
        assert!(looks_like_objects(json));
        assert_eq!(o.add_text("objects.json", json), 1);
        assert_eq!(o.cluster.policies.len(), 2);
    }
}
