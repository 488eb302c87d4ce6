//! The policy agent's loop: objects → [`crate::plan()`] → [`Backend`], with a minimum gap
//! between syncs and a periodic check of the kernel's table.
//!
//! [`PolicyLoop`] is generic over what it talks to, as the proxy's `ProxyLoop` is, so it runs
//! without root and without a kernel in tests (`tests/agent_loop.rs`):
//! - a [`Backend`] ([`crate::kernel::NftBackend`] on a node; tests record calls),
//! - a [`PolicySource`]: the object store as the loop reads it (readiness, changes since the
//!   last round); in the `weir` binary weir-source's store fed by a manifest directory or the
//!   Kubernetes API,
//! - a [`Clock`] (`now`, `sleep`),
//! - a [`PolicyObserver`] (metrics and health in the binary).
//!
//! The loop keeps its own [`Cluster`] (sharing the store's objects) in a [`NodePlanner`],
//! moves it by each round's changes, logs each changed object's conversion warnings once, and
//! replans when anything changed: the planner recompiles only the policies a change can
//! affect (`docs/policy.md`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::backend::{Backend, Error, SyncKind, SyncReport};
use crate::key::ObjectKey;
use crate::model::{Cluster, Converted, NamespaceInfo, PodInfo, PolicyInfo};
use crate::plan::PolicyPlan;
use crate::planner::NodePlanner;

/// Time as the loop sees it: a test drives minutes of periods in microseconds.
pub trait Clock {
    fn now(&self) -> Instant;
    /// Blocks for `d` (a virtual clock advances by `d` instead).
    fn sleep(&self, d: Duration);
}

/// [`Instant::now`] and [`std::thread::sleep`].
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

/// One object that changed, as it is now (`None`: deleted, or not readable as a policy
/// input).
#[derive(Debug, Clone)]
pub enum Change {
    Namespace {
        name: Arc<str>,
        now: Option<Arc<NamespaceInfo>>,
    },
    Pod {
        key: ObjectKey,
        now: Option<Arc<Converted<PodInfo>>>,
    },
    Policy {
        key: ObjectKey,
        now: Option<Arc<Converted<PolicyInfo>>>,
    },
}

/// What changed since the previous [`PolicySource::take_changes`].
#[derive(Debug, Clone, Default)]
pub struct Changes {
    /// The source's generation these changes bring the loop to.
    pub generation: u64,
    pub changes: Vec<Change>,
    /// When the oldest of them reached the source (the start of change-to-rules latency).
    pub since: Option<Instant>,
}

/// Where the loop's objects come from.
pub trait PolicySource {
    /// A complete first view of Namespaces, Pods and NetworkPolicies is in: nothing is
    /// synced before (a partial view would leave pods unisolated or peers missing).
    fn ready(&self) -> bool;
    /// `Ok` while the source is current; otherwise why not.
    fn check(&self) -> Result<(), String>;
    /// Waits until the generation exceeds `seen` or `timeout` passes; returns the generation.
    fn wait_newer(&self, seen: u64, timeout: Duration) -> u64;
    /// What changed since the previous call (everything, the first time).
    fn take_changes(&self) -> Changes;
}

/// A successful sync, for observers.
#[derive(Debug)]
pub struct Synced<'a> {
    pub plan: &'a PolicyPlan,
    pub report: &'a SyncReport,
    /// Planning and the backend's sync together.
    pub duration: Duration,
    /// From the oldest change not yet in the kernel reaching the source to now (`None`
    /// when this sync carried no change: a repair, a retry).
    pub change_to_rules: Option<Duration>,
}

