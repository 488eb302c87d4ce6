use std::sync::mpsc;
use std::time::Duration;

use weir_source::{
    watch_dir, Event, Kind, ManifestDir, Object, ObjectKey, SharedStore, Store, WatchEvent,
};

fn svc(name: &str, ip: &str) -> Object {
    let yaml = format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: ns}}\nspec: {{clusterIP: {ip}, ports: [{{port: 80}}]}}\n");
    weir_source::parse_manifest(std::path::Path::new("t.yaml"), &yaml)
        .objects
        .remove(0)
}

#[test]
fn store_applies_events_and_bumps_generation_only_on_change() {
    let mut s = Store::new();
    assert!(s.apply(Event::Applied(svc("a", "10.96.0.1"))));
    assert!(
        !s.apply(Event::Applied(svc("a", "10.96.0.1"))),
        "same object again is no change"
    );
    assert_eq!(s.generation(), 1);
    assert!(s.apply(Event::Applied(svc("b", "10.96.0.2"))));
    assert_eq!(s.snapshot().services.len(), 2);
    assert!(s.apply(Event::Deleted(ObjectKey::new(Kind::Service, "ns", "a"))));
    assert!(!s.apply(Event::Deleted(ObjectKey::new(Kind::Service, "ns", "a"))));
    assert!(s.apply(Event::Resync(vec![svc("c", "10.96.0.3")])));
    assert!(!s.apply(Event::Resync(vec![svc("c", "10.96.0.3")])));
    let snap = s.snapshot();
    assert_eq!(
        snap.services.keys().cloned().collect::<Vec<_>>(),
        [("ns".into(), "c".into())]
    );
    assert_eq!(s.generation(), 4);
}

/// A shared snapshot is the store's own maps (no copy) until the store changes; a change
/// then copies them, and the snapshot held keeps the objects as they were.
#[test]
fn shared_snapshots_are_the_stores_maps_until_a_change() {
    let s = SharedStore::new();
    s.apply(Event::Applied(svc("a", "10.96.0.1")));
    let (g1, first) = s.shared_snapshot();
    let (g2, again) = s.shared_snapshot();
    assert_eq!(g1, g2);
    assert!(
        std::sync::Arc::ptr_eq(&first, &again),
        "copied without a change"
    );
    drop(again);
    assert!(s.apply(Event::Applied(svc("b", "10.96.0.2"))));
    assert!(s.apply(Event::Deleted(ObjectKey::new(Kind::Service, "ns", "a"))));
    assert!(!s.apply(Event::Deleted(ObjectKey::new(Kind::Service, "ns", "a"))));
    assert_eq!(first.services.len(), 1, "the held snapshot changed");
    assert!(first.services.contains_key(&("ns".into(), "a".into())));
    let (g3, now) = s.wait_newer_shared(g1, Duration::from_secs(1)).unwrap();
    assert_eq!(g3, g1 + 2);
    assert_eq!(
        now.services.keys().cloned().collect::<Vec<_>>(),
        [("ns".into(), "b".into())]
    );
    assert_eq!(*now, s.snapshot().1);
    assert!(s.wait_newer_shared(g3, Duration::from_millis(10)).is_none());
}

#[test]
fn watcher_sends_a_resync_only_when_something_changed() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("a.yaml"), "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n").unwrap();
    let (tx, rx) = mpsc::channel();
    let (etx, erx) = mpsc::channel();
    let w = watch_dir(
        ManifestDir::new(tmp.path()),
        Duration::from_millis(20),
        tx,
        move |ev| {
            if let WatchEvent::Error(e) = ev {
                let _ = etx.send(e.to_string());
            }
        },
    );
    let t = Duration::from_secs(5);
    let Event::Resync(objs) = rx.recv_timeout(t).unwrap() else {
        panic!()
    };
    assert_eq!(objs.len(), 1);
    // Quiet directory: no event.
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());

    std::fs::write(tmp.path().join("b.yaml"), "apiVersion: v1\nkind: Service\nmetadata: {name: b}\nspec: {clusterIP: 10.96.0.2, ports: [{port: 80}]}\n").unwrap();
    let Event::Resync(objs) = rx.recv_timeout(t).unwrap() else {
        panic!()
    };
    assert_eq!(objs.len(), 2);

    // A broken edit: error reported, no event (objects kept).
    std::fs::write(tmp.path().join("b.yaml"), "kind: [\n").unwrap();
    assert!(erx.recv_timeout(t).unwrap().contains("b.yaml"));
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());

    std::fs::remove_file(tmp.path().join("b.yaml")).unwrap();
    let Event::Resync(objs) = rx.recv_timeout(t).unwrap() else {
        panic!()
    };
    assert_eq!(objs.len(), 1);
    w.stop();
}

