//! The proxy's object source as the loop sees it ([`ObjectSource`]): weir-source's store,
//! fed by a manifest directory watcher or the Kubernetes API watchers, whose reports go to
//! the log and the agent's metrics.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};
use weir_model::{Object, ObjectKey};
use weir_proxy::agent::{release_freed_memory, source_stale_after, ObjectSource};
use weir_proxy::health::SourceCheck;
use weir_proxy::metrics::ProxyMetrics;
use weir_source::api::{start_api_source, ApiReport, ApiSource};
use weir_source::{watch_dir, Changes, Limits, ManifestDir, PollWatcher, SharedStore, WatchEvent};

use super::config::{ApiSettings, Settings};

/// The running watcher: a manifest directory or the Kubernetes API.
enum Watcher {
    Manifests(PollWatcher, Duration),
    Api(ApiSource),
}

/// The store the watcher fills (tracking changes for the loop) and the watcher's status.
pub struct StoreSource {
    store: SharedStore,
    watcher: Watcher,
}

impl StoreSource {
    /// Starts the configured source: the Kubernetes API when one is configured, else the
    /// manifest directory. Its reports go to the log and to `metrics`.
    pub fn start(settings: &Settings, metrics: &Arc<ProxyMetrics>) -> anyhow::Result<Self> {
        let store = SharedStore::new();
        // The loop plans per change: the store remembers which objects changed.
        store.track_changes();
        let watcher = match &settings.api {
            Some(api) => Watcher::Api(start_api(settings, api, &store, metrics)?),
            None => Watcher::Manifests(
                start_manifests(settings, &store, metrics),
                source_stale_after(settings.manifest_poll_interval),
            ),
        };
        Ok(Self { store, watcher })
    }
}

impl ObjectSource for StoreSource {
    fn ready(&self) -> bool {
        match &self.watcher {
            Watcher::Manifests(w, _) => w.status().ready(),
            Watcher::Api(a) => a.status().ready(),
        }
    }

    fn check(&self) -> Result<(), String> {
        match &self.watcher {
            Watcher::Manifests(w, stale_after) => w.status().check(*stale_after),
            Watcher::Api(a) => a.status().check(),
        }
    }

    fn health_check(&self) -> SourceCheck {
        match &self.watcher {
            Watcher::Manifests(w, stale_after) => {
                let (status, stale_after) = (w.status(), *stale_after);
                Box::new(move || status.check(stale_after))
            }
            Watcher::Api(a) => {
                let status = a.status();
                Box::new(move || status.check())
            }
        }
    }

    fn wait_newer(&self, seen: u64, timeout: Duration) -> u64 {
        self.store.wait_newer_generation(seen, timeout)
    }

    fn take_changes(&self) -> Changes {
        self.store.take_changes()
    }

    fn get(&self, key: &ObjectKey) -> Option<Object> {
        self.store.get(key)
    }
}

/// Starts the API watchers; their reports go to the log and the metrics.
fn start_api(
    settings: &Settings,
    api: &ApiSettings,
    store: &SharedStore,
    metrics: &Arc<ProxyMetrics>,
) -> anyhow::Result<ApiSource> {
    let opts = weir_source::api::ApiOptions {
        kubeconfig: api.kubeconfig.clone(),
        master: api.master.clone(),
        node_name: Some(settings.node_name.clone()),
        watch_timeout: api.watch_timeout,
        ..Default::default()
    };
    let metrics = metrics.clone();
    let source = start_api_source(opts, store.clone(), move |r| {
        crate::manifest_view::log_api_report(r);
        match r {
            ApiReport::Listed { kind, objects } => metrics.source_listed(kind.as_str(), *objects),
            ApiReport::Objects { kind, objects } => metrics.source_objects(kind.as_str(), *objects),
            ApiReport::Failed { kind, .. } => metrics.source_watch_restarted(kind.as_str()),
            ApiReport::Recovered { .. } | ApiReport::Compat { .. } => {}
        }
    })?;
    info!(
        server = api
            .master
            .as_deref()
            .unwrap_or("(from kubeconfig or in-cluster)"),
        "watching the Kubernetes API"
    );
    Ok(source)
}

/// Starts the manifest watcher (with last-known-good copies under the state directory) and
/// wires its reports into the log and the metrics.
fn start_manifests(
    settings: &Settings,
    store: &SharedStore,
    metrics: &Arc<ProxyMetrics>,
) -> PollWatcher {
    let limits = Limits {
        max_file_bytes: settings.manifest_max_file_size,
        ..Limits::default()
    };
    let fresh = || ManifestDir::with_limits(&settings.manifests, limits.clone());
    let dir = match fresh().with_last_good(&settings.state_dir) {
        Ok(dir) => dir,
        Err(e) => {
            warn!(
                state_dir = %settings.state_dir.display(),
                "no last-known-good copies (an invalid manifest will not survive a restart): {e}"
            );
            fresh()
        }
    };
    let metrics = metrics.clone();
    watch_dir(
        dir,
        settings.manifest_poll_interval,
        store.clone(),
        move |ev| {
            match &ev {
                WatchEvent::Error(e) => warn!("{e}"),
                WatchEvent::Resolved(e) => info!("resolved: {e}"),
                // A long scan parsed a lot: hand the parser's garbage back to the kernel.
                WatchEvent::Scanned { duration, .. } if *duration > Duration::from_millis(100) => {
                    release_freed_memory()
                }
                WatchEvent::Scanned { .. } => {}
            }
            match ev {
                WatchEvent::Error(_) => metrics.source_errors_changed(1),
                WatchEvent::Resolved(_) => metrics.source_errors_changed(-1),
                WatchEvent::Scanned { duration, failed } => {
                    metrics.source_scanned(duration, failed)
                }
            }
        },
    )
}
