//! Last-known-good copies of each manifest file's objects, kept on disk so that a restart
//! serves an object whose file turned invalid while weir was not running from its last valid
//! version, instead of dropping it (its ClusterIP would time out).
//!
//! One file per manifest file: `<state dir>/<FNV-1a of the path>.yaml`, a YAML stream of the
//! objects, whose first line names the manifest file. Written atomically (temporary file,
//! then rename), so a crash leaves the old copy or the new one.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use weir_model::{Object, ObjectKey};

const HEADER: &str = "# weir last-known-good copy of: ";

#[derive(Debug)]
pub struct LastGood {
    dir: PathBuf,
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What weir kept of the object (see `weir_model::compact`), as a Kubernetes object: reading
/// the copy back gives the same object. `None` for NetworkPolicies: weir keeps them in a
/// compiled form (unreadable parts already turned into "allows nothing") that has no faithful
/// Kubernetes spelling, so no copy is kept; only the proxy keeps last-known-good copies, and
/// it does not read them.
fn to_yaml(o: &Object) -> Result<Option<String>, serde_saphyr::ser::Error> {
    use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    match o {
        Object::Service(s) => crate::yaml::to_string(&Service::from(&**s)).map(Some),
        Object::EndpointSlice(s) => crate::yaml::to_string(&EndpointSlice::from(&**s)).map(Some),
        Object::Node(n) => crate::yaml::to_string(&Node::from(&**n)).map(Some),
        Object::Pod(p) => crate::yaml::to_string(&Pod::from(&**p)).map(Some),
        Object::Namespace(n) => crate::yaml::to_string(&Namespace::from(&**n)).map(Some),
        Object::NetworkPolicy(_) => Ok(None),
    }
}

impl LastGood {
    pub fn open(dir: PathBuf) -> io::Result<LastGood> {
        fs::create_dir_all(&dir)?;
        Ok(LastGood { dir })
    }

    fn copy_path(&self, manifest: &Path) -> PathBuf {
        use std::os::unix::ffi::OsStrExt;
        let h = fnv1a(manifest.as_os_str().as_bytes());
        self.dir.join(format!("{h:016x}.yaml"))
    }

    /// Replaces the copy of `manifest` with `objects`.
    pub fn save(&self, manifest: &Path, objects: &BTreeMap<ObjectKey, Object>) -> io::Result<()> {
        let mut text = format!("{HEADER}{}\n", manifest.display());
        for o in objects.values() {
            if let Some(yaml) = to_yaml(o).map_err(io::Error::other)? {
                text.push_str("---\n");
                text.push_str(&yaml);
            }
        }
        let dest = self.copy_path(manifest);
        // Per process: several proxies (a lab's nodes) may share a state directory.
        let tmp = dest.with_extension(format!("{}.tmp", std::process::id()));
        let mut f = fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_data()?;
        fs::rename(&tmp, &dest)
    }

    /// The objects of the copy of `manifest` (none if there is no valid copy), read as the
    /// directory reads its files.
    pub fn load(&self, manifest: &Path, opts: &crate::ParseOptions) -> Vec<Object> {
        let path = self.copy_path(manifest);
        let Ok(text) = fs::read_to_string(&path) else {
            return Vec::new();
        };
        if Self::names(&text) != Some(manifest) {
            return Vec::new(); // a hash collision: not this file's copy
        }
        let parsed = crate::parse_manifest_with(&path, &text, opts);
        for e in &parsed.errors {
            tracing::warn!("last-known-good copy: {e}");
        }
        parsed.objects
    }

    fn names(text: &str) -> Option<&Path> {
        let first = text.lines().next()?;
        Some(Path::new(first.strip_prefix(HEADER)?))
    }

    /// Deletes the copy of `manifest` (the file was deleted: it must not come back).
    pub fn remove(&self, manifest: &Path) {
        let _ = fs::remove_file(self.copy_path(manifest));
    }

    /// Deletes the copies of files under `root` for which `exists` is false.
    pub fn prune(&self, root: &Path, exists: &dyn Fn(&Path) -> bool) {
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return;
        };
        for ent in rd.flatten() {
            let Ok(text) = fs::read_to_string(ent.path()) else {
                continue;
            };
            if let Some(file) = Self::names(&text) {
                if file.starts_with(root) && !exists(file) {
                    let _ = fs::remove_file(ent.path());
                }
            }
        }
    }
}
