//! The Kubernetes API source: Services, EndpointSlices and Nodes watched with kube-rs, fed into
//! an [`EventSink`] as the manifest watcher's objects are.
//!
//! Per kind, kube-runtime's `watcher` lists (paged), then watches from the list's
//! resourceVersion with bookmarks, resumes a dropped watch from the last resourceVersion it
//! saw, and lists again after `410 Gone`. Each complete list becomes one
//! [`Event::Listed`] (so deletions missed while the watch was down are applied); each watch
//! event an [`Event::Applied`] or [`Event::Deleted`]. kube-rs runs on its own small tokio
//! runtime thread; the consumer stays synchronous and learns from [`ApiStatus`] when every
//! kind's first list is in (it must not sync before) and when the source is failing.

use std::collections::{BTreeMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher;
use kube::{Api, Client, Config, Resource};
use serde::de::DeserializeOwned;
use weir_model::{Kind, Object};

use crate::served::{
    discover_slice_version, refuses_field_selector, EndpointSliceV1beta1, FieldFilter, SliceVersion,
};
use crate::store::{Event, EventSink};

/// kube-proxy's selector for Services: not those another proxy implementation owns
/// (`service.kubernetes.io/service-proxy-name`); plus its field selector: not headless.
pub const SERVICE_LABEL_SELECTOR: &str = "!service.kubernetes.io/service-proxy-name";
/// Servers before 1.22 refuse it (400): the watch then drops it and filters on its side.
pub use crate::served::SERVICE_FIELD_SELECTOR;
/// kube-proxy's selector for EndpointSlices: not the slices of headless Services.
pub const ENDPOINTSLICE_LABEL_SELECTOR: &str = "!service.kubernetes.io/headless";

/// Which Services and EndpointSlices are asked for. The default is kube-proxy's; a consumer
/// that needs what kube-proxy leaves out asks for everything (`weir dns` needs headless
/// Services and their slices, and services other proxies own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Selectors {
    /// [`SERVICE_LABEL_SELECTOR`], [`SERVICE_FIELD_SELECTOR`], [`ENDPOINTSLICE_LABEL_SELECTOR`].
    #[default]
    KubeProxy,
    /// Every Service and EndpointSlice (the cluster DNS's view, as CoreDNS's).
    Everything,
}

impl Selectors {
    /// (Service labels, Service fields, EndpointSlice labels).
    fn terms(
        self,
    ) -> (
        Option<&'static str>,
        Option<FieldFilter>,
        Option<&'static str>,
    ) {
        match self {
            Selectors::KubeProxy => (
                Some(SERVICE_LABEL_SELECTOR),
                Some(FieldFilter::NotHeadless),
                Some(ENDPOINTSLICE_LABEL_SELECTOR),
            ),
            Selectors::Everything => (None, None, None),
        }
    }
}

/// A watcher configuration with the selectors that are set.
fn selected(labels: Option<&str>, fields: Option<&str>) -> watcher::Config {
    let mut c = watcher::Config::default();
    if let Some(l) = labels {
        c = c.labels(l);
    }
    if let Some(f) = fields {
        c = c.fields(f);
    }
    c
}

/// Where the API server is and how the watches behave.
#[derive(Debug, Clone)]
pub struct ApiOptions {
    /// A kubeconfig file (kube-proxy's `--kubeconfig`).
    pub kubeconfig: Option<PathBuf>,
    /// The API server's address, overriding the kubeconfig's (kube-proxy's `--master`).
    /// With neither, the in-cluster configuration (service account token, KUBERNETES_SERVICE_*).
    pub master: Option<String>,
    /// Watch only this Node (kube-proxy's node informer: `metadata.name=<node>`); `None`: all.
    pub node_name: Option<String>,
    /// Selectors of Services and EndpointSlices (default: kube-proxy's).
    pub selectors: Selectors,
    /// The kinds to watch (the proxy: Services, EndpointSlices and Nodes; node routes: Nodes
    /// only; `weir dns`: Services, EndpointSlices and, for verified pod records, Pods;
    /// `weir policy`: Namespaces, Pods and NetworkPolicies). A kind not listed is never asked
    /// for, and readiness waits only for the listed ones.
    pub kinds: Vec<Kind>,
    /// Keep Pods with what NetworkPolicy reads (labels, node, named ports:
    /// `weir_model::PodInfo::with_policy`); off, Pods keep only what DNS reads.
    pub policy_pods: bool,
    /// The server-side `timeoutSeconds` of each watch request. kube-rs also gives up on a watch
    /// that has sent nothing (not even a bookmark) for this plus 5 s, and weir gives up on any
    /// response read (a hung list) after this plus 10 s.
    pub watch_timeout: Duration,
    /// Retry delays after an error: from `backoff_min`, doubling (with jitter) up to
    /// `backoff_max`; back to the minimum after a success. client-go's reflector: 800 ms, 30 s.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// A kind failing for longer than this makes [`ApiStatus::check`] report the source stale
    /// (a single dropped watch that resumes at once does not).
    pub stale_after: Duration,
}

