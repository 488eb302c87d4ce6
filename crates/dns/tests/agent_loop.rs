//! The DNS zone loop (`weir_dns::agent::ZoneLoop`) without sockets: a scripted object view,
//! a target that records the zones swapped in, and a set wall clock for the SOA serial.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use hickory_proto::rr::{Name, RData, RecordType};
use weir_dns::agent::{ZoneBuilder, ZoneLoop, ZoneTarget, ZoneView};
use weir_dns::{Answer, DnsMetrics, Zone, ZoneConfig};
use weir_model::Snapshot;

fn snapshot(services: &[&str]) -> Snapshot {
    let yaml: Vec<String> = services
        .iter()
        .enumerate()
        .map(|(i, name)| {
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\n\
                 spec: {{clusterIP: 10.96.0.{}, ports: [{{port: 80}}]}}\n",
                10 + i
            )
        })
        .collect();
    let parsed = weir_source::parse_manifest(Path::new("test.yaml"), &yaml.join("---\n"));
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    Snapshot::from_objects(&parsed.objects)
}

/// Generation 1 now; each wait takes the next scripted step (`None`: nothing changed).
struct ScriptedView {
    now: Snapshot,
    steps: RefCell<VecDeque<Option<Snapshot>>>,
    generation: RefCell<u64>,
    /// (seen, timeout) of each wait.
    waits: RefCell<Vec<(u64, Duration)>>,
}

impl ZoneView for ScriptedView {
    fn snapshot(&self) -> (u64, Arc<Snapshot>) {
        (*self.generation.borrow(), Arc::new(self.now.clone()))
    }
    fn wait_newer(&self, seen: u64, timeout: Duration) -> Option<(u64, Arc<Snapshot>)> {
        self.waits.borrow_mut().push((seen, timeout));
        let step = self.steps.borrow_mut().pop_front().flatten()?;
        *self.generation.borrow_mut() += 1;
        Some((*self.generation.borrow(), Arc::new(step)))
    }
}

#[derive(Default)]
struct Recorded(RefCell<Vec<Zone>>);

impl ZoneTarget for Recorded {
    fn store(&self, zone: Zone) {
        self.0.borrow_mut().push(zone);
    }
}

fn has(zone: &Zone, name: &str) -> bool {
    let q = Name::from_str(name).unwrap();
    match zone.lookup(&q, RecordType::A) {
        Answer::Authoritative { answers, .. } => !answers.is_empty(),
        Answer::NotInZone => false,
    }
}

/// The SOA serial of a zone.
fn serial(zone: &Zone) -> u32 {
    let q = Name::from_str("cluster.local.").unwrap();
    match zone.lookup(&q, RecordType::SOA) {
        Answer::Authoritative { answers, .. } => match &answers[0].data {
            RData::SOA(soa) => soa.serial,
            other => panic!("not an SOA: {other:?}"),
        },
        Answer::NotInZone => panic!("the origin is in the zone"),
    }
}

fn zone_loop(
    steps: Vec<Option<Snapshot>>,
    clock_secs: Arc<Mutex<u64>>,
) -> (ZoneLoop<ScriptedView>, Arc<DnsMetrics>) {
    let view = ScriptedView {
        now: snapshot(&["web"]),
        steps: RefCell::new(steps.into()),
        generation: RefCell::new(1),
        waits: RefCell::default(),
    };
    let metrics = Arc::new(DnsMetrics::new());
    let builder = ZoneBuilder::new(ZoneConfig::new("cluster.local").unwrap(), metrics.clone())
        .with_clock(move || {
            SystemTime::UNIX_EPOCH + Duration::from_secs(*clock_secs.lock().unwrap())
        });
    (ZoneLoop::new(builder, view), metrics)
}

#[test]
fn each_change_swaps_in_a_zone_of_the_new_objects_and_nothing_else_does() {
    let clock = Arc::new(Mutex::new(1_800_000_000));
    let (mut l, metrics) = zone_loop(
        vec![
            None,
            Some(snapshot(&["web", "db"])),
            None,
            Some(snapshot(&["db"])),
        ],
        clock,
    );
    let first = l.build();
    assert!(has(&first, "web.default.svc.cluster.local."));
    assert!(!has(&first, "db.default.svc.cluster.local."));

    let target = Recorded::default();
    let t = Duration::from_secs(60);
    let rebuilt: Vec<bool> = (0..4).map(|_| l.update(&target, t)).collect();
    assert_eq!(rebuilt, vec![false, true, false, true]);
    let zones = target.0.borrow();
    assert_eq!(zones.len(), 2, "a zone per change, none on a quiet wait");
    assert!(has(&zones[0], "web.default.svc.cluster.local."));
    assert!(has(&zones[0], "db.default.svc.cluster.local."));
    assert!(!has(&zones[1], "web.default.svc.cluster.local."));
    assert!(has(&zones[1], "db.default.svc.cluster.local."));
    // Three builds counted (the first and two changes).
    assert!(
        metrics.encode().contains("weir_dns_zone_builds_total 3"),
        "{}",
        metrics.encode()
    );
}

#[test]
fn the_loop_waits_for_news_after_what_it_built_from() {
    let clock = Arc::new(Mutex::new(1_800_000_000));
    let (mut l, _) = zone_loop(vec![Some(snapshot(&["a"])), None], clock);
    l.build();
    let target = Recorded::default();
    l.update(&target, Duration::from_secs(7));
    l.update(&target, Duration::from_secs(7));
    // Built from generation 1, then from 2: each wait asks for what is newer than that.
    assert_eq!(
        *l.view().waits.borrow(),
        vec![(1, Duration::from_secs(7)), (2, Duration::from_secs(7))]
    );
    assert_eq!(target.0.borrow().len(), 1);
}

#[test]
fn the_serial_follows_the_clock_and_grows_on_every_build() {
    let clock = Arc::new(Mutex::new(1_800_000_000));
    let (mut l, _) = zone_loop(
        vec![
            Some(snapshot(&["a"])),
            Some(snapshot(&["b"])),
            Some(snapshot(&["c"])),
        ],
        clock.clone(),
    );
    let first = l.build();
    assert_eq!(serial(&first), 1_800_000_000);
    let target = Recorded::default();
    // Two rebuilds within the same second: the serial still grows.
    l.update(&target, Duration::from_secs(60));
    l.update(&target, Duration::from_secs(60));
    // Later, the clock leads again.
    *clock.lock().unwrap() = 1_800_000_100;
    l.update(&target, Duration::from_secs(60));
    let serials: Vec<u32> = target.0.borrow().iter().map(serial).collect();
    assert_eq!(serials, vec![1_800_000_001, 1_800_000_002, 1_800_000_100]);
}
