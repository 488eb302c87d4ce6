//! The policy loop (`weir_policy::agent::PolicyLoop`) without root, a kernel or real time: a
//! recording backend, a scripted object source and a virtual clock. Each test drives the
//! loop round by round and asserts what the backend was asked and when (virtual ms).

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::json;
use weir_policy::agent::{
    Change, Changes, Clock, LoopSettings, PolicyLoop, PolicyObserver, PolicySource, Synced,
};
use weir_policy::backend::{Backend, Error, SyncKind, SyncReport};
use weir_policy::model::NamespaceInfo;
use weir_policy::{Converted, ObjectKey, PolicyPlan};

// ---- a virtual clock ------------------------------------------------------------------

#[derive(Clone)]
struct FakeClock {
    base: Instant,
    offset: Arc<Mutex<Duration>>,
}

impl FakeClock {
    fn new() -> Self {
        FakeClock {
            base: Instant::now(),
            offset: Arc::new(Mutex::new(Duration::ZERO)),
        }
    }
    fn elapsed(&self) -> Duration {
        *self.offset.lock().unwrap()
    }
    fn set(&self, to: Duration) {
        let mut o = self.offset.lock().unwrap();
        *o = (*o).max(to);
    }
    fn ms(&self) -> u64 {
        self.elapsed().as_millis() as u64
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Instant {
        self.base + self.elapsed()
    }
    fn sleep(&self, d: Duration) {
        *self.offset.lock().unwrap() += d;
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

// ---- a scripted source ----------------------------------------------------------------

#[derive(Clone)]
enum Step {
    /// The complete first view is in.
    Ready,
    Change(Change),
}

#[derive(Default)]
struct Script {
    steps: Vec<(Duration, Step)>,
    pending: Vec<Change>,
    since: Option<Instant>,
    generation: u64,
    ready: bool,
}

#[derive(Clone)]
struct ScriptedSource {
    script: Arc<Mutex<Script>>,
    clock: FakeClock,
}

impl ScriptedSource {
    fn new(clock: &FakeClock, steps: Vec<(Duration, Step)>) -> Self {
        ScriptedSource {
            script: Arc::new(Mutex::new(Script {
                steps,
                ..Script::default()
            })),
            clock: clock.clone(),
        }
    }

    fn apply_due(&self) -> std::sync::MutexGuard<'_, Script> {
        let now = self.clock.elapsed();
        let mut s = self.script.lock().unwrap();
        let (due, later): (Vec<_>, Vec<_>) = s.steps.drain(..).partition(|(at, _)| *at <= now);
        s.steps = later;
        for (at, step) in due {
            match step {
                Step::Ready => s.ready = true,
                Step::Change(c) => {
                    s.pending.push(c);
                    s.generation += 1;
                    s.since.get_or_insert(self.clock.base + at);
                }
            }
        }
        s
    }
}

impl PolicySource for ScriptedSource {
    fn ready(&self) -> bool {
        self.apply_due().ready
    }
    fn check(&self) -> Result<(), String> {
        if self.apply_due().ready {
            Ok(())
        } else {
            Err("no complete view yet".into())
        }
    }
    fn wait_newer(&self, seen: u64, timeout: Duration) -> u64 {
        let deadline = self.clock.elapsed() + timeout;
        loop {
            let s = self.apply_due();
            if s.generation > seen {
                return s.generation;
            }
            let next = s.steps.iter().map(|(at, _)| *at).min();
            drop(s);
            match next {
                Some(at) if at <= deadline => self.clock.set(at),
                _ => {
                    self.clock.set(deadline);
                    return self.apply_due().generation;
                }
            }
        }
    }
    fn take_changes(&self) -> Changes {
        let mut s = self.apply_due();
        Changes {
            generation: s.generation,
            changes: std::mem::take(&mut s.pending),
            since: s.since.take(),
        }
    }
}

// ---- objects --------------------------------------------------------------------------

fn namespace(name: &str, team: &str) -> Change {
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": name, "labels": {"team": team}}}))
            .unwrap();
    Change::Namespace {
        name: name.into(),
        now: Some(Arc::new(NamespaceInfo::from(&ns))),
    }
}

fn pod(name: &str, node: &str, app: &str, ip: &str) -> Change {
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"namespace": "shop", "name": name, "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]},
        "status": {"phase": "Running", "podIPs": [{"ip": ip}]},
    }))
    .unwrap();
    Change::Pod {
        key: ObjectKey::new("shop", name),
        now: Some(Arc::new(Converted::pod(&p))),
    }
}