#[test]
fn shared_store_wakes_waiters() {
    let store = SharedStore::new();
    let (g0, _) = store.snapshot();
    let s2 = store.clone();
    let h = std::thread::spawn(move || s2.wait_newer(g0, Duration::from_secs(5)));
    std::thread::sleep(Duration::from_millis(50));
    store.apply(Event::Applied(svc("a", "10.96.0.1")));
    let (g1, snap) = h.join().unwrap().expect("woken");
    assert!(g1 > g0);
    assert_eq!(snap.services.len(), 1);
    assert!(store.wait_newer(g1, Duration::from_millis(30)).is_none());
}

const SVC: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n";

#[test]
fn watcher_sends_nothing_until_the_directory_exists_and_never_an_empty_world_when_it_vanishes() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("manifests");
    let (tx, rx) = mpsc::channel();
    let (etx, erx) = mpsc::channel();
    let w = watch_dir(
        ManifestDir::new(&root),
        Duration::from_millis(20),
        tx,
        move |ev| match ev {
            WatchEvent::Error(e) => etx.send(format!("error {e}")).unwrap(),
            WatchEvent::Resolved(e) => etx.send(format!("resolved {e}")).unwrap(),
            WatchEvent::Scanned { .. } => {}
        },
    );
    let status = w.status();
    // About 15 polls with the directory missing: no view at all, and one error, not 15.
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
    let errors: Vec<String> = erx.try_iter().collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("manifests") && errors[0].contains("cannot read"));
    let why = status.check(Duration::from_secs(5)).unwrap_err();
    assert!(why.contains("no complete view yet"), "{why}");
    assert!(!status.ready());

    std::fs::create_dir(tmp.path().join("staging")).unwrap();
    std::fs::write(tmp.path().join("staging/a.yaml"), SVC).unwrap();
    std::fs::rename(tmp.path().join("staging"), &root).unwrap();
    let Event::Resync(objs) = rx.recv_timeout(Duration::from_secs(5)).unwrap() else {
        panic!()
    };
    assert_eq!(objs.len(), 1);
    // Marked ready right after the view was delivered (the agent polls for it).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !status.ready() {
        assert!(std::time::Instant::now() < deadline, "never ready");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(status.check(Duration::from_secs(5)), Ok(()));
    assert!(erx
        .recv_timeout(Duration::from_secs(5))
        .unwrap()
        .starts_with("resolved"));

    // The directory vanishes while running: no event (the last view stands), health says so.
    std::fs::rename(&root, tmp.path().join("away")).unwrap();
    assert!(erx
        .recv_timeout(Duration::from_secs(5))
        .unwrap()
        .starts_with("error"));
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
    let why = status.check(Duration::from_secs(5)).unwrap_err();
    assert!(why.contains("serving the last complete view"), "{why}");
    assert!(
        erx.try_iter().next().is_none(),
        "the error is reported once"
    );
    w.stop();
}

fn node(name: &str) -> Object {
    let yaml = format!("apiVersion: v1\nkind: Node\nmetadata: {{name: {name}}}\n");
    weir_source::parse_manifest(std::path::Path::new("t.yaml"), &yaml)
        .objects
        .remove(0)
}

/// An API watcher's (re-)list replaces one kind only: objects of that kind missing from the
/// list are deleted (a deletion missed while the watch was down), other kinds stay.
#[test]
fn a_listed_kind_replaces_only_that_kind() {
    let mut s = Store::new();
    s.apply(Event::Applied(svc("a", "10.96.0.1")));
    s.apply(Event::Applied(svc("b", "10.96.0.2")));
    s.apply(Event::Applied(node("n1")));
    let g = s.generation();
    assert!(!s.apply(Event::Listed(
        Kind::Service,
        vec![svc("a", "10.96.0.1"), svc("b", "10.96.0.2")]
    )));
    assert_eq!(s.generation(), g, "the same list is no change");
    assert!(s.apply(Event::Listed(Kind::Service, vec![svc("b", "10.96.0.9")])));
    let snap = s.snapshot();
    assert_eq!(
        snap.services.keys().cloned().collect::<Vec<_>>(),
        [("ns".into(), "b".into())]
    );
    assert_eq!(snap.nodes.len(), 1, "other kinds untouched");
    assert!(s.apply(Event::Listed(Kind::Node, vec![])));
    assert!(s.snapshot().nodes.is_empty());
    assert_eq!(s.snapshot().services.len(), 1);
}

