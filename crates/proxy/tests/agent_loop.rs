//! The proxy's sync loop (`weir_proxy::agent::ProxyLoop`) without root, a kernel or real time:
//! a recording backend, a scripted object source and a virtual clock. Each test drives the
//! loop round by round and asserts the backend calls it made and when (virtual ms).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use weir_model::{Object, ObjectKey, Plan, PlanDiff, ProxyConfig};
use weir_proxy::agent::{
    Clock, LoopSettings, ObjectSource, Operations, OperationsSettings, ProxyLoop, SyncObserver,
};
use weir_proxy::health::SourceCheck;
use weir_proxy::{Backend, Error, SyncKind, SyncReport};
use weir_source::Changes;

// ---- a virtual clock ------------------------------------------------------------------

/// Time starts at a real `Instant` and moves only when the loop sleeps or the source
/// waits. Clones share the time.
#[derive(Clone)]
struct FakeClock {
    base: Instant,
    offset: Arc<Mutex<Duration>>,
}

impl FakeClock {
    fn new() -> Self {
        Self {
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

// ---- a scripted object source ---------------------------------------------------------

#[derive(Clone)]
enum Step {
    /// The complete first view is in (an API source's initial lists, a first scan).
    Ready,
    /// A successful list/watch/scan: the source is current as of now.
    Listed,
    Apply(Object),
}

#[derive(Default)]
struct Script {
    /// (virtual time, step), applied once the clock reaches the time.
    steps: Vec<(Duration, Step)>,
    objects: BTreeMap<ObjectKey, Object>,
    changed: Vec<ObjectKey>,
    since: Option<Instant>,
    generation: u64,
    ready: bool,
    last_success: Option<Duration>,
    /// `check` fails when no successful list has come for longer than this.
    stale_after: Duration,
}

/// A store fed by a script over virtual time.
#[derive(Clone)]
struct ScriptedSource {
    script: Arc<Mutex<Script>>,
    clock: FakeClock,
}

impl ScriptedSource {
    fn new(clock: &FakeClock, stale_after: Duration, steps: Vec<(Duration, Step)>) -> Self {
        let script = Script {
            steps,
            stale_after,
            ..Script::default()
        };
        Self {
            script: Arc::new(Mutex::new(script)),
            clock: clock.clone(),
        }
    }

    /// Applies every step due by now.
    fn apply_due(&self) -> std::sync::MutexGuard<'_, Script> {
        let now = self.clock.elapsed();
        let mut s = self.script.lock().unwrap();
        let due: Vec<_> = {
            let (due, later) = s.steps.drain(..).partition(|(at, _)| *at <= now);
            s.steps = later;
            due
        };
        for (at, step) in due {
            match step {
                Step::Ready => {
                    s.ready = true;
                    s.last_success = Some(at);
                }
                Step::Listed => s.last_success = Some(at),
                Step::Apply(o) => {
                    let key = o.key();
                    s.objects.insert(key.clone(), o);
                    s.changed.push(key);
                    s.generation += 1;
                    s.since.get_or_insert(self.clock.base + at);
                }
            }
        }
        s
    }

    fn check_now(&self) -> Result<(), String> {
        let now = self.clock.elapsed();
        let s = self.apply_due();
        if !s.ready {
            return Err("no complete view yet".into());
        }
        let last = s.last_success.unwrap_or_default();
        if now - last > s.stale_after {
            return Err(format!(
                "no successful list or watch for {}s",
                (now - last).as_secs()
            ));
        }
        Ok(())
    }
}

impl ObjectSource for ScriptedSource {
    fn ready(&self) -> bool {
        self.apply_due().ready
    }
    fn check(&self) -> Result<(), String> {
        self.check_now()
    }
    fn health_check(&self) -> SourceCheck {
        let me = self.clone();
        Box::new(move || me.check_now())
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
        let keys = std::mem::take(&mut s.changed);
        Changes {
            generation: s.generation,
            objects: keys
                .into_iter()
                .map(|k| {
                    let o = s.objects.get(&k).cloned();
                    (k, o)
                })
                .collect(),
            since: s.since.take(),
        }
    }
    fn get(&self, key: &ObjectKey) -> Option<Object> {
        self.apply_due().objects.get(key).cloned()
    }
}

/// A Service `svc-<i>` (ClusterIP 10.96.0.<10+i>, TCP 80) and its EndpointSlice (one ready
/// endpoint on another node).
fn service(i: u32) -> Vec<Object> {
    let yaml = format!(
        "apiVersion: v1
kind: Service
metadata: {{name: svc-{i}, namespace: default}}
spec: {{clusterIP: 10.96.0.{ip}, ports: [{{port: 80, targetPort: 8080}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: svc-{i}-1, namespace: default, labels: {{kubernetes.io/service-name: svc-{i}}}}}
addressType: IPv4
ports: [{{port: 8080}}]
endpoints:
  - {{addresses: [10.244.1.{ip}], nodeName: node-b}}
",
        ip = 10 + i
    );
    let parsed = weir_source::parse_manifest(Path::new("test.yaml"), &yaml);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    assert_eq!(parsed.objects.len(), 2);
    parsed.objects
}

fn applied(at: Duration, i: u32) -> Vec<(Duration, Step)> {
    service(i)
        .into_iter()
        .map(|o| (at, Step::Apply(o)))
        .collect()
}

// ---- a recording backend --------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
enum What {
    /// `sync_diff`: its outcome (a kind, or failed), the plan's service ports, the diff's
    /// touched service ports.
    Sync {
        kind: Option<SyncKind>,
        ports: usize,
        touched: usize,
    },
    Intact(bool),
    Invalidate,
}

#[derive(Default)]
struct Record {
    /// (virtual ms, call).
    calls: Vec<(u64, What)>,
    /// The next this many syncs fail.
    fail: usize,
    /// What `intact` answers (true unless told).
    not_intact: bool,
    /// Like the real backends: the next sync is full before the first success and after
    /// `invalidate`. (Not after a failure by itself: that is the loop's job to say.)
    full_next: bool,
    synced_once: bool,
}

#[derive(Clone)]
struct RecordingBackend {
    rec: Arc<Mutex<Record>>,
    clock: FakeClock,
}

impl RecordingBackend {
    fn new(clock: &FakeClock) -> Self {
        Self {
            rec: Arc::default(),
            clock: clock.clone(),
        }
    }
    fn calls(&self) -> Vec<(u64, What)> {
        self.rec.lock().unwrap().calls.clone()
    }
    fn syncs(&self) -> Vec<(u64, What)> {
        self.calls()
            .into_iter()
            .filter(|(_, w)| matches!(w, What::Sync { .. }))
            .collect()
    }
    fn record(&self, rec: &mut Record, what: What) {
        rec.calls
            .push((self.clock.elapsed().as_millis() as u64, what));
    }
}

impl Backend for RecordingBackend {
    fn mode(&self) -> &'static str {
        "recording"
    }
    fn sync(&mut self, plan: &Plan) -> weir_proxy::Result<SyncReport> {
        self.sync_diff(plan, &Plan::default().diff(plan))
    }
    fn sync_diff(&mut self, plan: &Plan, diff: &PlanDiff) -> weir_proxy::Result<SyncReport> {
        let mut rec = self.rec.lock().unwrap();
        let (ports, touched) = (plan.services.len(), diff.touched().len());
        if rec.fail > 0 {
            rec.fail -= 1;
            let what = What::Sync {
                kind: None,
                ports,
                touched,
            };
            self.record(&mut rec, what);
            return Err(Error::Netlink("told to fail".into()));
        }
        let kind = if !rec.synced_once || rec.full_next {
            SyncKind::Full
        } else if touched > 0 {
            SyncKind::Partial
        } else {
            SyncKind::Noop
        };
        rec.synced_once = true;
        rec.full_next = false;
        let what = What::Sync {
            kind: Some(kind),
            ports,
            touched,
        };
        self.record(&mut rec, what);
        Ok(SyncReport {
            kind,
            elapsed: Duration::ZERO,
            service_ports_touched: touched,
        })
    }
    fn intact(&mut self) -> weir_proxy::Result<bool> {
        let mut rec = self.rec.lock().unwrap();
        let intact = !rec.not_intact;
        self.record(&mut rec, What::Intact(intact));
        Ok(intact)
    }
    fn invalidate(&mut self) {
        let mut rec = self.rec.lock().unwrap();
        rec.full_next = true;
        self.record(&mut rec, What::Invalidate);
    }
    fn cleanup(&mut self) -> weir_proxy::Result<()> {
        Ok(())
    }
}

// ---- a recording observer -------------------------------------------------------------

#[derive(Default)]
struct Seen {
    /// Per successful sync: the service ports its diff touched (`None`: the first sync).
    synced: Vec<Option<Vec<String>>>,
    failed: usize,
    source_started: bool,
}

#[derive(Clone, Default)]
struct RecordingObserver(Arc<Mutex<Seen>>);

impl SyncObserver for RecordingObserver {
    fn synced(&mut self, diff: Option<&PlanDiff>, _: &Plan, _: &SyncReport, _: &[SystemTime]) {
        let touched = diff.map(|d| d.touched().iter().map(|k| k.name.to_string()).collect());
        self.0.lock().unwrap().synced.push(touched);
    }
    fn failed(&mut self, _: &Error) {
        self.0.lock().unwrap().failed += 1;
    }
    fn source_started(&mut self, _: SourceCheck) {
        self.0.lock().unwrap().source_started = true;
    }
}

// ---- wiring ---------------------------------------------------------------------------

const SYNC_PERIOD: Duration = Duration::from_secs(30);
const MIN_SYNC_PERIOD: Duration = Duration::from_secs(1);

fn settings() -> LoopSettings {
    LoopSettings {
        node_name: "node-a".into(),
        sync_period: SYNC_PERIOD,
        full_sync_period: Duration::from_secs(3600),
        min_sync_period: MIN_SYNC_PERIOD,
    }
}

fn config() -> weir_proxy::agent::ConfigFn {
    Box::new(|| {
        Ok(ProxyConfig {
            node_name: "node-a".into(),
            cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
            ..Default::default()
        })
    })
}

type Loop<O> = ProxyLoop<RecordingBackend, ScriptedSource, FakeClock, O>;

fn start<O: SyncObserver>(
    steps: Vec<(Duration, Step)>,
    stale_after: Duration,
    observer: O,
) -> (Loop<O>, RecordingBackend, ScriptedSource, FakeClock) {
    let clock = FakeClock::new();
    let source = ScriptedSource::new(&clock, stale_after, steps);
    let backend = RecordingBackend::new(&clock);
    let l = ProxyLoop::new(
        settings(),
        config(),
        backend.clone(),
        source.clone(),
        clock.clone(),
        observer,
    );
    (l, backend, source, clock)
}

fn sync(kind: SyncKind, ports: usize, touched: usize) -> What {
    What::Sync {
        kind: Some(kind),
        ports,
        touched,
    }
}

// ---- the tests --------------------------------------------------------------------------

#[test]
fn nothing_is_synced_before_the_source_has_a_complete_view() {
    // svc-1 arrives at once, its world is complete only at 3 s (say, the last kind's list).
    let mut steps = applied(ms(0), 1);
    steps.extend(applied(ms(2000), 2));
    steps.push((ms(3000), Step::Ready));
    let observer = RecordingObserver::default();
    let (mut l, backend, _, clock) = start(steps, Duration::from_secs(60), observer.clone());

    l.round().unwrap();
    assert!(observer.0.lock().unwrap().source_started);
    // The first backend call of any kind comes once the view is complete, with all of it.
    assert_eq!(backend.calls(), vec![(3000, sync(SyncKind::Full, 2, 2))]);
    assert_eq!(clock.elapsed(), ms(3000));
}

#[test]
fn a_failed_sync_is_retried_within_a_second_as_a_full_sync() {
    let mut steps = vec![(ms(0), Step::Ready)];
    steps.extend(applied(ms(0), 1));
    steps.extend(applied(ms(5000), 2));
    let observer = RecordingObserver::default();
    let (mut l, backend, _, _) = start(steps, Duration::from_secs(600), observer.clone());

    l.round().unwrap();
    backend.rec.lock().unwrap().fail = 1;
    l.round().unwrap(); // svc-2 at 5 s: fails
    l.round().unwrap(); // no change: the retry
    assert_eq!(
        backend.calls(),
        vec![
            (0, sync(SyncKind::Full, 1, 1)),
            (
                5000,
                What::Sync {
                    kind: None,
                    ports: 2,
                    touched: 1
                }
            ),
            (5000, What::Invalidate),
            // Not a sync period later: max(min-sync-period, 1 s) after the failure; full.
            (6000, sync(SyncKind::Full, 2, 0)),
        ]
    );
    let seen = observer.0.lock().unwrap();
    assert_eq!(seen.failed, 1);
    // The observer still hears of svc-2: the failed round's diff carried over.
    assert_eq!(seen.synced, vec![None, Some(vec!["svc-2".to_string()])]);
}

#[test]
fn a_burst_of_changes_within_min_sync_period_is_one_sync() {
    let mut steps = vec![(ms(0), Step::Ready)];
    steps.extend(applied(ms(0), 1));
    steps.extend(applied(ms(200), 2));
    steps.extend(applied(ms(400), 3));
    steps.extend(applied(ms(600), 4));
    steps.extend(applied(ms(5000), 5));
    let (mut l, backend, _, _) = start(
        steps,
        Duration::from_secs(600),
        RecordingObserver::default(),
    );

    for _ in 0..3 {
        l.round().unwrap();
    }
    assert_eq!(
        backend.syncs(),
        vec![
            (0, sync(SyncKind::Full, 1, 1)),
            // svc-2..4 arrived at 200, 400, 600 ms: one sync, min-sync-period after the last.
            (1000, sync(SyncKind::Partial, 4, 3)),
            // A change after a quiet spell is synced when it comes.
            (5000, sync(SyncKind::Partial, 5, 1)),
        ]
    );
}

/// `GET path` on `addr`: (status, body).
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let code = text.split(' ').nth(1).unwrap().parse().unwrap();
    let body = text.split_once("\r\n\r\n").unwrap().1.to_string();
    (code, body)
}

#[test]
fn a_stale_source_turns_healthz_to_503_while_the_loop_goes_on() {
    // Lists succeed at 0, 10 and 20 s, then nothing; the source's limit is 45 s.
    let mut steps = vec![(ms(0), Step::Ready)];
    steps.extend(applied(ms(0), 1));
    steps.push((ms(10_000), Step::Listed));
    steps.push((ms(20_000), Step::Listed));
    let local = "127.0.0.1:0".parse().unwrap();
    let operations = Operations::start(
        &OperationsSettings {
            healthz: Some(local),
            metrics: Some(local),
            sync_period: SYNC_PERIOD,
        },
        "recording",
    )
    .unwrap();
    let addr = operations.healthz_addr().unwrap();
    let (mut l, backend, _, clock) = start(steps, Duration::from_secs(45), operations);

    let (code, body) = get(addr, "/healthz");
    assert_eq!(code, 503, "before the first sync: {body}");
    l.round().unwrap(); // 0 s
    let (code, body) = get(addr, "/healthz");
    assert_eq!(code, 200, "{body}");
    l.round().unwrap(); // 30 s: 10 s since the last list
    l.round().unwrap(); // 60 s: 40 s
    assert_eq!(clock.elapsed(), ms(60_000));
    let (code, body) = get(addr, "/healthz");
    assert_eq!(code, 200, "40 s without a list, within the limit: {body}");
    l.round().unwrap(); // 90 s: 70 s
    let (code, body) = get(addr, "/healthz");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains(r#""reason": "no successful list or watch for 70s""#),
        "{body}"
    );
    // The loop itself is alive and keeps the rules it has.
    assert_eq!(get(addr, "/livez").0, 200);
    assert_eq!(
        backend.syncs().last(),
        Some(&(90_000, sync(SyncKind::Noop, 1, 0)))
    );
}

#[test]
fn rules_changed_behind_its_back_are_repaired_by_a_full_sync() {
    let mut steps = vec![(ms(0), Step::Ready)];
    steps.extend(applied(ms(0), 1));
    let (mut l, backend, _, _) = start(
        steps,
        Duration::from_secs(600),
        RecordingObserver::default(),
    );

    l.round().unwrap(); // 0 s
    l.round().unwrap(); // 30 s: intact, nothing to do
    backend.rec.lock().unwrap().not_intact = true; // say, `nft flush ruleset`
    l.round().unwrap(); // 60 s
    backend.rec.lock().unwrap().not_intact = false;
    l.round().unwrap(); // 90 s
    assert_eq!(
        backend.calls(),
        vec![
            (0, sync(SyncKind::Full, 1, 1)),
            (30_000, What::Intact(true)),
            (30_000, sync(SyncKind::Noop, 1, 0)),
            (60_000, What::Intact(false)),
            (60_000, What::Invalidate),
            (60_000, sync(SyncKind::Full, 1, 0)),
            (90_000, What::Intact(true)),
            (90_000, sync(SyncKind::Noop, 1, 0)),
        ]
    );
}
