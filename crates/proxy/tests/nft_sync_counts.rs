//! What a full sync of the nftables backend costs, as counts (never times, so these hold on a
//! loaded machine): heap allocations per element while rendering and while syncing, elements
//! sent over netlink (each once), messages and transactions per element. The kernel part is
//! root only (skipped otherwise) and runs in a namespace of its own.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;

use weir_kernel::NetNs;
use weir_model::{NodePortAddresses, Plan};
use weir_proxy::nft::{ruleset, NftBackend, NftOptions, COLD_START_CHUNK};
use weir_proxy::{Backend, SyncKind};

#[path = "common/plans.rs"]
mod plans;

mod common;

/// Counts the allocations of the calling thread only (the test harness runs tests on threads
/// of their own, in parallel).
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
    /// Bytes the thread has allocated and not freed, and the most that ever were.
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn live(delta: isize) {
    let _ = LIVE.try_with(|l| {
        l.set(l.get() + delta);
        let _ = PEAK.try_with(|p| p.set(p.get().max(l.get())));
    });
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        live(layout.size() as isize);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        live(-(layout.size() as isize));
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        live(new_size as isize - layout.size() as isize);
        System.realloc(ptr, layout, new_size)
    }
}

/// `f`'s result and the most heap bytes the calling thread held during `f` beyond what it
/// held before.
fn peak_heap<T>(f: impl FnOnce() -> T) -> (usize, T) {
    let start = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(start));
    let out = f();
    ((PEAK.with(Cell::get) - start).max(0) as usize, out)
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn allocations<T>(f: impl FnOnce() -> T) -> (usize, T) {
    let before = ALLOCATIONS.with(Cell::get);
    let out = f();
    (ALLOCATIONS.with(Cell::get) - before, out)
}

/// `n` services × 10 endpoints, every 10th also a NodePort: the agent bench's shape.
fn plan(n: usize) -> Plan {
    let service = |i: usize| {
        let (key, sp) = plans::bench_service("counts", i);
        (key, sp.into())
    };
    Plan {
        services: (0..n).map(service).collect(),
        node_port_addresses_v4: NodePortAddresses::List(BTreeSet::from([IpAddr::V4(
            Ipv4Addr::new(10, 0, 0, 10),
        )])),
        node_port_addresses_v6: NodePortAddresses::None,
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        masquerade_all: false,
        warnings: Vec::new(),
    }
}

/// Elements the netlink path writes for `plan`, per set.
fn netlink_elements(plan: &Plan) -> Vec<usize> {
    let rs = ruleset(plan, &NftOptions::default());
    rs.elements
        .iter()
        .filter(|(name, _)| rs.via_netlink(name))
        .map(|(_, els)| els.len())
        .collect()
}

/// Rendering builds each element once: before, finding repeated keys copied every element's
/// set name and key, and every endpoint entry built a hairpin element (name and key) even
/// when its address was seen before: 5.6 allocations per element at 2,000 services, now 3.4.
#[test]
fn rendering_copies_no_set_name_or_key_per_element() {
    let plan = plan(2000);
    let (allocs, rs) = allocations(|| ruleset(&plan, &NftOptions::default()));
    let elements: usize = rs.elements.values().map(Vec::len).sum();
    assert_eq!(
        elements,
        2000 * 10 * 2 + 2000 + 200 * 11 + 2,
        "the plan's shape"
    );
    let per_element = allocs as f64 / elements as f64;
    eprintln!("ruleset: {allocs} allocations for {elements} elements ({per_element:.2} each)");
    assert!(
        per_element < 4.5,
        "{per_element:.2} allocations per element"
    );
}

struct TestNs(String);

impl TestNs {
    fn new(tag: &str) -> TestNs {
        let name = format!("wnc-{tag}-{}", std::process::id());
        let _ = Command::new("ip")
            .args(["netns", "del", &name])
            .stderr(std::process::Stdio::null())
            .status();
        assert!(Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap()
            .success());
        TestNs(name)
    }
}

