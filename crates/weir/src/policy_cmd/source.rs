//! `weir policy`'s object source as the loop sees it ([`PolicySource`]): weir-source's store
//! (tracking changes), fed by a manifest directory read with the policy kinds, or by the
//! Kubernetes API watching Namespaces, Pods (with their policy part) and NetworkPolicies.

use std::path::PathBuf;
use std::time::Duration;

use tracing::info;
use weir_model::{Kind, Object};
use weir_policy::agent::{Change, Changes, PolicySource};
use weir_policy::ObjectKey;
use weir_proxy::agent::source_stale_after;
use weir_source::api::{start_api_source, ApiOptions, ApiSource, ApiStatus};
use weir_source::{watch_dir, ManifestDir, PollWatcher, SharedStore, SourceStatus};

/// Where the objects come from.
pub enum Origin {
    Manifests {
        dir: PathBuf,
        poll: Duration,
    },
    Api {
        kubeconfig: Option<PathBuf>,
        master: Option<String>,
    },
}

/// The running watcher, kept for as long as the source is.
enum Watcher {
    Manifests(PollWatcher, Duration),
    Api(ApiSource),
}

pub struct StoreSource {
    store: SharedStore,
    watcher: Watcher,
}

/// What the health endpoint asks of the source, from its own thread.
#[derive(Clone)]
pub enum SourceHealth {
    Manifests(SourceStatus, Duration),
    Api(ApiStatus),
}

impl SourceHealth {
    pub fn check(&self) -> Result<(), String> {
        match self {
            SourceHealth::Manifests(s, stale_after) => s.check(*stale_after),
            SourceHealth::Api(s) => s.check(),
        }
    }
}

/// The kinds `weir policy` asks the API for; nothing else is watched.
pub const KINDS: [Kind; 3] = [Kind::Namespace, Kind::Pod, Kind::NetworkPolicy];

impl StoreSource {
    /// Starts the watcher. It returns at once: the loop waits for the complete first view
    /// ([`PolicySource::ready`]).
    pub fn start(origin: &Origin) -> anyhow::Result<StoreSource> {
        let store = SharedStore::new();
        store.track_changes();
        let watcher = match origin {
            Origin::Manifests { dir, poll } => {
                let manifests = ManifestDir::new(dir).with_policy_objects();
                let watcher = watch_dir(
                    manifests,
                    *poll,
                    store.clone(),
                    crate::manifest_view::log_watch_event,
                );
                info!(dir = %dir.display(), "reading manifests");
                Watcher::Manifests(watcher, source_stale_after(*poll))
            }
            Origin::Api { kubeconfig, master } => {
                let opts = ApiOptions {
                    kubeconfig: kubeconfig.clone(),
                    master: master.clone(),
                    kinds: KINDS.to_vec(),
                    policy_pods: true,
                    ..Default::default()
                };
                let source =
                    start_api_source(opts, store.clone(), crate::manifest_view::log_api_report)?;
                info!(
                    server = master
                        .as_deref()
                        .unwrap_or("(from kubeconfig or in-cluster)"),
                    "watching the Kubernetes API: Namespaces, Pods, NetworkPolicies"
                );
                Watcher::Api(source)
            }
        };
        Ok(StoreSource { store, watcher })
    }

    pub fn health(&self) -> SourceHealth {
        match &self.watcher {
            Watcher::Manifests(w, stale_after) => SourceHealth::Manifests(w.status(), *stale_after),
            Watcher::Api(a) => SourceHealth::Api(a.status()),
        }
    }
}

/// A store change as the policy loop reads it; other kinds (a manifest directory shared
/// with the proxy) are not the loop's business.
pub fn change(key: &weir_model::ObjectKey, object: Option<Object>) -> Option<Change> {
    let policy_key = || ObjectKey::new(&key.namespace, &key.name);
    match key.kind {
        Kind::Namespace => Some(Change::Namespace {
            name: key.name.as_str().into(),
            now: match object {
                Some(Object::Namespace(ns)) => Some(ns),
                _ => None,
            },
        }),
        Kind::Pod => Some(Change::Pod {
            key: policy_key(),
            now: match object {
                Some(Object::Pod(p)) => p.policy.clone(),
                _ => None,
            },
        }),
        Kind::NetworkPolicy => Some(Change::Policy {
            key: policy_key(),
            now: match object {
                Some(Object::NetworkPolicy(p)) => Some(p),
                _ => None,
            },
        }),
        Kind::Service | Kind::EndpointSlice | Kind::Node => None,
    }
}

impl PolicySource for StoreSource {
    fn ready(&self) -> bool {
        match &self.watcher {
            Watcher::Manifests(w, _) => w.status().ready(),
            Watcher::Api(a) => a.status().ready(),
        }
    }

    fn check(&self) -> Result<(), String> {
        self.health().check()
    }

    fn wait_newer(&self, seen: u64, timeout: Duration) -> u64 {
        self.store.wait_newer_generation(seen, timeout)
    }

    fn take_changes(&self) -> Changes {
        let c = self.store.take_changes();
        Changes {
            generation: c.generation,
            changes: c
                .objects
                .into_iter()
                .filter_map(|(k, o)| change(&k, o))
                .collect(),
            since: c.since,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// Namespaces, Pods (their policy part) and NetworkPolicies become the loop's changes,
    /// deletions too; other kinds are left out.
    #[test]
    fn store_changes_become_the_loops() {
        let opts = weir_source::ParseOptions {
            policy: true,
            ..Default::default()
        };
        let parsed = weir_source::parse_manifest_with(
            Path::new("t.yaml"),
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n---\n\
             apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: shop, labels: {app: x}}\n\
             spec: {nodeName: n1, containers: [{name: c}]}\nstatus: {podIP: 10.0.0.1}\n---\n\
             apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: d, namespace: shop}\n\
             spec: {podSelector: {}}\n---\n\
             apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n",
            &opts,
        );
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let changes: Vec<Change> = parsed
            .objects
            .into_iter()
            .filter_map(|o| change(&o.key(), Some(o)))
            .collect();
        assert_eq!(changes.len(), 3);
        assert!(
            matches!(&changes[0], Change::Namespace { name, now: Some(_) } if &**name == "shop")
        );
        assert!(matches!(&changes[1], Change::Pod { key, now: Some(p) }
            if key.to_string() == "shop/p" && p.value.labels.len() == 1));
        assert!(matches!(&changes[2], Change::Policy { now: Some(_), .. }));
        let gone = weir_model::ObjectKey::new(Kind::NetworkPolicy, "shop", "d");
        assert!(matches!(
            change(&gone, None),
            Some(Change::Policy { now: None, .. })
        ));
    }
}
