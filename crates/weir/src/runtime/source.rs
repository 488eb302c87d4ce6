//! The one object source of a node: a manifest directory or the Kubernetes API feeding one
//! store, whatever parts read it. Every agent command starts its source here.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};
use weir_model::Kind;
use weir_proxy::agent::{release_freed_memory, source_stale_after};
use weir_source::api::{start_api_source, ApiOptions, ApiReport, ApiSource, ApiStatus, Selectors};
use weir_source::{
    watch_dir, Limits, ManifestDir, PollWatcher, SharedStore, SourceStatus, WatchEvent,
};

/// Where the objects come from.
#[derive(Debug, Clone)]
pub enum Origin {
    Manifests {
        dir: PathBuf,
        poll: Duration,
        /// Largest file read (`None`: weir-source's default).
        max_file_bytes: Option<u64>,
        /// Last-known-good copies of the files' objects, kept across restarts.
        state_dir: Option<PathBuf>,
    },
    Api {
        /// With `master` also `None`: the in-cluster service account.
        kubeconfig: Option<PathBuf>,
        master: Option<String>,
        /// `None`: weir-source's default.
        watch_timeout: Option<Duration>,
    },
}

impl Origin {
    /// The source the flags name, the same way in every command: the Kubernetes API when
    /// `--kubeconfig` or `--master` is given, else `--manifests`, else (in a pod) the
    /// in-cluster service account.
    pub fn choose(
        manifests: Option<&PathBuf>,
        kubeconfig: Option<&PathBuf>,
        master: Option<&String>,
        poll: Duration,
    ) -> anyhow::Result<Origin> {
        let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some_and(|v| !v.is_empty());
        let use_api = kubeconfig.is_some() || master.is_some();
        if let Some(dir) = manifests.filter(|_| !use_api) {
            return Ok(Origin::Manifests {
                dir: dir.clone(),
                poll,
                max_file_bytes: None,
                state_dir: None,
            });
        }
        anyhow::ensure!(
            use_api || in_cluster,
            "no object source: give --manifests DIR, or --kubeconfig / --master (in a pod the \
             in-cluster service account is used)"
        );
        Ok(Origin::Api {
            kubeconfig: kubeconfig.cloned(),
            master: master.cloned(),
            watch_timeout: None,
        })
    }

    /// Where the API is, for the writes a part makes (node routes' Node annotations).
    pub fn api_options(&self) -> Option<ApiOptions> {
        match self {
            Origin::Api {
                kubeconfig, master, ..
            } => Some(ApiOptions {
                kubeconfig: kubeconfig.clone(),
                master: master.clone(),
                ..ApiOptions::default()
            }),
            Origin::Manifests { .. } => None,
        }
    }
}

