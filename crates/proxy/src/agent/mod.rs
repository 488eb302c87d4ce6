//! The proxy's control loop: objects → plan → backend, rate-limited, with periodic resyncs
//! and checks of the kernel's rules.
//!
//! [`ProxyLoop`] is generic over the three things it talks to, so it runs without root and
//! without a kernel in tests:
//! - a [`Backend`] (a proxy mode; tests record calls),
//! - an [`ObjectSource`]: what the loop consumes from weir-source's store and its watcher
//!   (readiness, freshness, changes since the last round, this node's Node),
//! - a [`Clock`] (`now`, `sleep`): [`SystemClock`] in the agent, a virtual one in tests.
//!
//! Around each sync a [`SyncObserver`] is called: [`Operations`] is the agent's (health and
//! metrics servers, healthCheckNodePorts, UDP conntrack cleanup). The `weir proxy` binary
//! keeps the flags, the configuration file, starting the object source and wiring.

mod operations;

use std::convert::Infallible;
use std::time::{Duration, Instant, SystemTime};

use tracing::{info, warn};
use weir_model::conditions::Conditions;
use weir_model::{Kind, NodeInfo, Object, ObjectKey, Plan, PlanDiff, Planner, ProxyConfig};
use weir_source::Changes;

use crate::health::SourceCheck;
use crate::{Backend, SyncKind, SyncReport};

pub use operations::{Operations, OperationsSettings};

/// Time as the loop sees it. The loop never reads the system clock or sleeps directly, so a
/// test drives it through minutes of resyncs and rate limits in microseconds.
pub trait Clock {
    fn now(&self) -> Instant;
    /// Blocks for `d` (a virtual clock advances by `d` instead).
    fn sleep(&self, d: Duration);
}

/// The real clock: [`Instant::now`] and [`std::thread::sleep`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
    fn sleep(&self, d: Duration) {
        std::thread::sleep(d)
    }
}

/// Where the loop's objects come from: in the agent, weir-source's `SharedStore` (with
/// change tracking on) fed by a manifest directory watcher or the Kubernetes API watchers.
pub trait ObjectSource {
    /// A complete first view of every kind is in the store. Nothing is synced before.
    fn ready(&self) -> bool;
    /// `Ok` while the source is current; otherwise why not (no complete view yet, unreadable,
    /// stuck, or no successful list/watch/scan for longer than its limit).
    fn check(&self) -> Result<(), String>;
    /// The same check, for the health servers to ask at request time (from their thread).
    fn health_check(&self) -> SourceCheck;
    /// Waits until the store's generation exceeds `seen`, or `timeout` passes; returns the
    /// generation now.
    fn wait_newer(&self, seen: u64, timeout: Duration) -> u64;
    /// What changed since the previous call (`weir_source::Store::take_changes`).
    fn take_changes(&self) -> Changes;
    /// The current version of one object (the loop reads this node's Node).
    fn get(&self, key: &ObjectKey) -> Option<Object>;
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
        _report: &SyncReport,
        _change_triggers: &[SystemTime],
    ) {
    }
    fn failed(&mut self, _error: &crate::Error) {}
    /// Whether this node should receive load-balancer traffic (kube-proxy's /healthz
    /// fails while the Node is being deleted or drained by the cluster autoscaler).
    fn node_eligible(&mut self, _eligible: bool) {}
    /// The object source started: health follows `check` (`Err`: why the source is not
    /// current).
    fn source_started(&mut self, _check: SourceCheck) {}
}

impl<O: SyncObserver + ?Sized> SyncObserver for &mut O {
    fn queued(&mut self) {
        (**self).queued()
    }
    fn synced(
        &mut self,
        diff: Option<&PlanDiff>,
        plan: &Plan,
        report: &SyncReport,
        change_triggers: &[SystemTime],
    ) {
        (**self).synced(diff, plan, report, change_triggers)
    }
    fn failed(&mut self, error: &crate::Error) {
        (**self).failed(error)
    }
    fn node_eligible(&mut self, eligible: bool) {
        (**self).node_eligible(eligible)
    }
    fn source_started(&mut self, check: SourceCheck) {
        (**self).source_started(check)
    }
}

