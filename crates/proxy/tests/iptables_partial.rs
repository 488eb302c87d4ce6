//! iptables mode: a one-endpoint change costs what it changes, not what the cluster holds.
//! Measured by counting (script lines, heap allocations on the syncing thread), never by
//! timing. The pure tests run anywhere; the backend test needs root and iptables-nft and
//! skips with a message otherwise.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::sync::Arc;

use weir_kernel::NetNs;
use weir_model::{
    Endpoint, FrontendKind, IpFamily, NodePortAddresses, Plan, Protocol, ServicePortKey,
    ServicePortPlan, TopologyMode,
};
use weir_proxy::iptables::{
    diff_to_plan, family_diff, family_view, render_diff, render_update, IptablesBackend,
    IptablesOptions,
};
use weir_proxy::{Backend, SyncKind};

#[path = "common/plans.rs"]
mod plans;
use plans::frontend;

// ---------------------------------------------------------------------------------------------
// Heap allocations made by the calling thread (tests run in parallel threads: a global count
// would mix them).

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

fn note_allocation() {
    // `try_with`: the slot is gone while the thread is being torn down.
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: every call is passed on to the system allocator unchanged; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation();
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// `f`'s result and the heap allocations this thread made while running it.
fn allocations<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = ALLOCATIONS.with(Cell::get);
    let out = f();
    (out, ALLOCATIONS.with(Cell::get) - before)
}

// ---------------------------------------------------------------------------------------------
// Generated clusters: `n` ClusterIP services (every 10th also a NodePort) with `eps`
// endpoints each, the shape of the scale bench.

fn key(i: usize) -> ServicePortKey {
    ServicePortKey {
        namespace: "bench".into(),
        name: format!("svc-{i:05}").into(),
        port_name: "".into(),
        protocol: Protocol::Tcp,
        family: IpFamily::V4,
    }
}

fn endpoint(ip: Ipv4Addr) -> Endpoint {
    Endpoint {
        ip: IpAddr::V4(ip),
        port: 8080,
        is_local: false,
        ready: true,
        serving: true,
        terminating: false,
    }
}

fn offset(base: [u8; 4], by: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::from(base)) + by as u32)
}

fn service(i: usize, eps: usize) -> ServicePortPlan {
    let mut frontends = vec![frontend(
        FrontendKind::ClusterIp,
        Some(IpAddr::V4(offset([10, 96, 0, 1], i))),
        80,
    )];
    if i.is_multiple_of(10) {
        frontends.push(frontend(
            FrontendKind::NodePort,
            None,
            30000 + i as u16 / 10,
        ));
    }
    ServicePortPlan {
        port: 80,
        frontends,
        cluster_endpoints: (0..eps)
            .map(|j| endpoint(offset([10, 128, 0, 1], i * eps + j)))
            .collect(),
        local_endpoints: Vec::new(),
        affinity_timeout: None,
        internal_policy_local: false,
        external_policy_local: false,
        health_check_node_port: None,
        topology: TopologyMode::None,
        has_any_endpoints: true,
    }
}

fn cluster(n: usize, eps: usize) -> Plan {
    Plan {
        services: (0..n)
            .map(|i| (key(i), Arc::new(service(i, eps))))
            .collect(),
        node_port_addresses_v4: NodePortAddresses::List(BTreeSet::from([IpAddr::V4(
            Ipv4Addr::new(10, 0, 0, 10),
        )])),
        node_port_addresses_v6: NodePortAddresses::None,
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        masquerade_all: false,
        warnings: Vec::new(),
    }
}

/// `plan` with the first endpoint of service `svc` replaced by `10.200.0.<k+1>` (kept
/// sorted, as the planner keeps it).
fn one_endpoint_changed(plan: &Plan, svc: usize, k: usize) -> Plan {
    let mut next = plan.clone();
    let sp = Arc::make_mut(next.services.get_mut(&key(svc)).unwrap());
    sp.cluster_endpoints[0] = endpoint(offset([10, 200, 0, 1], k));
    sp.cluster_endpoints.sort_by_key(|e| (e.ip, e.port));
    next
}

/// The restore script without its header (which names the count of touched ports only).
fn body(script: &str) -> Vec<&str> {
    script.lines().filter(|l| !l.starts_with('#')).collect()
}

// ---------------------------------------------------------------------------------------------
// Pure