/// Hooks around each round (metrics and health in the binary).
pub trait PolicyObserver {
    /// The first complete view arrived; syncing starts.
    fn source_ready(&mut self) {}
    fn synced(&mut self, _synced: &Synced<'_>) {}
    fn failed(&mut self, _error: &Error) {}
    /// The conversion warnings the current objects carry, in total.
    fn warnings(&mut self, _total: usize) {}
}

impl PolicyObserver for () {}

impl<O: PolicyObserver + ?Sized> PolicyObserver for &mut O {
    fn source_ready(&mut self) {
        (**self).source_ready()
    }
    fn synced(&mut self, synced: &Synced<'_>) {
        (**self).synced(synced)
    }
    fn failed(&mut self, error: &Error) {
        (**self).failed(error)
    }
    fn warnings(&mut self, total: usize) {
        (**self).warnings(total)
    }
}

/// `--node-name`, `--sync-period`, `--min-sync-period`.
#[derive(Debug, Clone)]
pub struct LoopSettings {
    pub node_name: String,
    /// How often the kernel's table is checked (and a missing or changed one rewritten)
    /// without changes.
    pub sync_period: Duration,
    /// Changes arriving faster than this are batched into one sync.
    pub min_sync_period: Duration,
}

/// After a failed sync the next attempt comes this soon (or `min_sync_period`, if longer).
const RETRY: Duration = Duration::from_secs(1);

/// The policy agent's loop. [`PolicyLoop::run`] runs it for good; tests call
/// [`PolicyLoop::round`].
pub struct PolicyLoop<B, S, C, O> {
    settings: LoopSettings,
    backend: B,
    source: S,
    clock: C,
    observer: O,
    started: bool,
    planner: NodePlanner,
    /// Warnings per object (kind, key) that has any.
    warnings: HashMap<(&'static str, ObjectKey), usize>,
    plan: Option<PolicyPlan>,
    /// The kernel may not hold `plan`: a change, a failure or a failed check since the last
    /// successful sync.
    dirty: bool,
    seen: u64,
    pending_since: Option<Instant>,
    last_sync: Option<Instant>,
    last_check: Instant,
    failing: Option<String>,
    check_failing: Option<String>,
}

impl<B: Backend, S: PolicySource, C: Clock, O: PolicyObserver> PolicyLoop<B, S, C, O> {
    pub fn new(settings: LoopSettings, backend: B, source: S, clock: C, observer: O) -> Self {
        let now = clock.now();
        let planner = NodePlanner::new(Cluster::default(), &settings.node_name);
        PolicyLoop {
            settings,
            backend,
            source,
            clock,
            observer,
            started: false,
            planner,
            warnings: HashMap::new(),
            plan: None,
            dirty: true,
            seen: 0,
            pending_since: None,
            last_sync: None,
            last_check: now,
            failing: None,
            check_failing: None,
        }
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    pub fn source(&self) -> &S {
        &self.source
    }

    pub fn observer(&self) -> &O {
        &self.observer
    }

    /// The objects the loop has read so far.
    pub fn cluster(&self) -> &Cluster {
        self.planner.cluster()
    }

    /// The plan of the last round (`None` before the first).
    pub fn plan(&self) -> Option<&PolicyPlan> {
        self.plan.as_ref()
    }

    /// Runs for good.
    pub fn run(mut self) -> ! {
        loop {
            self.round();
        }
    }

    /// Blocks until the source has a complete first view. Until then nothing is synced: the
    /// table an earlier run left keeps enforcing, and no partial world is ever planned.
    pub fn wait_for_first_view(&mut self) {
        if self.started {
            return;
        }
        let started = self.clock.now();
        let mut said = false;
        while !self.source.ready() {
            let waited = self.clock.now().saturating_duration_since(started);
            if !said && waited > Duration::from_secs(1) {
                if let Err(why) = self.source.check() {
                    warn!("policy: not syncing yet, the rules in the kernel are kept: {why}");
                    said = true;
                }
            }
            self.clock.sleep(Duration::from_millis(50));
        }
        if said {
            info!("policy: object source ready: syncing");
        }
        self.started = true;
        self.last_check = self.clock.now();
        self.observer.source_ready();
    }

    /// One round: waits for a change or the sync period (not before the first view, and
    /// not sooner than `min_sync_period` after the previous sync), plans if anything
    /// changed, checks the kernel's table once per sync period, and syncs what is not in
    /// the kernel yet.
    pub fn round(&mut self) {
        self.wait_for_first_view();
        if let Some(last) = self.last_sync {
            let period = match self.failing {
                Some(_) => self.settings.min_sync_period.max(RETRY),
                None => self.settings.sync_period,
            };
            let wait = (last + period).saturating_duration_since(self.clock.now());
            self.source.wait_newer(self.seen, wait);
            let earliest = last + self.settings.min_sync_period;
            self.clock
                .sleep(earliest.saturating_duration_since(self.clock.now()));
        }
        let changes = self.source.take_changes();
        // From the oldest change reaching the source to this round taking it.
        let queued = changes
            .since
            .map(|t| self.clock.now().saturating_duration_since(t));
        self.seen = changes.generation;
        if let Some(t) = changes.since {
            self.pending_since = Some(self.pending_since.map_or(t, |p| p.min(t)));
        }
        let round_start = self.clock.now();
        self.last_sync = Some(round_start);
        if !changes.changes.is_empty() || self.plan.is_none() {
            let first = self.plan.is_none();
            let count = changes.changes.len();
            self.apply_changes(changes.changes);
            let planning = Instant::now();
            let planned = self.planner.plan();
            if first {
                let cluster = self.planner.cluster();
                info!(
                    namespaces = cluster.namespaces.len(),
                    pods = cluster.pods.len(),
                    policies = cluster.policies.len(),
                    local_pods = planned.pods.len(),
                    plan_ms = planning.elapsed().as_secs_f64() * 1e3,
                    "policy: planned the initial objects"
                );
            } else {
                tracing::debug!(
                    changed_objects = count,
                    queued_ms = queued.map_or(0.0, |q| q.as_secs_f64() * 1e3),
                    plan_ms = planning.elapsed().as_secs_f64() * 1e3,
                    "policy: planned"
                );
            }
            if self.plan.as_ref() != Some(&planned) {
                self.dirty = true;
            }
            self.plan = Some(planned);
        }
        self.check_kernel();
        if !self.dirty {
            return;
        }
        let plan = self.plan.as_ref().expect("planned above");
        match self.backend.sync(plan) {
            Ok(report) => {
                self.dirty = false;
                if let Some(e) = self.failing.take() {
                    info!("policy: sync succeeded again (it failed: {e})");
                }
                let duration = self.clock.now().saturating_duration_since(round_start);
                let change_to_rules = self
                    .pending_since
                    .take()
                    .map(|t| self.clock.now().saturating_duration_since(t));
                if report.kind != SyncKind::Noop {
                    info!(
                        kind = ?report.kind,
                        local_pods = plan.pods.len(),
                        chains = report.chains,
                        rules = report.rules,
                        chains_written = report.chains_written,
                        script_bytes = report.script_bytes,
                        nft_ms = report.elapsed.as_secs_f64() * 1e3,
                        "policy: synced"
                    );
                }
                self.observer.synced(&Synced {
                    plan,
                    report: &report,
                    duration,
                    change_to_rules,
                });
            }
            Err(e) => {
                // Whatever the kernel holds now, the next sync writes the whole table.
                self.backend.invalidate();
                let text = e.to_string();
                if self.failing.as_deref() != Some(text.as_str()) {
                    warn!("policy: sync failed, retrying: {text}");
                }
                self.failing = Some(text);
                self.observer.failed(&e);
            }
        }
    }

    /// Once per sync period: does the kernel still hold what was written? If not (an
    /// outside `nft flush ruleset`), the next sync writes the whole table.
    fn check_kernel(&mut self) {
        let now = self.clock.now();
        if now.saturating_duration_since(self.last_check) < self.settings.sync_period {
            return;
        }
        self.last_check = now;
        match self.backend.intact() {
            Ok(true) => {
                if let Some(e) = self.check_failing.take() {
                    info!("policy: checking the table works again (it failed: {e})");
                }
            }
            Ok(false) => {
                self.check_failing = None;
                warn!("policy: table inet weir-policy was changed behind weir's back (an outside flush?): rewriting it");
                self.backend.invalidate();
                self.dirty = true;
            }
            Err(e) => {
                let text = e.to_string();
                if self.check_failing.as_deref() != Some(text.as_str()) {
                    warn!("policy: cannot check the table: {text}");
                }
                self.check_failing = Some(text);
            }
        }
    }

    /// Moves the loop's cluster by `changes`, saying each changed object's warnings.
    fn apply_changes(&mut self, changes: Vec<Change>) {
        let mut warnings_changed = false;
        for change in changes {
            match change {
                Change::Namespace { name, now } => match now {
                    Some(ns) => self.planner.insert_namespace(ns),
                    None => {
                        self.planner.remove_namespace(&name);
                    }
                },
                Change::Pod { key, now } => {
                    warnings_changed |= self.note_warnings("Pod", &key, now.as_deref());
                    match now {
                        Some(pod) => self.planner.insert_pod(pod.value.clone()),
                        None => {
                            self.planner.remove_pod(&key);
                        }
                    }
                }
                Change::Policy { key, now } => {
                    warnings_changed |= self.note_warnings("NetworkPolicy", &key, now.as_deref());
                    match now {
                        Some(policy) => self.planner.insert_policy(policy.value.clone()),
                        None => {
                            self.planner.remove_policy(&key);
                        }
                    }
                }
            }
        }
        if warnings_changed {
            self.observer.warnings(self.warnings.values().sum());
        }
    }

    /// Logs the warnings of an object that changed (each change once) and keeps the count;
    /// returns whether the count changed.
    fn note_warnings<T>(
        &mut self,
        kind: &'static str,
        key: &ObjectKey,
        now: Option<&Converted<T>>,
    ) -> bool {
        let list = now.map_or(&[][..], |c| &c.warnings[..]);
        for w in list {
            warn!(
                kind = w.kind,
                object = %w.object,
                field = %w.field,
                "policy: {}; enforced instead: {}",
                w.problem,
                w.outcome
            );
        }
        let slot = (kind, key.clone());
        let before = if list.is_empty() {
            self.warnings.remove(&slot)
        } else {
            self.warnings.insert(slot, list.len())
        };
        before.unwrap_or(0) != list.len()
    }
}