impl Drop for TestNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// A cold full sync sends every element once, in as few messages and transactions as the
/// limits allow, and allocates a bounded amount per element (before: every element was
/// encoded into a buffer of its own and then copied into the message, and every datagram
/// read allocated a fresh megabyte): 7.4 allocations per element at 2,000 services, now 3.5.
/// A second process's full sync over those rules (a
/// restart) sends nothing.
#[test]
fn a_cold_full_sync_sends_each_element_once_in_full_messages() {
    if !weir_testkit::can_run(weir_testkit::missing(true, &["ip", "nft"])) {
        return;
    }
    let plan = plan(2000);
    let per_set = netlink_elements(&plan);
    let total: usize = per_set.iter().sum();
    let ns = TestNs::new("cold");
    let (cold, cold_allocs, resync) = NetNs::named(&ns.0)
        .unwrap()
        .run(|| {
            let mut first = NftBackend::new(NftOptions::default());
            let (allocs, report) = allocations(|| first.sync(&plan).unwrap());
            assert_eq!(report.kind, SyncKind::Full);
            let mut second = NftBackend::new(NftOptions::default());
            let report = second.sync(&plan).unwrap();
            assert_eq!(report.kind, SyncKind::Full);
            (first.netlink_sent(), allocs, second.netlink_sent())
        })
        .unwrap();
    assert_eq!(cold.elements, total, "each element sent once");
    let fewest: usize = per_set.iter().map(|n| n.div_ceil(1024)).sum();
    let chunks = total.div_ceil(COLD_START_CHUNK);
    // A chunk boundary can split one set's run of elements: one more message per chunk.
    assert!(
        cold.messages <= fewest + chunks,
        "{} messages for {total} elements in {} sets",
        cold.messages,
        per_set.len()
    );
    assert_eq!(cold.batches, chunks);
    let per_element = cold_allocs as f64 / total as f64;
    eprintln!("cold full sync: {cold:?}, {cold_allocs} allocations ({per_element:.2} per element)");
    assert!(
        per_element < 5.0,
        "{per_element:.2} allocations per element"
    );
    assert_eq!(resync.elements, 0, "a restart rewrote elements: {resync:?}");
}

/// A full sync's peak heap per element: the elements are held between rendering and sending
/// only as the bytes netlink carries, and operations are listed one transaction at a time.
/// Before, every element was a value of its own (key and data on the heap, ~200 bytes) and
/// one list held an operation for every element: 456 bytes per element at 2,000 services
/// (a 1.1 GiB high-water mark at 100,000 services in the agent bench), now 147, most of it
/// fixed (one transaction's operations and bytes, the socket's receive buffer).
#[test]
fn a_full_sync_holds_a_bounded_heap_per_element() {
    if !weir_testkit::can_run(weir_testkit::missing(true, &["ip", "nft"])) {
        return;
    }
    let plan = plan(2000);
    let total: usize = netlink_elements(&plan).iter().sum();
    let ns = TestNs::new("peak");
    let (peak, restart) = NetNs::named(&ns.0)
        .unwrap()
        .run(|| {
            let mut backend = NftBackend::new(NftOptions::default());
            let (peak, report) = peak_heap(|| backend.sync(&plan).unwrap());
            assert_eq!(report.kind, SyncKind::Full);
            // A restart: a second process's full sync over those rules compares every
            // element with the kernel's.
            let mut second = NftBackend::new(NftOptions::default());
            let (restart, report) = peak_heap(|| second.sync(&plan).unwrap());
            assert_eq!(report.kind, SyncKind::Full);
            (peak, restart)
        })
        .unwrap();
    let per_element = peak as f64 / total as f64;
    let restart_per_element = restart as f64 / total as f64;
    eprintln!(
        "full sync: peak heap {peak} bytes for {total} elements ({per_element:.0} per element); \
         restart {restart} ({restart_per_element:.0} per element)"
    );
    assert!(
        per_element < 200.0,
        "{per_element:.0} bytes of heap per element at the peak of a full sync"
    );
}
