//! The zone's heap per service stays at its fixed shape. Until afdf228 each owner name's
//! `Vec<Record>` reserved four records on its first push (272 bytes each) though most names
//! hold one: 2.4 KB per service, 243 MB at 100k services instead of 83 MB.
//!
//! Then each record was a hickory `Record` (272 bytes: the owner name again, a 184-byte
//! `RData`, the TTL): 974 bytes per service. Now a record is 24 bytes (an address inline, or a
//! boxed PTR target or other data), the owner and TTL being added at lookup: 558.
//!
//! A counting global allocator measures the bytes the zone keeps (live after the build minus
//! live before it) for the dns bench's service shape, and the bound is derived from what the
//! zone holds: every record once at 24 bytes, each PTR's boxed target name, the two maps'
//! buckets at their worst load after `shrink_to_fit`, and a slack of 24 bytes per name. Neither
//! older shape (four records reserved per name; a `Record` per record) can pass. This file is
//! its own test binary with one test, so nothing else allocates meanwhile.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicIsize, Ordering};

use hickory_proto::rr::{Name, RecordType};
use weir_dns::{Answer, Zone, ZoneConfig};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is passed on to the system allocator unchanged; only sizes are counted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            LIVE.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        p
    }
}

mod common;
use common::manifests;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const SERVICES: usize = 2_000;

/// Upper bound of a hashbrown map's heap for `n` entries after `shrink_to_fit`: buckets are
/// the power of two at or above n × 8/7, so below 2 × n × 8/7 + 8; one control byte each,
/// plus a group of 16.
fn map_bytes(n: usize, entry: usize) -> usize {
    let buckets = (2 * n * 8).div_ceil(7) + 8;
    buckets * (entry + 1) + 16
}

#[test]
fn a_zone_of_2000_services_keeps_no_spare_records() {
    let parsed = weir_source::parse_manifest(Path::new("bench.yaml"), &manifests(SERVICES));
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    let snapshot = weir_model::Snapshot::from_objects(&parsed.objects);
    let config = ZoneConfig::new("cluster.local").unwrap();

    let before = LIVE.load(Ordering::SeqCst);
    let zone = Zone::build(&snapshot, &config);
    let kept = (LIVE.load(Ordering::SeqCst) - before) as usize;
    assert!(zone.warnings.is_empty(), "{:?}", zone.warnings);

    // What the zone holds, read back through lookups (after the measurement).
    let names: Vec<Name> = zone.owner_names().cloned().collect();
    let answers: Vec<RecordType> = names
        .iter()
        .flat_map(|n| match zone.lookup(n, RecordType::ANY) {
            Answer::Authoritative { answers, .. } => answers,
            Answer::NotInZone => Vec::new(),
        })
        .map(|r| r.record_type())
        .collect();
    let records = answers.len();
    let ptrs = answers.iter().filter(|t| **t == RecordType::PTR).count();
    // Each service: its A name and its PTR name, one record each (plus the apex's few).
    assert!(names.len() >= 2 * SERVICES, "{} names", names.len());
    assert!(records >= 2 * SERVICES, "{records} records");

    // A stored record: an address inline or a box, 24 bytes; a PTR's target boxed beside it.
    let record = 24;
    let name = std::mem::size_of::<Name>();
    let entry = std::mem::size_of::<(Name, Vec<u8>)>();
    let bound =
        records * record + ptrs * name + map_bytes(names.len(), entry) + names.len() * record;
    eprintln!(
        "{SERVICES} services: {} names, {records} records of {record} bytes; \
         zone keeps {kept} bytes ({} per service), bound {bound} ({} per service)",
        names.len(),
        kept / SERVICES,
        bound / SERVICES
    );
    assert!(
        kept <= bound,
        "the zone keeps {kept} bytes for {SERVICES} services ({} per service), over the \
         fixed shape's bound of {bound} ({} per service): do names reserve spare records again?",
        kept / SERVICES,
        bound / SERVICES
    );
    drop(zone);
}