/// Blocks until the source holds one complete view, saying why it waits after a second and
/// every 10 s after that: nothing is programmed from a partial world.
pub fn wait_ready(health: &SourceHealth) {
    let started = std::time::Instant::now();
    let mut next_say = Duration::from_secs(1);
    let mut said = false;
    while !health.ready() {
        if started.elapsed() >= next_say {
            if let Err(why) = health.check() {
                warn!("waiting for a complete view of the cluster: {why}");
                said = true;
            }
            next_say += Duration::from_secs(10);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if said {
        info!("object source ready");
    }
}

/// What the parts together read: each kind is listed and watched once, whatever set of parts
/// is enabled.
#[derive(Debug, Clone, Default)]
pub struct Wanted {
    pub kinds: Vec<Kind>,
    /// Pods with what NetworkPolicy reads (labels, node, named ports).
    pub policy_pods: bool,
    /// Watch only this Node (the proxy alone reads only its own); `None`: every Node.
    pub only_node: Option<String>,
    /// kube-proxy's Service and EndpointSlice selectors, or everything (DNS).
    pub selectors: Selectors,
}

impl Wanted {
    /// Adds a part's needs: the union of kinds; every Node as soon as one part reads them
    /// all; everything once one part needs what kube-proxy's selectors leave out.
    pub fn add(&mut self, part: Wanted) {
        let all_nodes = part.kinds.contains(&Kind::Node) && part.only_node.is_none();
        let first_nodes = !self.kinds.contains(&Kind::Node);
        for k in part.kinds {
            if !self.kinds.contains(&k) {
                self.kinds.push(k);
            }
        }
        self.policy_pods |= part.policy_pods;
        if all_nodes || (!first_nodes && self.only_node != part.only_node) {
            self.only_node = None;
        } else if first_nodes {
            self.only_node = part.only_node;
        }
        if part.selectors == Selectors::Everything {
            self.selectors = Selectors::Everything;
        }
    }
}

/// Where the source's reports go besides the log (the proxy's source metrics).
pub trait SourceReports: Send + Sync {
    fn api(&self, _report: &ApiReport) {}
    fn scanned(&self, _event: &WatchEvent<'_>) {}
}

/// No reports beyond the log.
pub struct LogOnly;
impl SourceReports for LogOnly {}

enum Watcher {
    Manifests(PollWatcher, Duration),
    Api(ApiSource),
}

/// The running source and the store it fills. Dropping it stops the watchers.
pub struct RunningSource {
    store: SharedStore,
    watcher: Watcher,
}

/// What health endpoints ask of the source, from their own threads.
#[derive(Clone)]
pub enum SourceHealth {
    Manifests(SourceStatus, Duration),
    Api(ApiStatus),
    /// Objects read once, complete (`weir routes --once`): nothing to go stale.
    ReadOnce,
}

impl SourceHealth {
    /// A complete first view is in the store (for the API: every kind's first list).
    pub fn ready(&self) -> bool {
        match self {
            SourceHealth::Manifests(s, _) => s.ready(),
            SourceHealth::Api(s) => s.ready(),
            SourceHealth::ReadOnce => true,
        }
    }

    /// `Ok` while the source is current; otherwise why not.
    pub fn check(&self) -> Result<(), String> {
        match self {
            SourceHealth::Manifests(s, stale_after) => s.check(*stale_after),
            SourceHealth::Api(s) => s.check(),
            SourceHealth::ReadOnce => Ok(()),
        }
    }
}

impl RunningSource {
    /// Starts watching `origin` for `wanted` into a new store. Returns at once: consumers
    /// wait for [`SourceHealth::ready`] before using the store.
    pub fn start(
        origin: &Origin,
        wanted: &Wanted,
        reports: Arc<dyn SourceReports>,
    ) -> anyhow::Result<Self> {
        let store = SharedStore::new();
        let watcher = match origin {
            Origin::Manifests {
                dir,
                poll,
                max_file_bytes,
                state_dir,
            } => {
                let limits = Limits {
                    max_file_bytes: max_file_bytes.unwrap_or(Limits::default().max_file_bytes),
                    ..Limits::default()
                };
                let manifests = manifest_dir(dir, limits, state_dir.as_ref(), wanted);
                let watcher = watch_dir(manifests, *poll, store.clone(), move |ev| {
                    crate::manifest_view::log_watch_event(ev);
                    // A long scan parsed a lot: hand the parser's garbage back to the kernel.
                    if let WatchEvent::Scanned { duration, .. } = ev {
                        if duration > Duration::from_millis(100) {
                            release_freed_memory();
                        }
                    }
                    reports.scanned(&ev);
                });
                info!(dir = %dir.display(), "reading manifests");
                Watcher::Manifests(watcher, source_stale_after(*poll))
            }
            Origin::Api {
                kubeconfig,
                master,
                watch_timeout,
            } => {
                let mut opts = ApiOptions {
                    kubeconfig: kubeconfig.clone(),
                    master: master.clone(),
                    node_name: wanted.only_node.clone(),
                    selectors: wanted.selectors,
                    kinds: wanted.kinds.clone(),
                    policy_pods: wanted.policy_pods,
                    ..Default::default()
                };
                if let Some(t) = watch_timeout {
                    opts.watch_timeout = *t;
                }
                let source = start_api_source(opts, store.clone(), move |r| {
                    crate::manifest_view::log_api_report(r);
                    reports.api(r);
                })?;
                let kinds: Vec<&str> = wanted.kinds.iter().map(|k| k.as_str()).collect();
                info!(
                    server = master
                        .as_deref()
                        .unwrap_or("(from kubeconfig or in-cluster)"),
                    kinds = kinds.join(","),
                    "watching the Kubernetes API"
                );
                Watcher::Api(source)
            }
        };
        Ok(RunningSource { store, watcher })
    }

    pub fn store(&self) -> &SharedStore {
        &self.store
    }

    pub fn health(&self) -> SourceHealth {
        match &self.watcher {
            Watcher::Manifests(w, stale_after) => SourceHealth::Manifests(w.status(), *stale_after),
            Watcher::Api(a) => SourceHealth::Api(a.status()),
        }
    }
}

/// The manifest directory, reading the policy kinds when a part wants them, with
/// last-known-good copies when a state directory is given and usable.
fn manifest_dir(
    dir: &PathBuf,
    limits: Limits,
    state_dir: Option<&PathBuf>,
    wanted: &Wanted,
) -> ManifestDir {
    let fresh = || {
        let d = ManifestDir::with_limits(dir, limits.clone());
        if wanted.policy_pods || wanted.kinds.contains(&Kind::NetworkPolicy) {
            d.with_policy_objects()
        } else {
            d
        }
    };
    let Some(state_dir) = state_dir else {
        return fresh();
    };
    match fresh().with_last_good(state_dir) {
        Ok(d) => d,
        Err(e) => {
            warn!(
                state_dir = %state_dir.display(),
                "no last-known-good copies (an invalid manifest will not survive a restart): {e}"
            );
            fresh()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(kinds: &[Kind], only_node: Option<&str>) -> Wanted {
        Wanted {
            kinds: kinds.to_vec(),
            only_node: only_node.map(String::from),
            ..Wanted::default()
        }
    }

    /// The agent's parts together: each kind once; the proxy's own-Node watch widens to
    /// every Node when routes read them all, whichever part comes first.
    #[test]
    fn parts_share_one_watch_per_kind() {
        let proxy = part(
            &[Kind::Service, Kind::EndpointSlice, Kind::Node],
            Some("n1"),
        );
        let routes = part(&[Kind::Node], None);
        let mut policy = part(&[Kind::Namespace, Kind::Pod, Kind::NetworkPolicy], None);
        policy.policy_pods = true;

        let mut w = Wanted::default();
        w.add(proxy.clone());
        assert_eq!(
            w.only_node.as_deref(),
            Some("n1"),
            "the proxy alone: its Node"
        );
        w.add(routes.clone());
        w.add(policy.clone());
        assert_eq!(w.kinds.len(), 6);
        assert_eq!(w.only_node, None);
        assert!(w.policy_pods);
        assert_eq!(w.selectors, Selectors::KubeProxy);

        let mut w = Wanted::default();
        w.add(routes);
        w.add(proxy.clone());
        assert_eq!(w.only_node, None, "routes first, then the proxy");

        let mut w = Wanted::default();
        w.add(policy);
        w.add(proxy);
        assert_eq!(w.only_node.as_deref(), Some("n1"), "policy reads no Node");
        w.add(Wanted {
            kinds: vec![Kind::Service],
            selectors: Selectors::Everything,
            ..Wanted::default()
        });
        assert_eq!(w.selectors, Selectors::Everything);
    }
}