/// The loop's periods (`--sync-period`, `--min-sync-period`, the full resync) and this node.
#[derive(Debug, Clone)]
pub struct LoopSettings {
    pub node_name: String,
    /// How often the loop resyncs without changes and checks the kernel's rules.
    pub sync_period: Duration,
    /// How often every rule is rewritten regardless.
    pub full_sync_period: Duration,
    /// Changes arriving faster than this are batched into one sync.
    pub min_sync_period: Duration,
}

/// The planner's node configuration, asked before every round (the node's local addresses
/// move). An error ends the loop.
pub type ConfigFn = Box<dyn FnMut() -> Result<ProxyConfig, String> + Send>;

/// Why the loop stopped.
#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    /// The node configuration could not be read.
    #[error("{0}")]
    Config(String),
}

/// Hands memory freed after a full sync (rendered ruleset, element batches) back to the
/// kernel: glibc keeps freed heap in its arenas otherwise, and the agent's resident size
/// would stay at the peak of its largest sync.
pub fn release_freed_memory() {
    // SAFETY: malloc_trim only releases free memory of glibc's allocator.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// How long the manifest source may go without completing a scan before health reports it
/// stale: ten polls, and never less than 5 s (a big directory takes a while to parse).
pub fn source_stale_after(poll: Duration) -> Duration {
    (10 * poll).max(Duration::from_secs(5))
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

/// What planning a round took, for the log.
struct Planned {
    changed_objects: usize,
    plan_ms: f64,
}

/// The proxy's sync loop. [`ProxyLoop::run`] runs it for good; tests call
/// [`ProxyLoop::round`] one round at a time.
pub struct ProxyLoop<B, S, C, O> {
    settings: LoopSettings,
    config: ConfigFn,
    backend: B,
    source: S,
    clock: C,
    observer: O,
    /// The source was handed to the observer and its first complete view arrived.
    started: bool,
    planner: Planner,
    /// What changed since the last successful sync (`None` before the first): a failed
    /// sync's diff is composed with the next, so observers never miss a change.
    unobserved: Option<PlanDiff>,
    synced_once: bool,
    /// Trigger times of the EndpointSlices changed since the last successful sync.
    triggers: Vec<SystemTime>,
    /// When the oldest change not yet in the kernel reached the store.
    pending_since: Option<Instant>,
    node_key: ObjectKey,
    seen: u64,
    last_sync: Option<Instant>,
    last_full: Option<Instant>,
    last_check: Instant,
    failing: bool,
    failures: FailureLog,
    plan_warnings: Conditions,
    /// The periodic check of the kernel's rules, when it cannot run: said once per error.
    check_failure: Conditions,
    first: bool,
}

impl<B: Backend, S: ObjectSource, C: Clock, O: SyncObserver> ProxyLoop<B, S, C, O> {
    pub fn new(
        settings: LoopSettings,
        config: ConfigFn,
        backend: B,
        source: S,
        clock: C,
        observer: O,
    ) -> Self {
        let node_key = ObjectKey::new(Kind::Node, "", settings.node_name.as_str());
        let now = clock.now();
        Self {
            settings,
            config,
            backend,
            source,
            clock,
            observer,
            started: false,
            planner: Planner::default(),
            unobserved: None,
            synced_once: false,
            triggers: Vec::new(),
            pending_since: None,
            node_key,
            seen: 0,
            last_sync: None,
            last_full: None,
            last_check: now,
            failing: false,
            failures: FailureLog::default(),
            plan_warnings: Conditions::default(),
            check_failure: Conditions::default(),
            first: true,
        }
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn observer(&self) -> &O {
        &self.observer
    }

    pub fn source(&self) -> &S {
        &self.source
    }

    /// Runs forever; returns only when the node configuration cannot be read.
    pub fn run(mut self) -> Result<Infallible, LoopError> {
        loop {
            self.round()?;
        }
    }

    /// Hands the source's check to the observer (health follows it), then blocks until the
    /// source has produced a complete first view (for the API: every kind's initial list).
    /// Until then nothing is synced, so whatever rules the kernel holds (from an earlier run)
    /// stay in place: an unreadable or missing directory, or an API server that does not
    /// answer, must never become an empty or partial world. The first [`Self::round`] calls
    /// this.
    pub fn wait_for_first_view(&mut self) {
        if self.started {
            return;
        }
        self.observer.source_started(self.source.health_check());
        let mut said = false;
        let started = self.clock.now();
        while !self.source.ready() {
            // Quiet during the first scan of an ordinary start.
            let waited = self.clock.now().saturating_duration_since(started);
            if !said && waited > Duration::from_secs(1) {
                if let Err(why) = self.source.check() {
                    warn!("not syncing yet, the rules in the kernel are kept: {why}");
                    said = true;
                }
            }
            self.clock.sleep(Duration::from_millis(50));
        }
        if said {
            info!("object source ready: syncing");
        }
        self.started = true;
        self.last_check = self.clock.now();
    }

    /// One round: waits for a change or the periodic resync (not before the first view, and
    /// not sooner than `min_sync_period` after the previous sync), plans what changed, checks
    /// the kernel's rules when a sync period has passed, and syncs.
    pub fn round(&mut self) -> Result<(), LoopError> {
        self.wait_for_first_view();
        self.wait_for_change();
        let (diff, planned) = self.plan()?;
        self.check_rules();
        self.sync(diff, planned);
        Ok(())
    }

    /// Waits for a change, or for the periodic resync (sooner after a failure); then batches
    /// changes arriving faster than `min_sync_period`. The first sync does not wait.
    fn wait_for_change(&mut self) {
        let s = &self.settings;
        if let Some(last) = self.last_sync {
            let period = if self.failing {
                s.min_sync_period.max(Duration::from_secs(1))
            } else {
                s.sync_period
            };
            let wait = (last + period).saturating_duration_since(self.clock.now());
            self.source.wait_newer(self.seen, wait);
            self.observer.queued();
            let earliest = last + s.min_sync_period;
            self.clock
                .sleep(earliest.saturating_duration_since(self.clock.now()));
        } else {
            self.observer.queued();
        }
    }

    /// Takes what changed since the last round and replans only that: the planner replans
    /// the services these objects belong to, not the cluster, and hands over what changed
    /// in the plan, so the backend applies only that.
    fn plan(&mut self) -> Result<(PlanDiff, Planned), LoopError> {
        let changes = self.source.take_changes();
        self.seen = changes.generation;
        self.last_sync = Some(self.clock.now());
        if let Some(t) = changes.since {
            self.pending_since = Some(self.pending_since.map_or(t, |p| p.min(t)));
        }
        if !self.first {
            self.triggers.extend(change_triggers(&changes.objects));
        }
        let changed_objects = changes.objects.len();
        let own_node = match self.source.get(&self.node_key) {
            Some(Object::Node(n)) => Some(n),
            _ => None,
        };
        self.observer
            .node_eligible(node_eligible(own_node.as_deref()));
        let config = (self.config)().map_err(LoopError::Config)?;
        let planning = self.clock.now();
        let diff = self.planner.update(changes.objects, &config);
        let planned = Planned {
            changed_objects,
            plan_ms: self.since(planning).as_secs_f64() * 1e3,
        };
        self.log_plan(&planned);
        Ok((diff, planned))
    }

    /// The plan's warnings as they appear, change and clear (a warning holds as long as its
    /// cause, such as a NodePort not served until the Node is known: not said on every
    /// sync), and the first plan's size.
    fn log_plan(&mut self, planned: &Planned) {
        let plan = self.planner.current();
        let said = self
            .plan_warnings
            .update(plan.warnings.iter().map(String::as_str));
        for w in said.cleared {
            info!("plan: resolved: {w}");
        }
        for w in said.appeared {
            warn!("plan: {w}");
        }
        if self.first {
            info!(
                objects = planned.changed_objects,
                service_ports = plan.services.len(),
                plan_ms = planned.plan_ms,
                "planned the initial objects"
            );
        }
        self.first = false;
    }

    /// Every --sync-period, even while changes keep coming, checks that the kernel still
    /// holds what weir wrote (an outside flush is repaired by a full sync); and every
    /// --full-sync-period has every rule rewritten regardless (kube-proxy: hourly).
    fn check_rules(&mut self) {
        if self.since(self.last_check) >= self.settings.sync_period {
            self.last_check = self.clock.now();
            let check = self.backend.intact();
            let said = self
                .check_failure
                .update(check.as_ref().err().map(|e| e.to_string()));
            for e in said.cleared.iter().filter(|_| check.is_ok()) {
                info!(
                    mode = self.backend.mode(),
                    "checking the rules works again (it failed: {e})"
                );
            }
            match check {
                Ok(true) => {}
                Ok(false) => {
                    warn!(
                        mode = self.backend.mode(),
                        "weir's rules were changed behind its back (an outside flush?); full resync"
                    );
                    self.backend.invalidate();
                }
                Err(_) => {
                    for e in said.appeared {
                        warn!(mode = self.backend.mode(), "checking the rules failed: {e}");
                    }
                }
            }
        }
        if self
            .last_full
            .is_some_and(|t| self.since(t) >= self.settings.full_sync_period)
        {
            self.backend.invalidate();
        }
    }

    /// Hands the plan and `diff` to the backend; the observer hears of every change since
    /// the last successful sync.
    fn sync(&mut self, diff: PlanDiff, planned: Planned) {
        let result = self.backend.sync_diff(self.planner.current(), &diff);
        let diff = match self.unobserved.take() {
            Some(earlier) => earlier.then(diff),
            None => diff,
        };
        match result {
            Ok(report) => self.synced(diff, report, planned),
            Err(e) => self.sync_failed(diff, e),
        }
    }

    fn synced(&mut self, diff: PlanDiff, report: SyncReport, planned: Planned) {
        self.failing = false;
        if let Some(line) = self.failures.succeeded() {
            info!(mode = self.backend.mode(), "{line}");
        }
        if report.kind == SyncKind::Full {
            self.last_full = Some(self.clock.now());
        }
        // From the oldest change's arrival in the store to the rules in the kernel.
        let event_to_rules_ms = self
            .pending_since
            .take()
            .map(|t| self.since(t).as_secs_f64() * 1e3);
        let plan = self.planner.current();
        if report.kind != SyncKind::Noop {
            info!(
                mode = self.backend.mode(),
                kind = ?report.kind,
                service_ports = plan.services.len(),
                touched = report.service_ports_touched,
                changed_objects = planned.changed_objects,
                elapsed_ms = report.elapsed.as_secs_f64() * 1e3,
                plan_ms = planned.plan_ms,
                event_to_rules_ms = event_to_rules_ms.unwrap_or(0.0),
                "synced"
            );
        }
        self.observer.synced(
            self.synced_once.then_some(&diff),
            plan,
            &report,
            &self.triggers,
        );
        self.synced_once = true;
        self.triggers.clear();
        if report.kind == SyncKind::Full {
            release_freed_memory();
        }
    }

    fn sync_failed(&mut self, diff: PlanDiff, e: crate::Error) {
        self.failing = true;
        self.unobserved = Some(diff);
        // The backend's contract already makes the next sync a full one after an
        // error; the loop says so too, so no backend can retry with a partial sync
        // on top of rules it left half-written.
        self.backend.invalidate();
        let now = self.clock.now();
        if let Some(line) = self.failures.failed(&e.to_string(), now) {
            warn!(mode = self.backend.mode(), "{line}");
        }
        self.observer.failed(&e);
    }

    fn since(&self, t: Instant) -> Duration {
        self.clock.now().saturating_duration_since(t)
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