/// The update for one changed endpoint is the same size whatever the cluster's size, and
/// rendering it from the diff allocates the same whatever the cluster's size: it reads the
/// touched port only (a walk over every port, or a copy of the plan, would allocate per port).
#[test]
fn a_one_endpoint_update_is_rendered_from_the_change_alone() {
    let o = IptablesOptions {
        families: vec![IpFamily::V4],
        ..IptablesOptions::default()
    };
    let mut texts = Vec::new();
    let mut counts = Vec::new();
    for n in [50, 2000] {
        let old = cluster(n, 10);
        let new = one_endpoint_changed(&old, 7, 0);
        let held = family_view(&old, IpFamily::V4);
        let diff = family_diff(&old.diff(&new), IpFamily::V4);
        let (text, allocated) = allocations(|| render_diff(&held, &diff, IpFamily::V4, &o));
        // The same text as comparing the whole plans.
        assert_eq!(text, render_update(&old, &new, IpFamily::V4, &o));
        texts.push(text);
        counts.push(allocated);
    }
    let (small, big) = (body(&texts[0]), body(&texts[1]));
    assert_eq!(small, big, "the update must not depend on the other ports");
    // The changed port's chains only, as kube-proxy writes them: SVC (masquerade + 10 rules)
    // and its 10 SEP chains (2 rules each) declared and filled, the old SEP deleted.
    assert_eq!(small.len(), 46, "{}", texts[0]);
    assert!(!texts[1].contains("KUBE-SERVICES"), "{}", texts[1]);
    // A BTreeMap lookup in a bigger map allocates nothing more; allow a little noise.
    assert!(
        counts[1] <= counts[0] + 16,
        "rendering one endpoint's change allocated {} times at 50 services, {} at 2,000",
        counts[0],
        counts[1]
    );
}

/// Finding the changed ports without the planner's diff (`Backend::sync`) copies only them:
/// the walk compares pointers and builds no view of the plan.
#[test]
fn finding_the_change_without_a_diff_copies_only_the_changed_port() {
    let mut counts = Vec::new();
    for n in [50, 2000] {
        let old = cluster(n, 10);
        let new = one_endpoint_changed(&old, 7, 0);
        let held = family_view(&old, IpFamily::V4);
        let (d, allocated) = allocations(|| diff_to_plan(&held, &new, IpFamily::V4));
        assert_eq!(d, held.diff(&family_view(&new, IpFamily::V4)));
        assert_eq!(d.changed.len(), 1);
        counts.push(allocated);
    }
    assert!(
        counts[1] <= counts[0] + 16,
        "finding one changed port allocated {} times at 50 services, {} at 2,000",
        counts[0],
        counts[1]
    );
}

/// Rendering from the diff gives what comparing whole plans gives, for every kind of change:
/// a port added and one removed (listing chains rewritten), endpoints changed, and a change
/// of the other family only (nothing to write).
#[test]
fn render_diff_equals_render_update_for_every_kind_of_change() {
    let o = IptablesOptions::default();
    let old = cluster(30, 3);
    let mut new = one_endpoint_changed(&old, 4, 0);
    new.services.remove(&key(9));
    new.services.insert(key(99), Arc::new(service(99, 2)));
    let mut v6 = key(5);
    v6.family = IpFamily::V6;
    new.services.insert(v6, Arc::new(service(5, 1)));
    for family in [IpFamily::V4, IpFamily::V6] {
        let held = family_view(&old, family);
        let whole = old.diff(&new);
        let from_diff = render_diff(&held, &family_diff(&whole, family), family, &o);
        let walked = render_diff(&held, &diff_to_plan(&held, &new, family), family, &o);
        let expected = render_update(&old, &new, family, &o);
        assert_eq!(from_diff, expected);
        assert_eq!(walked, expected);
    }
    let v4 = render_update(&old, &new, IpFamily::V4, &o);
    assert!(v4.contains(":KUBE-SERVICES"), "{v4}");
}

/// A change of this family's node-wide settings is seen by the walk (the backend then syncs
/// fully); one of the other family's is not.
#[test]
fn the_walk_sees_this_familys_settings_only() {
    let old = cluster(3, 1);
    let held = family_view(&old, IpFamily::V4);
    let mut new = old.clone();
    new.node_port_addresses_v6 = NodePortAddresses::AllLocal;
    assert!(diff_to_plan(&held, &new, IpFamily::V4).is_empty());
    new.node_port_addresses_v4 = NodePortAddresses::AllLocal;
    assert!(diff_to_plan(&held, &new, IpFamily::V4).globals_changed);
    let mut new = old.clone();
    new.cluster_cidrs.push("10.245.0.0/16".parse().unwrap());
    assert!(diff_to_plan(&held, &new, IpFamily::V4).globals_changed);
}

// ---------------------------------------------------------------------------------------------
// The backend, in a network namespace

/// Root and `iptables-nft-restore`, `ip`, or the test is skipped (a failure under CI=true, naming what is missing).
fn can_run_iptables_nft() -> bool {
    weir_testkit::can_run(weir_testkit::missing(true, &["iptables-nft-restore", "ip"]))
}

/// A named network namespace, deleted on drop (also when the test panics).
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("wiptp-{}-{tag}", std::process::id());
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "ip netns add {name}");
        Netns(name)
    }

    fn run<T>(&self, f: impl FnOnce() -> T) -> T {
        NetNs::named(&self.0).unwrap().run(f).unwrap()
    }

    fn nat(&self) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.0, "iptables-nft-save", "-t", "nat"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// Heap allocations of the backend's one-endpoint syncs (given the planner's diff, and
