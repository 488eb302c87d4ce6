//! The node routes loop (`weir_routes::agent::RoutesLoop`) without root or a kernel: a
//! recording route table and a scripted Node view that records how long the loop waits.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Duration;

use weir_model::Snapshot;
use weir_routes::agent::{LoopSettings, NodeView, RouteTable, RoutesLoop, RoutesObserver};
use weir_routes::kernel::{Error, Reconciled};
use weir_routes::{Backend, Config, Desired};

#[derive(Default)]
struct Log {
    /// Per reconcile call: the view's generation it saw.
    reconciled_at: Vec<u64>,
    /// Per wait: the timeout asked for.
    waits: Vec<Duration>,
    /// Observer: successful reconciliations reported (with failed ops), failures.
    reported: Vec<usize>,
    failed: usize,
}

type Shared = Rc<RefCell<Log>>;

/// What the route table does next: `Ok(n)` succeeds with n failed operations; `Err` fails.
struct FakeTable {
    log: Shared,
    outcomes: VecDeque<Result<usize, String>>,
    generation: Rc<RefCell<u64>>,
}

impl RouteTable for FakeTable {
    fn reconcile(
        &mut self,
        _: &Config,
        _: &Snapshot,
        _: Option<&str>,
    ) -> Result<Reconciled, Error> {
        self.log
            .borrow_mut()
            .reconciled_at
            .push(*self.generation.borrow());
        match self.outcomes.pop_front().unwrap_or(Ok(0)) {
            Ok(failed_ops) => Ok(Reconciled {
                desired: desired(),
                applied: Vec::new(),
                failed: (0..failed_ops)
                    .map(|_| (weir_routes::Op::SetVtepUp, "EBUSY".to_string()))
                    .collect(),
            }),
            Err(e) => Err(Error::Underlay("eth0".into(), e)),
        }
    }
}

/// Changes arrive on a script: `changes[i]` says whether the i-th wait sees one.
struct FakeView {
    log: Shared,
    generation: Rc<RefCell<u64>>,
    changes: Vec<bool>,
}

impl NodeView for FakeView {
    fn snapshot(&self) -> (u64, Snapshot) {
        (*self.generation.borrow(), Snapshot::default())
    }
    fn wait_newer(&self, seen: u64, timeout: Duration) -> Option<u64> {
        self.log.borrow_mut().waits.push(timeout);
        assert!(self.log.borrow().waits.len() < 100, "the loop did not stop");
        let mut g = self.generation.borrow_mut();
        assert_eq!(seen, *g, "the loop waits for news after what it saw");
        let i = self.log.borrow().waits.len() - 1;
        if self.changes.get(i).copied().unwrap_or(false) {
            *g += 1;
            Some(*g)
        } else {
            None
        }
    }
}

struct Observer {
    log: Shared,
    /// Fail the n-th report (0-based), as a publisher that cannot write its file.
    fail_report: Option<usize>,
}

impl RoutesObserver for Observer {
    type Error = String;
    fn reconciled(&mut self, r: &Reconciled) -> Result<(), String> {
        let n = self.log.borrow().reported.len();
        if self.fail_report == Some(n) {
            return Err("cannot write the status file".into());
        }
        self.log.borrow_mut().reported.push(r.failed.len());
        Ok(())
    }
    fn failed(&mut self, _: &Error) {
        self.log.borrow_mut().failed += 1;
    }
}

/// What host-gw wants with no Nodes at all.
fn desired() -> Desired {
    weir_routes::desire(
        &Config::new("node-a", Backend::HostGw),
        &Snapshot::default(),
        &weir_routes::Local::default(),
    )
}

const RESYNC: Duration = Duration::from_secs(30);

fn routes(
    outcomes: Vec<Result<usize, String>>,
    changes: Vec<bool>,
    fail_report: Option<usize>,
) -> (RoutesLoop<FakeTable, FakeView, Observer>, Shared) {
    let log = Shared::default();
    let generation = Rc::new(RefCell::new(1));
    let table = FakeTable {
        log: log.clone(),
        outcomes: outcomes.into(),
        generation: generation.clone(),
    };
    let view = FakeView {
        log: log.clone(),
        generation,
        changes,
    };
    let settings = LoopSettings {
        config: Config::new("node-a", Backend::HostGw),
        iface: None,
        resync_period: RESYNC,
    };
    let observer = Observer {
        log: log.clone(),
        fail_report,
    };
    (RoutesLoop::new(settings, table, view, observer), log)
}

fn rounds(l: &mut RoutesLoop<FakeTable, FakeView, Observer>, n: usize) {
    for _ in 0..n {
        let failed = l.reconcile().unwrap();
        l.wait(failed);
    }
}

#[test]
fn changes_and_resyncs_reconcile_with_the_view_of_the_moment() {
    // Waits: a change, a quiet resync period, a change.
    let (mut l, log) = routes(vec![], vec![true, false, true], None);
    rounds(&mut l, 4);
    let log = log.borrow();
    assert_eq!(log.reconciled_at, vec![1, 2, 2, 3]);
    assert_eq!(log.waits, vec![RESYNC; 4]);
    assert_eq!(log.reported, vec![0, 0, 0, 0]);
}

#[test]
fn a_failed_reconciliation_is_retried_within_a_second() {
    let (mut l, log) = routes(
        vec![Ok(0), Err("no such device".into()), Ok(0)],
        vec![],
        None,
    );
    rounds(&mut l, 3);
    let log = log.borrow();
    assert_eq!(log.failed, 1);
    assert_eq!(log.reported, vec![0, 0], "a failure is not published");
    assert_eq!(log.waits, vec![RESYNC, Duration::from_secs(1), RESYNC]);
}

#[test]
fn failed_operations_are_published_and_retried_within_a_second() {
    let (mut l, log) = routes(vec![Ok(2), Ok(0)], vec![], None);
    rounds(&mut l, 2);
    let log = log.borrow();
    assert_eq!(log.reported, vec![2, 0]);
    assert_eq!(log.failed, 0);
    assert_eq!(log.waits, vec![Duration::from_secs(1), RESYNC]);
}

#[test]
fn a_report_that_cannot_be_made_ends_the_loop_with_its_error() {
    let (l, log) = routes(vec![], vec![], Some(1));
    assert_eq!(
        l.run().unwrap_err(),
        "cannot write the status file".to_string()
    );
    assert_eq!(log.borrow().reconciled_at.len(), 2);
}