impl Default for ApiOptions {
    fn default() -> Self {
        ApiOptions {
            kubeconfig: None,
            master: None,
            node_name: None,
            selectors: Selectors::KubeProxy,
            kinds: vec![Kind::Service, Kind::EndpointSlice, Kind::Node],
            policy_pods: false,
            watch_timeout: Duration::from_secs(290),
            backoff_min: Duration::from_millis(800),
            backoff_max: Duration::from_secs(30),
            stale_after: Duration::from_secs(3),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("kubeconfig {path}: {error}")]
    Kubeconfig { path: PathBuf, error: String },
    #[error("--master {url:?}: {error}")]
    Master { url: String, error: String },
    #[error("no --kubeconfig or --master and not running in a cluster: {0}")]
    InCluster(String),
    #[error("Kubernetes client: {0}")]
    Client(String),
    #[error("cannot start the API source's runtime: {0}")]
    Runtime(#[from] std::io::Error),
}

/// What the source reports besides objects (for logs and metrics), from its runtime thread.
#[derive(Debug, Clone, PartialEq)]
pub enum ApiReport {
    /// A complete list of `kind` arrived (the first one, or a re-list).
    Listed { kind: Kind, objects: usize },
    /// The number of objects of `kind` now (after any event).
    Objects { kind: Kind, objects: usize },
    /// A list or watch of `kind` failed; it is retried after `retry_in`. `first`: the kind
    /// was working until now or fails differently (the same error repeated: `first` false).
    Failed {
        kind: Kind,
        error: String,
        retry_in: Duration,
        first: bool,
    },
    /// `kind` works again after failing.
    Recovered { kind: Kind },
    /// The server is older than the default requests assume, and how `kind` is read instead
    /// (EndpointSlices from `v1beta1`; a refused field selector applied by weir). Once per
    /// source.
    Compat { kind: Kind, note: String },
}

#[derive(Debug, Default, Clone)]
struct KindState {
    /// When the last complete list arrived.
    listed: Option<SystemTime>,
    /// The error that the kind's watcher last reported, and since when it has been failing,
    /// until the kind works again.
    failing: Option<(String, Instant)>,
}

#[derive(Debug)]
struct StatusInner {
    kinds: BTreeMap<Kind, KindState>,
    stale_after: Duration,
}

/// The API source's health, shared by its runtime thread (writer) and health checks.
#[derive(Debug, Clone)]
pub struct ApiStatus {
    inner: Arc<Mutex<StatusInner>>,
}

impl ApiStatus {
    fn new(kinds: &[Kind], stale_after: Duration) -> Self {
        let kinds = kinds.iter().map(|k| (*k, KindState::default())).collect();
        ApiStatus {
            inner: Arc::new(Mutex::new(StatusInner { kinds, stale_after })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, StatusInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every kind's first list is complete: the objects form a whole world.
    pub fn ready(&self) -> bool {
        self.lock().kinds.values().all(|k| k.listed.is_some())
    }

    /// When each kind's last complete list arrived.
    pub fn last_listed(&self) -> Vec<(Kind, Option<SystemTime>)> {
        self.lock()
            .kinds
            .iter()
            .map(|(k, s)| (*k, s.listed))
            .collect()
    }

    fn listed(&self, kind: Kind) {
        self.lock().kinds.entry(kind).or_default().listed = Some(SystemTime::now());
    }

    /// Records a failure; returns whether it is news (the kind was working, or it fails
    /// differently now: e.g. the server is back but says 410 Gone).
    fn failed(&self, kind: Kind, error: String) -> bool {
        let mut s = self.lock();
        let state = s.kinds.entry(kind).or_default();
        let since = state.failing.as_ref().map_or_else(Instant::now, |f| f.1);
        let news = state.failing.as_ref().is_none_or(|(e, _)| *e != error);
        state.failing = Some((error, since));
        news
    }

    /// The kind works (an event arrived, or the server answered after the failure); returns
    /// whether it was failing.
    fn working(&self, kind: Kind) -> bool {
        self.lock()
            .kinds
            .get_mut(&kind)
            .and_then(|k| k.failing.take())
            .is_some()
    }

    fn failing_kinds(&self) -> Vec<Kind> {
        let s = self.lock();
        s.kinds
            .iter()
            .filter(|(_, k)| k.failing.is_some())
            .map(|(k, _)| *k)
            .collect()
    }

    /// `Ok` while the source is current; otherwise why not: a first list still missing (and
    /// the error in the way, if any), or a kind failing for longer than `stale_after`.
    pub fn check(&self) -> Result<(), String> {
        self.check_at(Instant::now())
    }

    fn check_at(&self, now: Instant) -> Result<(), String> {
        let s = self.lock();
        let missing: Vec<&str> = s
            .kinds
            .iter()
            .filter(|(_, k)| k.listed.is_none())
            .map(|(k, _)| k.as_str())
            .collect();
        if !missing.is_empty() {
            let why = s
                .kinds
                .values()
                .find_map(|k| k.failing.as_ref())
                .map(|(e, _)| format!(": {e}"))
                .unwrap_or_default();
            return Err(format!(
                "API source has no complete view yet (initial list of {} not complete){why}",
                missing.join(", ")
            ));
        }
        for (kind, k) in &s.kinds {
            if let Some((error, since)) = &k.failing {
                let for_ = now.saturating_duration_since(*since);
                if for_ > s.stale_after {
                    return Err(format!(
                        "API source stale (serving the last complete view): the {} watch has been failing for {:.0}s: {error}",
                        kind.as_str(),
                        for_.as_secs_f64()
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Exponential retry delays with jitter (client-go's reflector backoff, simplified).
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            min,
            max,
            next: min,
        }
    }

    /// The delay before the next attempt: the current step plus up to 100 % jitter (so
    /// thousands of nodes that lost the API server together do not return in step), capped.
    pub fn next_delay(&mut self, jitter: f64) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(self.max);
        base.mul_f64(1.0 + jitter.clamp(0.0, 1.0)).min(self.max)
    }

    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

/// A cheap jitter in [0, 1) from the clock (no random-number dependency for this).
fn jitter() -> f64 {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    f64::from(nanos % 1000) / 1000.0
}

/// A running API source; dropping it (or [`ApiSource::stop`]) stops its thread.
pub struct ApiSource {
    status: ApiStatus,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ApiSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiSource").finish_non_exhaustive()
    }
}

impl ApiSource {
    pub fn status(&self) -> ApiStatus {
        self.status.clone()
    }

    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            if let Err(e) = t.join() {
                tracing::error!("API source thread panicked: {e:?}");
            }
        }
    }
}

impl Drop for ApiSource {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Whether `path` reads as a kubeconfig naming a server (what `weir proxy --validate` checks
/// without connecting): the reason when not.
pub fn check_kubeconfig(path: &std::path::Path) -> Result<(), String> {
    let file = Kubeconfig::read_from(path).map_err(|e| e.to_string())?;
    let has_server = file
        .clusters
        .iter()
        .any(|c| c.cluster.as_ref().is_some_and(|c| c.server.is_some()));
    match has_server {
        true => Ok(()),
        false => Err("the kubeconfig names no cluster server".into()),
    }
}

/// The client configuration as kube-proxy builds it (client-go's `BuildConfigFromFlags`):
/// the kubeconfig if given, with `--master` overriding its server; `--master` alone; or the
/// in-cluster service account.
async fn client_config(opts: &ApiOptions) -> Result<Config, ApiError> {
    let mut config = match &opts.kubeconfig {
        Some(path) => {
            let bad = |error: String| ApiError::Kubeconfig {
                path: path.clone(),
                error,
            };
            let file = Kubeconfig::read_from(path).map_err(|e| bad(e.to_string()))?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|e| bad(e.to_string()))?
        }
        None if opts.master.is_some() => Config::new(Default::default()),
        None => Config::incluster().map_err(|e| ApiError::InCluster(e.to_string()))?,
    };
    if let Some(url) = &opts.master {
        config.cluster_url = url.parse().map_err(|e| ApiError::Master {
            url: url.clone(),
            error: format!("{e}"),
        })?;
        if config.cluster_url.scheme().is_none() || config.cluster_url.host().is_none() {
            return Err(ApiError::Master {
                url: url.clone(),
                error: "not a URL with a scheme and host (e.g. https://10.0.0.1:6443)".into(),
            });
        }
    }
    // kube-rs sets no read timeout: a list response that never finishes would block the
    // watcher forever. Watches are bounded by their own timeout, so this only catches hangs.
    config.read_timeout = Some(opts.watch_timeout + Duration::from_secs(10));
    Ok(config)
}

/// Connects (reading the configuration now, so a bad kubeconfig is an error at start) and
/// starts watching the kinds `opts` names into `sink`.
pub fn start_api_source(
    opts: ApiOptions,
    sink: impl EventSink + 'static,
    report: impl Fn(&ApiReport) + Send + Sync + 'static,
) -> Result<ApiSource, ApiError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("weir-api")
        .build()?;
    let client = runtime.block_on(async {
        let config = client_config(&opts).await?;
        Client::try_from(config).map_err(|e| ApiError::Client(e.to_string()))
    })?;
    let status = ApiStatus::new(&opts.kinds, opts.stale_after);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let ctx = Arc::new(Ctx {
        sink: Box::new(sink),
        report: Box::new(report),
        status: status.clone(),
        opts,
    });
    let thread = std::thread::Builder::new()
        .name("weir-api".into())
        .spawn(move || {
            runtime.block_on(async move {
                let timeout = u32::try_from(ctx.opts.watch_timeout.as_secs()).unwrap_or(290);
                let (svc_labels, svc_fields, slice_labels) = ctx.opts.selectors.terms();
                let nodes = match &ctx.opts.node_name {
                    Some(n) => watcher::Config::default().fields(&format!("metadata.name={n}")),
                    None => watcher::Config::default(),
                };
                // A list after 410 Gone must not go back in time: read the latest state,
                // not the API server's cache (client-go relists with resourceVersion="" too).
                let tune = |c: watcher::Config| {
                    c.timeout(timeout)
                        .list_semantic(watcher::ListSemantic::MostRecent)
                };
                let wanted = |kind| ctx.opts.kinds.contains(&kind);
                let watches = futures::future::join5(
                    async {
                        if wanted(Kind::Service) {
                            watch_services(&client, svc_labels, svc_fields, tune, &ctx).await
                        }
                    },
                    async {
                        if wanted(Kind::EndpointSlice) {
                            let kind = Kind::EndpointSlice;
                            let slices = tune(selected(slice_labels, None));
                            match served_slice_version(&client, &ctx).await {
                                SliceVersion::V1 => {
                                    let api = Api::<EndpointSlice>::all(client.clone());
                                    watch_kind(kind, api, slices, every, &ctx).await;
                                }
                                SliceVersion::V1beta1 => {
                                    let api = Api::<EndpointSliceV1beta1>::all(client.clone());
                                    watch_kind(kind, api, slices, every, &ctx).await;
                                }
                            }
                        }
                    },
                    async {
                        if wanted(Kind::Node) {
                            let api = Api::all(client.clone());
                            watch_kind::<Node>(Kind::Node, api, tune(nodes), every, &ctx).await;
                        }
                    },
                    async {
                        if wanted(Kind::Pod) {
                            let all_pods = tune(watcher::Config::default());
                            if ctx.opts.policy_pods {
                                let api = Api::<PolicyPod>::all(client.clone());
                                watch_kind(Kind::Pod, api, all_pods, every, &ctx).await;
                            } else {
                                let api = Api::<Pod>::all(client.clone());
                                watch_kind(Kind::Pod, api, all_pods, every, &ctx).await;
                            }
                        }
                    },
                    // NetworkPolicy's other inputs (`weir policy` only).
                    futures::future::join(
                        async {
                            if wanted(Kind::Namespace) {
                                let api = Api::all(client.clone());
                                let all = tune(watcher::Config::default());
                                watch_kind::<Namespace>(Kind::Namespace, api, all, every, &ctx)
                                    .await;
                            }
                        },
                        async {
                            if wanted(Kind::NetworkPolicy) {
                                let kind = Kind::NetworkPolicy;
                                let api = Api::all(client.clone());
                                let all = tune(watcher::Config::default());
                                watch_kind::<NetworkPolicy>(kind, api, all, every, &ctx).await;
                            }
                        },
                    ),
                );
                let watches =
                    futures::future::join(watches, probe_while_failing(client.clone(), &ctx));
                tokio::select! {
                    _ = watches => {}
                    _ = stop_rx => {}
                }
            });
        })?;
    Ok(ApiSource {
        status,
        stop: Some(stop_tx),
        thread: Some(thread),
    })
}

/// A Pod read with what NetworkPolicy needs ([`ApiOptions::policy_pods`]): the same
/// resource, converted with `weir_model::PodInfo::with_policy`.
#[derive(Debug, Clone)]
struct PolicyPod(Pod);

impl<'de> serde::Deserialize<'de> for PolicyPod {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Pod::deserialize(d).map(PolicyPod)
    }
}

impl kube::Resource for PolicyPod {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        <Pod as kube::Resource>::kind(&())
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        <Pod as kube::Resource>::group(&())
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        <Pod as kube::Resource>::version(&())
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        <Pod as kube::Resource>::plural(&())
    }
    fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        &self.0.metadata
    }
    fn meta_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        &mut self.0.metadata
    }
}

impl From<PolicyPod> for Object {
    fn from(o: PolicyPod) -> Self {
        Object::from(weir_model::PodForPolicy(o.0))
    }
}

/// Merges `annotations` into the Node `node`'s (a JSON merge patch, as `kubectl patch node
/// --type merge` sends): how node routes publish the VTEP other nodes read. Blocking; a short
/// runtime of its own, so it works from any synchronous thread.
pub fn patch_node_annotations(
    opts: &ApiOptions,
    node: &str,
    annotations: &BTreeMap<String, String>,
) -> Result<(), ApiError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let config = client_config(opts).await?;
        let client = Client::try_from(config).map_err(|e| ApiError::Client(e.to_string()))?;
        let patch = serde_json::json!({ "metadata": { "annotations": annotations } });
        Api::<Node>::all(client)
            .patch(
                node,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .map_err(|e| ApiError::Client(format!("patch Node {node}: {e}")))?;
        Ok(())
    })
}

struct Ctx {
    sink: Box<dyn EventSink>,
    report: Box<dyn Fn(&ApiReport) + Send + Sync>,
    status: ApiStatus,
    opts: ApiOptions,
}

impl Ctx {
    fn working(&self, kind: Kind) {
        if self.status.working(kind) {
            (self.report)(&ApiReport::Recovered { kind });
        }
    }
}

fn key_hash(o: &Object) -> u64 {
    let mut h = DefaultHasher::new();
    o.key().hash(&mut h);
    h.finish()
}

/// The Services, with kube-proxy's field selector if the server takes it. A server before
/// 1.22 refuses `spec.clusterIP!=None` (400: only `metadata.name`/`metadata.namespace`);
/// then every Service is listed and the selector applied here.
async fn watch_services(
    client: &Client,
    labels: Option<&str>,
    fields: Option<FieldFilter>,
    tune: impl Fn(watcher::Config) -> watcher::Config,
    ctx: &Ctx,
) {
    let kind = Kind::Service;
    let api = Api::<Service>::all(client.clone());
    let server_side = tune(selected(labels, fields.as_ref().map(FieldFilter::selector)));
    let end = watch_kind(kind, api.clone(), server_side, every, ctx).await;
    let (WatchEnd::FieldSelectorRefused, Some(filter)) = (end, fields) else {
        return;
    };
    let note = format!(
        "the API server refuses the field selector {:?}; listing every Service and leaving those out here",
        filter.selector()
    );
    (ctx.report)(&ApiReport::Compat { kind, note });
    let keep = |s: &Service| filter.passes(s);
    watch_kind(kind, api, tune(selected(labels, None)), keep, ctx).await;
}

/// Why a kind's watch ended.
#[derive(Debug, PartialEq, Eq)]
enum WatchEnd {
    /// The consumer is gone.
    SinkClosed,
    /// The server refused the field selector (400): retrying cannot help.
    FieldSelectorRefused,
}

/// A `keep` for kinds whose selectors the server applies.
fn every<K>(_: &K) -> bool {
    true
}

/// One kind's watcher, forever (until the sink closes). `keep` is a selector the server
/// could not apply: objects failing it are left out of lists, and one that stops passing
/// is deleted.
async fn watch_kind<K>(
    my_kind: Kind,
    api: Api<K>,
    config: watcher::Config,
    keep: impl Fn(&K) -> bool,
    ctx: &Ctx,
) -> WatchEnd
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    Object: From<K>,
{
    let has_fields = config.field_selector.is_some();
    let mut stream = std::pin::pin!(watcher(api, config));
    let mut backoff = Backoff::new(ctx.opts.backoff_min, ctx.opts.backoff_max);
    // The objects of the list being received, until it is complete.
    let mut listing: Vec<Object> = Vec::new();
    // Which objects exist (hashes of their keys), for the per-kind count.
    let mut present: HashSet<u64> = HashSet::new();
    while let Some(item) = stream.next().await {
        let event = match item {
            Ok(ev) => ev,
            Err(watcher::Error::InitialListFailed(e))
                if has_fields && refuses_field_selector(&e) =>
            {
                return WatchEnd::FieldSelectorRefused;
            }
            Err(e) => {
                let retry_in = backoff.next_delay(jitter());
                let error = e.to_string();
                let first = ctx.status.failed(my_kind, error.clone());
                (ctx.report)(&ApiReport::Failed {
                    kind: my_kind,
                    error,
                    retry_in,
                    first,
                });
                tokio::time::sleep(retry_in).await;
                continue;
            }
        };
        backoff.reset();
        ctx.working(my_kind);
        let sent = match event {
            watcher::Event::Init => {
                listing.clear();
                continue;
            }
            watcher::Event::InitApply(o) => {
                if keep(&o) {
                    listing.push(Object::from(o));
                }
                continue;
            }
            watcher::Event::InitDone => {
                let list = std::mem::take(&mut listing);
                present = list.iter().map(key_hash).collect();
                let objects = list.len();
                let sent = ctx.sink.send(Event::Listed(my_kind, list));
                ctx.status.listed(my_kind);
                (ctx.report)(&ApiReport::Listed {
                    kind: my_kind,
                    objects,
                });
                sent
            }
            watcher::Event::Apply(o) => {
                let kept = keep(&o);
                let o = Object::from(o);
                if kept {
                    present.insert(key_hash(&o));
                    ctx.sink.send(Event::Applied(o))
                } else if present.remove(&key_hash(&o)) {
                    ctx.sink.send(Event::Deleted(o.key()))
                } else {
                    continue;
                }
            }
            watcher::Event::Delete(o) => {
                let o = Object::from(o);
                present.remove(&key_hash(&o));
                ctx.sink.send(Event::Deleted(o.key()))
            }
        };
        (ctx.report)(&ApiReport::Objects {
            kind: my_kind,
            objects: present.len(),
        });
        if !sent {
            return WatchEnd::SinkClosed;
        }
    }
    WatchEnd::SinkClosed
}

/// Retries `attempt` with the kind's backoff, reporting each failure, until it answers.
async fn until_answered<T>(
    kind: Kind,
    ctx: &Ctx,
    mut attempt: impl AsyncFnMut() -> Result<T, String>,
) -> T {
    let mut backoff = Backoff::new(ctx.opts.backoff_min, ctx.opts.backoff_max);
    loop {
        match attempt().await {
            Ok(v) => {
                ctx.working(kind);
                return v;
            }
            Err(error) => {
                let retry_in = backoff.next_delay(jitter());
                let first = ctx.status.failed(kind, error.clone());
                (ctx.report)(&ApiReport::Failed {
                    kind,
                    error,
                    retry_in,
                    first,
                });
                tokio::time::sleep(retry_in).await;
            }
        }
    }
}

/// The EndpointSlice version to watch: `v1`, else `v1beta1` (servers before 1.21), asked of
/// the server's discovery documents until it answers.
async fn served_slice_version(client: &Client, ctx: &Ctx) -> SliceVersion {
    let kind = Kind::EndpointSlice;
    let version = until_answered(kind, ctx, async || discover_slice_version(client).await).await;
    if version != SliceVersion::V1 {
        let note = format!(
            "the API server does not serve discovery.k8s.io/v1; reading {} (nodeName and zone from each endpoint's topology, no hints)",
            version.as_str()
        );
        (ctx.report)(&ApiReport::Compat { kind, note });
    }
    version
}

/// kube-rs reports a failed watch but not its recovery: a watch that resumes from its
/// resourceVersion produces no event until something changes (bookmarks are consumed
/// inside). So while a kind is failing, ask the API server for its version every second;
/// an answer after the last failure means the server is back and the kind is working (if
/// its watch still fails, its next error marks it failing again).
async fn probe_while_failing(client: Client, ctx: &Ctx) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let failing = ctx.status.failing_kinds();
        if failing.is_empty() {
            continue;
        }
        let asked = Instant::now();
        if client.apiserver_version().await.is_ok() {
            // Give the watchers' retries (already due) a moment to fail again if they will.
            tokio::time::sleep(Duration::from_millis(200)).await;
            for kind in failing {
                let still = ctx
                    .status
                    .lock()
                    .kinds
                    .get(&kind)
                    .and_then(|k| k.failing.as_ref().map(|f| f.1))
                    .is_some_and(|since| since < asked);
                if still {
                    ctx.working(kind);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_with_jitter_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(800), Duration::from_secs(30));
        let steps: Vec<u128> = (0..7).map(|_| b.next_delay(0.0).as_millis()).collect();
        assert_eq!(steps, [800, 1600, 3200, 6400, 12800, 25600, 30000]);
        b.reset();
        assert_eq!(b.next_delay(0.5), Duration::from_millis(1200));
        assert_eq!(b.next_delay(1.0), Duration::from_millis(3200));
        // Jitter never takes a delay past the cap.
        let mut b = Backoff::new(Duration::from_secs(20), Duration::from_secs(30));
        assert_eq!(b.next_delay(0.9), Duration::from_secs(30));
    }

    #[test]
    fn status_is_not_ready_until_every_kind_listed_then_stale_only_after_the_grace() {
        let kinds = [Kind::Service, Kind::EndpointSlice, Kind::Node];
        let s = ApiStatus::new(&kinds, Duration::from_secs(3));
        let t0 = Instant::now();
        assert!(!s.ready());
        s.failed(Kind::Service, "connection refused".into());
        let e = s.check_at(t0).unwrap_err();
        assert!(
            e.contains("initial list of Service, EndpointSlice, Node")
                && e.contains("connection refused"),
            "{e}"
        );
        s.working(Kind::Service);
        s.listed(Kind::Service);
        s.listed(Kind::EndpointSlice);
        assert!(!s.ready());
        let e = s.check_at(t0).unwrap_err();
        assert!(e.contains("initial list of Node not"), "{e}");
        s.listed(Kind::Node);
        assert!(s.ready());
        assert_eq!(s.check_at(t0), Ok(()));

        assert!(s.failed(Kind::EndpointSlice, "watch stream failed".into()));
        assert!(
            !s.failed(Kind::EndpointSlice, "watch stream failed".into()),
            "the same error again is not news"
        );
        assert!(s.failed(Kind::EndpointSlice, "again".into()), "another is");
        // A dropped watch that resumes within the grace is not staleness.
        assert_eq!(s.check_at(Instant::now() + Duration::from_secs(2)), Ok(()));
        let e = s
            .check_at(Instant::now() + Duration::from_secs(10))
            .unwrap_err();
        assert!(
            e.contains("stale") && e.contains("EndpointSlice") && e.contains("again"),
            "{e}"
        );
        assert!(s.working(Kind::EndpointSlice));
        assert!(!s.working(Kind::EndpointSlice));
        assert_eq!(s.check_at(Instant::now() + Duration::from_secs(10)), Ok(()));
        assert!(
            s.ready(),
            "a failure later does not unready a complete view"
        );
    }
}
