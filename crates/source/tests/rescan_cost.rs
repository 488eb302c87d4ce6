//! A rescan that finds no file changed costs the files, not the objects. Until this test each
//! scan copied every object twice (the view before and after, to compare), so a manifest
//! directory polled every 250 ms cost 8 % of a core at 10,000 services and stalled the DNS
//! server sharing it. A counting allocator (this file is its own test binary with one test,
//! so nothing else allocates meanwhile) compares an unchanged rescan of the same two files
//! holding 20 and 2,000 services.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use weir_source::{Limits, ManifestDir};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: defers to the system allocator; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn services(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| {
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: svc-{i}, namespace: bench}}\n\
                 spec: {{clusterIP: 10.96.{}.{}, ports: [{{port: 80}}]}}\n---\n",
                i / 250,
                i % 250 + 1
            )
        })
        .collect()
}

/// Allocations of the second, unchanged scan of two files holding `n` services in all.
fn unchanged_rescan_allocations(n: usize) -> usize {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.yaml"), services(0, n / 2)).unwrap();
    std::fs::write(dir.path().join("b.yaml"), services(n / 2, n - n / 2)).unwrap();
    let limits = Limits {
        settle: Duration::ZERO,
        ..Limits::default()
    };
    let mut manifests = ManifestDir::with_limits(dir.path(), limits);
    let first = manifests.scan();
    assert!(first.changed && first.errors.is_empty(), "{first:?}");
    assert_eq!(manifests.objects().len(), n);

    let before = ALLOCATIONS.load(Ordering::SeqCst);
    let again = manifests.scan();
    let allocations = ALLOCATIONS.load(Ordering::SeqCst) - before;
    assert!(!again.changed, "nothing changed: {again:?}");
    allocations
}

#[test]
fn an_unchanged_rescan_costs_the_files_not_the_objects() {
    let small = unchanged_rescan_allocations(20);
    let large = unchanged_rescan_allocations(2000);
    eprintln!("unchanged rescan: {small} allocations at 20 services, {large} at 2,000");
    // Copying the view allocates several times per object (key strings, the object's own);
    // listing two files allocates a few dozen times whatever they hold.
    assert!(
        large <= small + 50,
        "an unchanged rescan of 2,000 services allocated {large} times against {small} for \
         20: it copies the objects"
    );
}