fn policy(name: &str, spec: serde_json::Value) -> Change {
    let p: NetworkPolicy = serde_json::from_value(
        json!({"metadata": {"namespace": "shop", "name": name}, "spec": spec}),
    )
    .unwrap();
    Change::Policy {
        key: ObjectKey::new("shop", name),
        now: Some(Arc::new(Converted::policy(&p))),
    }
}

fn deleted_policy(name: &str) -> Change {
    Change::Policy {
        key: ObjectKey::new("shop", name),
        now: None,
    }
}

/// web-0 (node n1), db-0 (n1), web-1 (n2).
fn world() -> Vec<Change> {
    vec![
        namespace("shop", "a"),
        pod("web-0", "n1", "web", "10.0.1.1"),
        pod("db-0", "n1", "db", "10.0.1.2"),
        pod("web-1", "n2", "web", "10.0.2.1"),
    ]
}

fn deny_db() -> Change {
    policy(
        "deny-db",
        json!({"podSelector": {"matchLabels": {"app": "db"}}}),
    )
}

fn at(t: Duration, changes: Vec<Change>) -> Vec<(Duration, Step)> {
    changes.into_iter().map(|c| (t, Step::Change(c))).collect()
}

// ---- a recording backend --------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
enum What {
    /// A sync: its outcome (a kind, or failed), the local pods, those isolated for ingress.
    Sync {
        kind: Option<SyncKind>,
        pods: usize,
        isolated: usize,
    },
    Intact(bool),
    Invalidate,
}

#[derive(Default)]
struct Record {
    calls: Vec<(u64, What)>,
    /// The next this many syncs fail.
    fail: usize,
    /// The next `intact` answers false.
    not_intact: bool,
    /// As the real backend: the first sync and the one after `invalidate` are full.
    full_next: bool,
    applied: Option<PolicyPlan>,
}

#[derive(Clone)]
struct RecordingBackend {
    record: Arc<Mutex<Record>>,
    clock: FakeClock,
}

impl RecordingBackend {
    fn new(clock: &FakeClock) -> Self {
        let record = Record {
            full_next: true,
            ..Record::default()
        };
        RecordingBackend {
            record: Arc::new(Mutex::new(record)),
            clock: clock.clone(),
        }
    }
    fn calls(&self) -> Vec<(u64, What)> {
        self.record.lock().unwrap().calls.clone()
    }
    fn syncs(&self) -> Vec<(u64, What)> {
        let calls = self.calls();
        calls
            .into_iter()
            .filter(|(_, w)| matches!(w, What::Sync { .. }))
            .collect()
    }
}

impl Backend for RecordingBackend {
    fn sync(&mut self, plan: &PolicyPlan) -> Result<SyncReport, Error> {
        let mut r = self.record.lock().unwrap();
        let (pods, isolated) = (
            plan.pods.len(),
            plan.pods.values().filter(|p| p.ingress.is_some()).count(),
        );
        let t = self.clock.ms();
        if r.fail > 0 {
            r.fail -= 1;
            r.calls.push((
                t,
                What::Sync {
                    kind: None,
                    pods,
                    isolated,
                },
            ));
            return Err(Error::Rejected("Error: Could not process rule".into()));
        }
        let kind = if r.full_next {
            SyncKind::Full
        } else if r.applied.as_ref() == Some(plan) {
            SyncKind::Noop
        } else {
            SyncKind::Diff
        };
        r.full_next = false;
        r.applied = Some(plan.clone());
        r.calls.push((
            t,
            What::Sync {
                kind: Some(kind),
                pods,
                isolated,
            },
        ));
        Ok(SyncReport {
            kind,
            elapsed: Duration::ZERO,
            chains: isolated,
            rules: 0,
            chains_written: 0,
            script_bytes: 0,
        })
    }
    fn intact(&mut self) -> Result<bool, Error> {
        let mut r = self.record.lock().unwrap();
        let ok = !std::mem::take(&mut r.not_intact);
        let t = self.clock.ms();
        r.calls.push((t, What::Intact(ok)));
        Ok(ok)
    }
    fn invalidate(&mut self) {
        let mut r = self.record.lock().unwrap();
        r.full_next = true;
        let t = self.clock.ms();
        r.calls.push((t, What::Invalidate));
    }
    fn cleanup(&mut self) -> Result<(), Error> {
        Ok(())
    }
}

