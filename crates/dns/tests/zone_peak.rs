//! The first zone's build peaks little above what it keeps. At 100,000 services `weir dns`'s
//! high-water mark was above CoreDNS's memory formula though what it kept was below: the zone
//! build's two maps grew by doubling (each holding its old and new tables at once), the wire
//! answers' arena too, and the zone loop built from a copy of the store's maps.
//!
//! A counting global allocator records the live heap's high-water mark while the zone is
//! built from the store's objects and its wire answers are added (what `weir dns` does before
//! serving: `ZoneLoop::build` then `ZoneHandle::new`), and compares the peak above the
//! objects with what stays. This file is its own test binary with one test, so nothing else
//! allocates meanwhile.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use weir_dns::agent::{ZoneBuilder, ZoneLoop, ZoneView};
use weir_dns::{DnsMetrics, ZoneConfig, ZoneHandle};
use weir_model::Snapshot;
use weir_source::{Event, SharedStore};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

fn grew(by: isize) {
    let now = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is passed on to the system allocator unchanged; only sizes are counted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            grew(layout.size() as isize);
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
            // A moved block is held twice for a moment; counted as the larger of the two
            // (glibc moves large blocks with mremap, without a copy).
            grew(new_size as isize - layout.size() as isize);
        }
        p
    }
}

mod common;
use common::manifests;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const SERVICES: usize = 20_000;

/// The store as `weir dns` hands it to the zone loop.
struct StoreView(SharedStore);

impl ZoneView for StoreView {
    fn snapshot(&self) -> (u64, Arc<Snapshot>) {
        self.0.shared_snapshot()
    }
    fn wait_newer(&self, seen: u64, timeout: Duration) -> Option<(u64, Arc<Snapshot>)> {
        self.0.wait_newer_shared(seen, timeout)
    }
}

#[test]
fn the_first_zone_peaks_within_a_tenth_above_what_it_keeps() {
    let store = SharedStore::new();
    {
        let parsed = weir_source::parse_manifest(Path::new("bench.yaml"), &manifests(SERVICES));
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        store.apply(Event::Resync(parsed.objects));
    }
    let config = ZoneConfig::new("cluster.local").unwrap();
    let builder = ZoneBuilder::new(config, Arc::new(DnsMetrics::new()));
    let mut zones = ZoneLoop::new(builder, StoreView(store));

    let before = LIVE.load(Ordering::SeqCst);
    PEAK.store(before, Ordering::SeqCst);
    let zone = zones.build();

    let handle = ZoneHandle::new(zone);
    let kept = LIVE.load(Ordering::SeqCst) - before;
    let peak = PEAK.load(Ordering::SeqCst) - before;
    assert!(handle.load().warnings.is_empty());
    assert!(handle.load().name_count() >= 2 * SERVICES);

    let over = peak - kept;
    eprintln!(
        "{SERVICES} services: zone and wire answers keep {kept} bytes ({} per service), \
         peak {peak} during the build ({over} above, {}%)",
        kept / SERVICES as isize,
        over * 100 / kept
    );
    assert!(
        over * 10 <= kept,
        "building the first zone of {SERVICES} services peaked at {peak} bytes above the \
         objects, {over} more than the {kept} it keeps (over a tenth): does a map or the \
         arena grow by doubling again, or the build copy the store's maps?"
    );
    drop(handle);
}