#[test]
fn a_tracking_store_hands_out_each_changed_key_once_with_its_object_now() {
    let mut s = Store::new();
    s.apply(Event::Applied(svc("a", "10.96.0.1")));
    s.track_changes();
    let first = s.take_changes();
    assert_eq!(first.objects.len(), 1, "tracking starts with what is there");
    assert!(first.since.is_some());
    let none = s.take_changes();
    assert!(none.objects.is_empty() && none.since.is_none());

    // The same object again and a resync to the same set change nothing.
    s.apply(Event::Applied(svc("a", "10.96.0.1")));
    s.apply(Event::Resync(vec![svc("a", "10.96.0.1")]));
    assert!(s.take_changes().objects.is_empty());

    // A resync that changes one object and drops none lists only that one; b changed twice
    // is listed once; a deletion is listed with no object.
    s.apply(Event::Applied(svc("b", "10.96.0.2")));
    s.apply(Event::Applied(svc("b", "10.96.0.3")));
    s.apply(Event::Resync(vec![
        svc("a", "10.96.0.9"),
        svc("b", "10.96.0.3"),
    ]));
    let c = s.take_changes();
    let keys: Vec<String> = c.objects.iter().map(|(k, _)| k.name.clone()).collect();
    assert_eq!(keys, ["a", "b"]);
    assert_eq!(c.objects[1].1.as_ref(), Some(&svc("b", "10.96.0.3")));
    assert_eq!(c.generation, s.generation());
    s.apply(Event::Resync(vec![svc("b", "10.96.0.3")]));
    let c = s.take_changes();
    assert_eq!(c.objects.len(), 1);
    assert_eq!(c.objects[0].0, ObjectKey::new(Kind::Service, "ns", "a"));
    assert!(c.objects[0].1.is_none());
}

/// Two consumers of one store (the one node agent's proxy and routes): each feed gets the
/// changes of its own kinds, each once, whoever takes first; a feed's generation moves only
/// with its kinds, so its consumer is not woken by the other's objects.
#[test]
fn each_feed_sees_its_own_kinds_once_and_is_woken_only_by_them() {
    let store = SharedStore::new();
    store.apply(Event::Applied(svc("a", "10.96.0.1")));
    let services = store.feed(&[Kind::Service, Kind::EndpointSlice]);
    let nodes = store.feed(&[Kind::Node]);
    let first = store.take(services);
    assert_eq!(first.objects.len(), 1, "a feed starts with what is there");
    assert!(store.take(nodes).objects.is_empty());

    let before = store.wait_feed(services, 0, Duration::ZERO);
    store.apply(Event::Applied(node("n1")));
    assert_eq!(
        store.wait_feed(services, before, Duration::from_millis(20)),
        before,
        "a Node does not wake the Service feed"
    );
    let n = store.take(nodes);
    assert_eq!(n.objects.len(), 1);
    assert_eq!(n.generation, store.generation());
    assert!(store.take(services).objects.is_empty());

    store.apply(Event::Applied(svc("b", "10.96.0.2")));
    assert!(store.wait_feed(services, before, Duration::from_secs(5)) > before);
    let (generation, snapshot) = store.feed_snapshot(nodes);
    assert_eq!(generation, n.generation, "the Node feed did not move");
    assert_eq!(
        snapshot.services.len(),
        2,
        "but its snapshot is the whole store"
    );
    assert_eq!(store.take(services).objects.len(), 1);
    assert!(store.take(nodes).objects.is_empty());
}

/// The context switches of this process's thread named `comm` (Linux /proc).
fn thread_switches(comm: &str) -> Option<u64> {
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if name.trim_end() == comm {
            let status = std::fs::read_to_string(task.path().join("status")).ok()?;
            let count = |key: &str| -> u64 {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(key))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0)
            };
            return Some(count("voluntary_ctxt_switches:") + count("nonvoluntary_ctxt_switches:"));
        }
    }
    None
}

/// Between scans the watcher sleeps through its interval: it does not wake to look at its
/// stop flag (it once did, every 20 ms, on the CPU `weir dns` answers from), and stop() still
/// ends it at once.
#[test]
fn an_idle_watcher_stays_asleep_until_its_next_scan_and_stops_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let (tx, rx) = mpsc::channel();
    let w = watch_dir(
        ManifestDir::new(tmp.path()),
        Duration::from_secs(60),
        tx,
        |_| {},
    );
    assert!(matches!(
        rx.recv_timeout(Duration::from_secs(5)),
        Ok(Event::Resync(_))
    ));
    std::thread::sleep(Duration::from_millis(100));
    let before = thread_switches("weir-manifest-w").expect("the watcher thread");
    std::thread::sleep(Duration::from_millis(600));
    let after = thread_switches("weir-manifest-w").expect("the watcher thread");
    assert!(
        after - before <= 2,
        "the idle watcher woke {} times in 0.6 s",
        after - before
    );
    let began = std::time::Instant::now();
    w.stop();
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "stop() waited {:?} for a 60 s interval",
        began.elapsed()
    );
}