// ---- an observer ----------------------------------------------------------------------

#[derive(Default)]
struct Seen {
    ready: usize,
    synced: Vec<(SyncKind, Option<Duration>)>,
    failed: usize,
    warnings: Vec<usize>,
}

impl PolicyObserver for Seen {
    fn source_ready(&mut self) {
        self.ready += 1;
    }
    fn synced(&mut self, s: &Synced<'_>) {
        self.synced.push((s.report.kind, s.change_to_rules));
    }
    fn failed(&mut self, _: &Error) {
        self.failed += 1;
    }
    fn warnings(&mut self, total: usize) {
        self.warnings.push(total);
    }
}

type Loop = PolicyLoop<RecordingBackend, ScriptedSource, FakeClock, Seen>;

fn new_loop(steps: Vec<(Duration, Step)>) -> (Loop, RecordingBackend, FakeClock) {
    let clock = FakeClock::new();
    let source = ScriptedSource::new(&clock, steps);
    let backend = RecordingBackend::new(&clock);
    let settings = LoopSettings {
        node_name: "n1".into(),
        sync_period: Duration::from_secs(30),
        min_sync_period: Duration::from_secs(1),
    };
    let l = PolicyLoop::new(
        settings,
        backend.clone(),
        source,
        clock.clone(),
        Seen::default(),
    );
    (l, backend, clock)
}

fn sync(at: u64, kind: Option<SyncKind>, pods: usize, isolated: usize) -> (u64, What) {
    (
        at,
        What::Sync {
            kind,
            pods,
            isolated,
        },
    )
}

// ---- the tests ------------------------------------------------------------------------

#[test]
fn nothing_is_written_before_the_complete_first_view_then_the_whole_table_once() {
    // Objects trickle in from 0 to 2 s (a first list in pages); the view is complete at 3 s.
    let mut steps = at(ms(0), world());
    steps.extend(at(ms(2000), vec![deny_db()]));
    steps.push((ms(3000), Step::Ready));
    let (mut l, backend, clock) = new_loop(steps);
    l.round();
    assert!(clock.ms() >= 3000);
    assert_eq!(
        backend.calls(),
        vec![sync(clock.ms(), Some(SyncKind::Full), 2, 1)]
    );
    assert_eq!(l.observer().ready, 1);
    assert_eq!(l.cluster().pods.len(), 3);
    // Nothing changes: the next round waits a whole sync period and only checks the table.
    l.round();
    assert_eq!(
        backend.calls()[1..],
        [(clock.ms(), What::Intact(true))],
        "no sync without a change"
    );
    assert_eq!(clock.ms(), 3000 + 30_000);
}

