//! The proxy's control loop: objects → plan → backend, rate-limited, with periodic resyncs.

use std::net::IpAddr;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use tracing::{info, warn};
use weir_model::{Kind, NodeInfo, Object, ObjectKey, Plan, PlanDiff, Planner, ProxyConfig};
use weir_proxy::health::SourceCheck;
use weir_proxy::{Backend, SyncKind};
use weir_source::api::{start_api_source, ApiReport, ApiSource};
use weir_source::{watch_dir, Limits, ManifestDir, PollWatcher, SharedStore, WatchEvent};

use super::config::Settings;

/// Hands memory freed after a full sync (rendered ruleset, element batches) back to the
/// kernel: glibc keeps freed heap in its arenas otherwise, and the agent's resident size
/// would stay at the peak of its largest sync.
fn release_freed_memory() {
    // SAFETY: malloc_trim only releases free memory of glibc's allocator.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// One glibc arena for the whole process instead of one per thread that allocates: the API
/// source's thread builds the objects the main loop keeps, and a second arena held the
/// objects in one heap and its free space in another (at 10,000 services: RSS 1.4 MiB and
/// the high-water mark 3.6 MiB lower with one). The threads seldom allocate at the same
/// time (the store's lock orders them), so sharing one arena costs little. Must run before
/// the threads start.
pub fn use_one_malloc_arena() {
    // SAFETY: mallopt only changes glibc's allocator's tuning.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Every address configured in this network namespace (NodePort address matching).
fn local_addresses() -> anyhow::Result<Vec<IpAddr>> {
    let mut rtnl = weir_kernel::Rtnl::new().context("open rtnetlink")?;
    Ok(rtnl
        .addrs(None)
        .context("list addresses")?
        .into_iter()
        .map(|a| a.net.addr())
        .collect())
}

fn proxy_config(s: &Settings) -> anyhow::Result<ProxyConfig> {
    Ok(ProxyConfig {
        node_name: s.node_name.clone(),
        node_ips: Vec::new(),
        local_addresses: local_addresses()?,
        cluster_cidrs: s.cluster_cidrs.clone(),
        masquerade_all: s.masquerade_all,
        nodeport_addresses: s.nodeport_addresses.clone(),
        nodeport_default: s.nodeport_default,
        localhost_nodeports: s.localhost_nodeports,
        zone: None,
    })
}

/// Hooks the loop calls around each sync (health and metrics servers, conntrack cleanup).
pub trait SyncObserver {
    /// A change was seen and a sync is queued.
    fn queued(&mut self) {}
    /// `plan` is now in the kernel; `diff` is what changed since the previous successful
    /// sync (`None` on the first: everything is new). Called per change, so an observer
    /// should look at `diff`, not walk `plan`.
    /// `change_triggers`: the `last-change-trigger-time`s of the EndpointSlices this sync
    /// programmed (empty on the first sync, and when the objects carry none).
    fn synced(
        &mut self,
        _diff: Option<&PlanDiff>,
        _plan: &Plan,
        _report: &weir_proxy::SyncReport,
        _change_triggers: &[SystemTime],
    ) {
    }
    fn failed(&mut self, _error: &weir_proxy::Error) {}
    /// Whether this node should receive load-balancer traffic (kube-proxy's /healthz
    /// fails while the Node is being deleted or drained by the cluster autoscaler).
    fn node_eligible(&mut self, _eligible: bool) {}
    /// The object source started: health follows `check` (`Err`: why the source is not
    /// current).
    fn source_started(&mut self, _check: SourceCheck) {}
    /// Called on the manifest source's thread with each of its reports (for metrics).
    fn source_reporter(&self) -> Box<dyn Fn(&WatchEvent<'_>) + Send> {
        Box::new(|_| {})
    }
    /// Called on the API source's thread with each of its reports (for metrics).
    fn api_reporter(&self) -> Box<dyn Fn(&ApiReport) + Send + Sync> {
        Box::new(|_| {})
    }
}

/// How long the manifest source may go without completing a scan before health reports it
/// stale: ten polls, and never less than 5 s (a big directory takes a while to parse).
pub fn source_stale_after(poll: Duration) -> Duration {
    (10 * poll).max(Duration::from_secs(5))
}

/// The running object source: a manifest directory or the Kubernetes API.
enum Source {
    Manifests(PollWatcher, Duration),
    Api(ApiSource),
}

impl Source {
    /// Every kind's complete first view is in the store.
    fn ready(&self) -> bool {
        match self {
            Source::Manifests(w, _) => w.status().ready(),
            Source::Api(a) => a.status().ready(),
        }
    }

    fn check(&self) -> Result<(), String> {
        match self {
            Source::Manifests(w, stale_after) => w.status().check(*stale_after),
            Source::Api(a) => a.status().check(),
        }
    }

    fn check_fn(&self) -> SourceCheck {
        match self {
            Source::Manifests(w, stale_after) => {
                let (status, stale_after) = (w.status(), *stale_after);
                Box::new(move || status.check(stale_after))
            }
            Source::Api(a) => {
                let status = a.status();
                Box::new(move || status.check())
            }
        }
    }
}

/// Starts the configured source: the Kubernetes API when one is configured, else the
/// manifest directory.
fn start_source(
    settings: &Settings,
    store: &SharedStore,
    observer: &mut dyn SyncObserver,
) -> anyhow::Result<Source> {
    let source = match &settings.api {
        Some(api) => Source::Api(start_api(settings, api, store, observer)?),
        None => Source::Manifests(
            start_manifests(settings, store, observer),
            source_stale_after(settings.manifest_poll_interval),
        ),
    };
    observer.source_started(source.check_fn());
    Ok(source)
}

/// Starts the API watchers; their reports go to the log and the observer.
fn start_api(
    settings: &Settings,
    api: &super::config::ApiSettings,
    store: &SharedStore,
    observer: &mut dyn SyncObserver,
) -> anyhow::Result<ApiSource> {
    let opts = weir_source::api::ApiOptions {
        kubeconfig: api.kubeconfig.clone(),
        master: api.master.clone(),
        node_name: Some(settings.node_name.clone()),
        watch_timeout: api.watch_timeout,
        ..Default::default()
    };
    let report = observer.api_reporter();
    let source = start_api_source(opts, store.clone(), move |r| {
        crate::manifest_view::log_api_report(r);
        report(r);
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
/// wires its reports into the log and the observer.
fn start_manifests(
    settings: &Settings,
    store: &SharedStore,
    observer: &mut dyn SyncObserver,
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
    let report = observer.source_reporter();
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
            report(&ev);
        },
    )
}

/// Blocks until the source has produced a complete first view (for the API: every kind's
/// initial list). Until then nothing is synced, so whatever rules the kernel holds (from an
/// earlier run) stay in place: an unreadable or missing directory, or an API server that
/// does not answer, must never become an empty or partial world.
fn wait_for_first_view(source: &Source) {
    let mut said = false;
    let started = Instant::now();
    while !source.ready() {
        // Quiet during the first scan of an ordinary start.
        if !said && started.elapsed() > Duration::from_secs(1) {
            if let Err(why) = source.check() {
                warn!("not syncing yet, the rules in the kernel are kept: {why}");
                said = true;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if said {
        info!("object source ready: syncing");
    }
}

/// Trigger times (`endpoints.kubernetes.io/last-change-trigger-time`) of the EndpointSlices
/// among `changes` that still exist.
fn change_triggers(changes: &[(ObjectKey, Option<Object>)]) -> Vec<SystemTime> {
    changes
        .iter()
        .filter_map(|(_, o)| match o {
            Some(Object::EndpointSlice(s)) => s.trigger_time.as_deref(),
            _ => None,
        })
        .filter_map(parse_time)
        .collect()
}

/// An RFC 3339 time (as Kubernetes writes them) as a `SystemTime`; `None` if invalid or
/// before 1970.
fn parse_time(s: &str) -> Option<SystemTime> {
    let ts = s.parse::<weir_model::k8s_openapi::jiff::Timestamp>().ok()?;
    let nanos = u64::try_from(ts.as_nanosecond()).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_nanos(nanos))
}

/// False while this node's Node object is being deleted or carries the cluster
/// autoscaler's `ToBeDeletedByClusterAutoscaler` taint; true when there is no Node object.
fn node_eligible(node: Option<&NodeInfo>) -> bool {
    let Some(node) = node else {
        return true;
    };
    let draining = node
        .taint_keys
        .iter()
        .any(|k| &**k == "ToBeDeletedByClusterAutoscaler");
    !(node.deleting || draining)
}

/// How often a sync failure that keeps repeating word for word is logged again.
const FAILURE_REMINDER: Duration = Duration::from_secs(300);

/// What the log says about failed syncs. A failing sync is retried every second; the same
/// error each time would be a line a second (issue 8: one line per distinct error), so an
/// error is logged when it first occurs or changes, then every [`FAILURE_REMINDER`] with the
/// number of attempts, and the recovery once.
#[derive(Default)]
struct FailureLog {
    /// The error being repeated, when it was last logged, and attempts since the first.
    current: Option<(String, Instant, u64)>,
}

impl FailureLog {
    /// A sync failed with `error`: the line to log, if any.
    fn failed(&mut self, error: &str, now: Instant) -> Option<String> {
        match &mut self.current {
            Some((same, said, attempts)) if same == error => {
                *attempts += 1;
                if now.duration_since(*said) < FAILURE_REMINDER {
                    return None;
                }
                *said = now;
                Some(format!(
                    "sync still failing after {attempts} attempts (rules left as they were): {error}"
                ))
            }
            _ => {
                self.current = Some((error.to_string(), now, 1));
                Some(format!("sync failed (rules left as they were): {error}"))
            }
        }
    }

    /// A sync succeeded: the line to log if it ends a run of failures.
    fn succeeded(&mut self) -> Option<String> {
        let (_, _, attempts) = self.current.take()?;
        Some(format!("sync succeeded after {attempts} failed attempts"))
    }
}

/// Runs forever (until the process is killed).
pub fn run(
    settings: &Settings,
    backend: &mut dyn Backend,
    observer: &mut dyn SyncObserver,
) -> anyhow::Result<()> {
    let store = SharedStore::new();
    // The loop plans per change: the store remembers which objects changed.
    store.track_changes();
    let source = start_source(settings, &store, observer)?;
    wait_for_first_view(&source);

    let mut planner = Planner::default();
    // What changed since the last successful sync (`None` before the first): a failed sync's
    // diff is composed with the next, so observers never miss a change.
    let mut unobserved: Option<PlanDiff> = None;
    let mut synced_once = false;
    // Trigger times of the EndpointSlices changed since the last successful sync.
    let mut triggers: Vec<SystemTime> = Vec::new();
    // When the oldest change not yet in the kernel reached the store.
    let mut pending_since: Option<Instant> = None;
    let node_key = ObjectKey::new(Kind::Node, "", settings.node_name.as_str());
    let mut seen = 0;
    let mut last_sync: Option<Instant> = None;
    let mut last_full: Option<Instant> = None;
    let mut last_check = Instant::now();
    let mut failing = false;
    let mut failures = FailureLog::default();
    let mut plan_warnings = crate::conditions::Conditions::default();
    // The periodic check of the kernel's rules, when it cannot run: said once per error.
    let mut check_failure = crate::conditions::Conditions::default();
    let mut first = true;
    loop {
        if let Some(last) = last_sync {
            // Wait for a change, or for the periodic resync (sooner after a failure).
            let period = if failing {
                settings.min_sync_period.max(Duration::from_secs(1))
            } else {
                settings.sync_period
            };
            let wait = (last + period).saturating_duration_since(Instant::now());
            store.wait_newer_generation(seen, wait);
            observer.queued();
            // Batch changes arriving faster than min-sync-period.
            let earliest = last + settings.min_sync_period;
            std::thread::sleep(earliest.saturating_duration_since(Instant::now()));
        } else {
            observer.queued();
        }
        // Only what changed since the last round: the planner replans the services these
        // objects belong to, not the cluster.
        let changes = store.take_changes();
        seen = changes.generation;
        last_sync = Some(Instant::now());
        if let Some(t) = changes.since {
            pending_since = Some(pending_since.map_or(t, |p| p.min(t)));
        }
        if !first {
            triggers.extend(change_triggers(&changes.objects));
        }
        let changed_objects = changes.objects.len();
        let own_node = match store.get(&node_key) {
            Some(Object::Node(n)) => Some(n),
            _ => None,
        };
        observer.node_eligible(node_eligible(own_node.as_deref()));
        let config = proxy_config(settings)?;
        let planning = Instant::now();
        // The planner replans the services the changes touch and hands over what changed in
        // the plan: the backend applies only that, so nothing per change walks the cluster.
        let diff = planner.update(changes.objects, &config);
        let plan = planner.current();
        let plan_ms = planning.elapsed().as_secs_f64() * 1e3;
        // A warning holds as long as its cause (a NodePort not served until the Node is
        // known): said when it appears or changes and when it clears, not on every sync.
        let said = plan_warnings.update(plan.warnings.iter().map(String::as_str));
        for w in said.cleared {
            info!("plan: resolved: {w}");
        }
        for w in said.appeared {
            warn!("plan: {w}");
        }
        if first {
            info!(
                objects = changed_objects,
                service_ports = plan.services.len(),
                plan_ms,
                "planned the initial objects"
            );
        }
        first = false;
        // Every --sync-period, even while changes keep coming, check that the kernel still
        // holds what weir wrote (an outside flush is repaired by a full sync); and every
        // --full-sync-period rewrite every rule regardless (kube-proxy: hourly).
        if last_check.elapsed() >= settings.sync_period {
            last_check = Instant::now();
            let check = backend.intact();
            let said = check_failure.update(check.as_ref().err().map(|e| e.to_string()));
            for e in said.cleared.iter().filter(|_| check.is_ok()) {
                info!(
                    mode = backend.mode(),
                    "checking the rules works again (it failed: {e})"
                );
            }
            match check {
                Ok(true) => {}
                Ok(false) => {
                    warn!(
                        mode = backend.mode(),
                        "weir's rules were changed behind its back (an outside flush?); full resync"
                    );
                    backend.invalidate();
                }
                Err(_) => {
                    for e in said.appeared {
                        warn!(mode = backend.mode(), "checking the rules failed: {e}");
                    }
                }
            }
        }
        if last_full.is_some_and(|t| t.elapsed() >= settings.full_sync_period) {
            backend.invalidate();
        }
        let result = backend.sync_diff(plan, &diff);
        let diff = match unobserved.take() {
            Some(earlier) => earlier.then(diff),
            None => diff,
        };
        match result {
            Ok(report) => {
                failing = false;
                if let Some(line) = failures.succeeded() {
                    info!(mode = backend.mode(), "{line}");
                }
                if report.kind == SyncKind::Full {
                    last_full = Some(Instant::now());
                }
                // From the oldest change's arrival in the store to the rules in the kernel.
                let event_to_rules_ms = pending_since
                    .take()
                    .map(|t| t.elapsed().as_secs_f64() * 1e3);
                if report.kind != SyncKind::Noop {
                    info!(
                        mode = backend.mode(),
                        kind = ?report.kind,
                        service_ports = plan.services.len(),
                        touched = report.service_ports_touched,
                        changed_objects,
                        elapsed_ms = report.elapsed.as_secs_f64() * 1e3,
                        plan_ms,
                        event_to_rules_ms = event_to_rules_ms.unwrap_or(0.0),
                        "synced"
                    );
                }
                observer.synced(synced_once.then_some(&diff), plan, &report, &triggers);
                synced_once = true;
                triggers.clear();
                if report.kind == SyncKind::Full {
                    release_freed_memory();
                }
            }
            Err(e) => {
                failing = true;
                unobserved = Some(diff);
                if let Some(line) = failures.failed(&e.to_string(), Instant::now()) {
                    warn!(mode = backend.mode(), "{line}");
                }
                observer.failed(&e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_sync_failure_is_logged_once_then_rarely_and_its_end_once() {
        let mut log = FailureLog::default();
        let t0 = Instant::now();
        let second = |n: u64| t0 + Duration::from_secs(n);
        assert_eq!(
            log.failed("busy", t0).as_deref(),
            Some("sync failed (rules left as they were): busy")
        );
        for n in 1..300 {
            assert_eq!(log.failed("busy", second(n)), None, "retry {n}");
        }
        assert_eq!(
            log.failed("busy", second(300)).as_deref(),
            Some("sync still failing after 301 attempts (rules left as they were): busy")
        );
        assert_eq!(log.failed("busy", second(301)), None);
        // A different error is news.
        assert_eq!(
            log.failed("gone", second(302)).as_deref(),
            Some("sync failed (rules left as they were): gone")
        );
        assert_eq!(
            log.succeeded().as_deref(),
            Some("sync succeeded after 1 failed attempts")
        );
        assert_eq!(log.succeeded(), None);
        assert!(
            log.failed("busy", second(303)).is_some(),
            "a new run of failures"
        );
    }

    use weir_model::k8s_openapi::api::discovery::v1::EndpointSlice;

    fn slice(name: &str, trigger: Option<&str>) -> (ObjectKey, Option<Object>) {
        let mut s = EndpointSlice::default();
        s.metadata.name = Some(name.into());
        s.metadata.namespace = Some("ns".into());
        if let Some(t) = trigger {
            s.metadata.annotations = Some(
                [(
                    weir_model::compact::ANNOTATION_TRIGGER_TIME.to_string(),
                    t.to_string(),
                )]
                .into(),
            );
        }
        let o: Object = s.into();
        (o.key(), Some(o))
    }

    #[test]
    fn trigger_times_of_the_changed_slices() {
        let changes = vec![
            slice("a", Some("2026-11-21T10:00:05Z")),
            slice("b", None),
            slice("c", Some("2026-11-21T10:00:07Z")),
            (ObjectKey::new(Kind::EndpointSlice, "ns", "gone"), None),
        ];
        let mut got = change_triggers(&changes);
        got.sort();
        // Seconds since the epoch, from `date -u -d 2026-11-21T10:00:05Z +%s`.
        let at = |secs: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
        assert_eq!(got, vec![at(1795255205), at(1795255207)]);
        assert_eq!(parse_time("yesterday"), None);
    }
}