/// without it) over a cluster of `n` services, after a full sync.
fn backend_sync_allocations(n: usize) -> (usize, usize) {
    let ns = Netns::new(&format!("n{n}"));
    let mut b = IptablesBackend::new(IptablesOptions {
        families: vec![IpFamily::V4],
        backend: weir_proxy::iptables::BackendChoice::Nft,
        ..IptablesOptions::default()
    });
    let p0 = cluster(n, 2);
    let p1 = one_endpoint_changed(&p0, 3, 0);
    let p2 = one_endpoint_changed(&p1, 4, 1);
    let counts = ns.run(|| {
        assert_eq!(b.sync(&p0).unwrap().kind, SyncKind::Full);
        let d = p0.diff(&p1);
        let (r, given) = allocations(|| b.sync_diff(&p1, &d).unwrap());
        assert_eq!((r.kind, r.service_ports_touched), (SyncKind::Partial, 1));
        let (r, walked) = allocations(|| b.sync(&p2).unwrap());
        assert_eq!((r.kind, r.service_ports_touched), (SyncKind::Partial, 1));
        // Nothing left to do.
        assert_eq!(b.sync(&p2).unwrap().kind, SyncKind::Noop);
        (given, walked)
    });
    // The kernel holds the new endpoints, and the replaced ones' chains are gone.
    let nat = ns.nat();
    for present in ["10.200.0.1:8080", "10.200.0.2:8080", "10.128.0.8:8080"] {
        assert!(nat.contains(present), "{present} missing:\n{nat}");
    }
    for gone in ["10.128.0.7:8080", "10.128.0.9:8080"] {
        assert!(!nat.contains(gone), "{gone} still there:\n{nat}");
    }
    ns.run(|| b.cleanup().unwrap());
    counts
}

/// The backend's own work for a one-endpoint change does not grow with the cluster: the
/// same heap allocations at 1,000 services as at 20 (the kernel's commit is another matter:
/// see docs/benchmarks.md). Before, each sync copied the plan into a per-family view twice
/// and compared whole plans, several allocations per service port.
#[test]
fn a_one_endpoint_sync_allocates_the_same_at_any_cluster_size() {
    if !can_run_iptables_nft() {
        return;
    }
    let (small_given, small_walked) = backend_sync_allocations(20);
    let (big_given, big_walked) = backend_sync_allocations(1000);
    eprintln!(
        "allocations of one sync_diff: {small_given} at 20 services, {big_given} at 1,000; \
         of one sync: {small_walked}, {big_walked}"
    );
    // Spawning iptables-restore and reading the nf_tables generation cost the same at any size;
    // a few BTreeMap node splits are the only noise.
    assert!(big_given <= small_given + 32, "{small_given} → {big_given}");
    assert!(
        big_walked <= small_walked + 32,
        "{small_walked} → {big_walked}"
    );
}

impl Netns {
    fn iptables(&self, args: &[&str]) {
        let ok = Command::new("ip")
            .args(["netns", "exec", &self.0, "iptables-nft", "-w"])
            .args(args)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "iptables-nft {args:?}");
    }
}

/// A diff is relative to the previous call's plan, applied or not: after a sync the kernel
/// refused, the next one (whose diff does not mention the refused change) must be full, or the
/// refused change would never reach the kernel.
#[test]
fn a_diff_after_a_failed_sync_gets_a_full_sync() {
    if !can_run_iptables_nft() {
        return;
    }
    let ns = Netns::new("failed");
    let mut b = IptablesBackend::new(IptablesOptions {
        families: vec![IpFamily::V4],
        backend: weir_proxy::iptables::BackendChoice::Nft,
        ..IptablesOptions::default()
    });
    let p0 = cluster(6, 2);
    let p1 = one_endpoint_changed(&p0, 3, 0);
    let p2 = one_endpoint_changed(&p1, 4, 1);
    ns.run(|| assert_eq!(b.sync(&p0).unwrap().kind, SyncKind::Full));
    // Something else jumps to the chain of the endpoint p1 removes: deleting it fails
    // ("too many links"), and iptables-restore rejects the whole update.
    let sep = weir_proxy::iptables::names::endpoint_chain(
        &key(3),
        &endpoint(Ipv4Addr::new(10, 128, 0, 7)),
    );
    ns.iptables(&["-t", "nat", "-N", "TEST-REF"]);
    ns.iptables(&["-t", "nat", "-A", "TEST-REF", "-j", &sep]);
    assert!(ns.run(|| b.sync_diff(&p1, &p0.diff(&p1))).is_err());
    ns.iptables(&["-t", "nat", "-F", "TEST-REF"]);
    ns.iptables(&["-t", "nat", "-X", "TEST-REF"]);
    let r = ns.run(|| b.sync_diff(&p2, &p1.diff(&p2)).unwrap());
    assert_eq!(r.kind, SyncKind::Full);
    let nat = ns.nat();
    for present in ["10.200.0.1:8080", "10.200.0.2:8080"] {
        assert!(nat.contains(present), "{present} missing:\n{nat}");
    }
    for gone in ["10.128.0.7:8080", "10.128.0.9:8080"] {
        assert!(!nat.contains(gone), "{gone} still there:\n{nat}");
    }
    ns.run(|| b.cleanup().unwrap());
}