#[test]
fn changes_are_batched_by_the_min_sync_period_and_the_plan_follows_them() {
    let mut steps = at(ms(0), world());
    steps.push((ms(0), Step::Ready));
    steps.extend(at(ms(5000), vec![deny_db()]));
    steps.extend(at(ms(5100), vec![pod("db-1", "n1", "db", "10.0.1.3")]));
    steps.extend(at(ms(5200), vec![deleted_policy("deny-db")]));
    steps.extend(at(ms(5300), vec![deny_db()]));
    let (mut l, backend, _clock) = new_loop(steps);
    l.round();
    l.round(); // woken at 5.0 s, waits for 1 s after the previous sync (0 s): none; syncs at 5.0
    l.round(); // the rest, batched: not before 6.0 s
    assert_eq!(
        backend.syncs(),
        vec![
            sync(0, Some(SyncKind::Full), 2, 0),
            sync(5000, Some(SyncKind::Diff), 2, 1),
            sync(6000, Some(SyncKind::Diff), 3, 2),
        ]
    );
    // The change-to-rules latency runs from the oldest change of the batch.
    let seen = &l.observer().synced;
    assert_eq!(seen[1].1, Some(ms(0)));
    assert_eq!(seen[2].1, Some(ms(6000 - 5100)));
}

#[test]
fn the_table_is_checked_every_sync_period_and_rewritten_when_changed_behind_its_back() {
    let mut steps = at(ms(0), world());
    steps.push((ms(0), Step::Ready));
    let (mut l, backend, _clock) = new_loop(steps);
    l.round();
    l.round(); // 30 s: intact
    backend.record.lock().unwrap().not_intact = true;
    l.round(); // 60 s: not intact → invalidate → the whole table again
    l.round(); // 90 s: intact, nothing to sync
    assert_eq!(
        backend.calls(),
        vec![
            sync(0, Some(SyncKind::Full), 2, 0),
            (30_000, What::Intact(true)),
            (60_000, What::Intact(false)),
            (60_000, What::Invalidate),
            sync(60_000, Some(SyncKind::Full), 2, 0),
            (90_000, What::Intact(true)),
        ]
    );
}

#[test]
fn a_failed_sync_is_retried_every_second_as_a_whole_table() {
    let mut steps = at(ms(0), world());
    steps.push((ms(0), Step::Ready));
    steps.extend(at(ms(10_000), vec![deny_db()]));
    let (mut l, backend, _clock) = new_loop(steps);
    l.round();
    backend.record.lock().unwrap().fail = 2;
    l.round();
    l.round();
    l.round();
    assert_eq!(
        backend.calls(),
        vec![
            sync(0, Some(SyncKind::Full), 2, 0),
            sync(10_000, None, 2, 1),
            (10_000, What::Invalidate),
            sync(11_000, None, 2, 1),
            (11_000, What::Invalidate),
            sync(12_000, Some(SyncKind::Full), 2, 1),
        ]
    );
    assert_eq!(l.observer().failed, 2);
    // The latency of the change counts from its arrival, failures included.
    assert_eq!(l.observer().synced[1].1, Some(ms(2000)));
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn conversion_warnings_are_said_once_per_object_change_and_counted() {
    let bad = || {
        policy(
            "odd",
            json!({"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/33"}}],
                   "ports": [{"protocol": "ICMP"}]}]}),
        )
    };
    let mut steps = at(ms(0), world());
    steps.push((ms(0), Step::Ready));
    steps.extend(at(ms(0), vec![bad()]));
    // Fixed, broken again, deleted: each change says the object's warnings (none when
    // fixed); the store lists an object only when it really changed.
    steps.extend(at(
        ms(5000),
        vec![policy("odd", json!({"podSelector": {}}))],
    ));
    steps.extend(at(ms(9000), vec![bad()]));
    steps.extend(at(ms(12_000), vec![deleted_policy("odd")]));
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let (mut l, _backend, _clock) = new_loop(steps);
    tracing::subscriber::with_default(subscriber, || {
        for _ in 0..4 {
            l.round();
        }
    });
    let log = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("enforced instead"))
        .collect();
    assert_eq!(lines.len(), 4, "two warnings, twice: {log}");
    assert!(
        lines[0].contains("shop/odd")
            && lines[0].contains("spec.ingress[0].from[0].ipBlock.cidr")
            && lines[0].contains("this peer allows nothing"),
        "{}",
        lines[0]
    );
    assert_eq!(l.observer().warnings, vec![2, 0, 2, 0]);
    // The odd policy isolated every pod of shop on n1 while it existed (podSelector {}).
    assert_eq!(l.plan().unwrap().pods.len(), 2);
}
