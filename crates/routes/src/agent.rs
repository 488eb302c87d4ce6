//! The node routes agent's loop: reconcile the kernel to the Node objects on every change and
//! every resync period, and retry a failed reconciliation within a second.
//!
//! [`RoutesLoop`] is generic over its kernel side ([`RouteTable`]; [`Kernel`] is
//! [`kernel::reconcile`] over rtnetlink), its Node source ([`NodeView`]: in the agent,
//! weir-source's `SharedStore`) and what happens after each reconciliation
//! ([`RoutesObserver`]: in `weir routes`, publishing this node's annotations, status and MTU
//! files, and metrics). The `weir routes` binary keeps the flags, starting the source and
//! that wiring.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use tracing::{info, warn};
use weir_kernel::Rtnl;
use weir_model::conditions::Conditions;
use weir_model::Snapshot;

use crate::kernel::{self, Reconciled};
use crate::Config;

/// What the loop does to the kernel: observe → desire → diff → apply for one snapshot.
pub trait RouteTable {
    fn reconcile(
        &mut self,
        cfg: &Config,
        snapshot: &Snapshot,
        iface: Option<&str>,
    ) -> Result<Reconciled, kernel::Error>;
}

/// The real kernel: [`kernel::reconcile`] on an rtnetlink socket (opened in the network
/// namespace of the thread that made it).
pub struct Kernel(pub Rtnl);

impl RouteTable for Kernel {
    fn reconcile(
        &mut self,
        cfg: &Config,
        snapshot: &Snapshot,
        iface: Option<&str>,
    ) -> Result<Reconciled, kernel::Error> {
        kernel::reconcile(&mut self.0, cfg, snapshot, iface)
    }
}

/// Where the Node objects come from, already holding one complete view (nothing is
/// reconciled from a partial world: an empty one would remove every route).
pub trait NodeView {
    /// (generation, every object) now.
    fn snapshot(&self) -> (u64, Snapshot);
    /// Waits until the generation exceeds `seen` (then returns it) or `timeout` passes.
    fn wait_newer(&self, seen: u64, timeout: Duration) -> Option<u64>;
}

/// Called after each reconciliation.
pub trait RoutesObserver {
    type Error;
    /// The kernel was reconciled (`r.failed`: operations that failed, the rest were carried
    /// out). An error ends the loop.
    fn reconciled(&mut self, r: &Reconciled) -> Result<(), Self::Error>;
    /// The reconciliation could not run (kernel state left as it was).
    fn failed(&mut self, _error: &kernel::Error) {}
}

/// The loop's settings.
#[derive(Debug, Clone)]
pub struct LoopSettings {
    pub config: Config,
    /// `--iface`: the VTEP's underlay interface (default: the one holding the InternalIP).
    pub iface: Option<String>,
    /// `--resync-period`: a full reconciliation this often without changes.
    pub resync_period: Duration,
}

/// The routes agent's loop.
pub struct RoutesLoop<K, V, O> {
    settings: LoopSettings,
    kernel: K,
    view: V,
    observer: O,
    seen: u64,
    /// A failing reconciliation is retried every second: its error is said when it appears
    /// or changes, and its end once, not every retry.
    failure: Conditions,
}

impl<K: RouteTable, V: NodeView, O: RoutesObserver> RoutesLoop<K, V, O> {
    pub fn new(settings: LoopSettings, kernel: K, view: V, observer: O) -> Self {
        Self {
            settings,
            kernel,
            view,
            observer,
            seen: 0,
            failure: Conditions::default(),
        }
    }

    pub fn kernel(&self) -> &K {
        &self.kernel
    }

    pub fn observer(&self) -> &O {
        &self.observer
    }

    /// Reconciles once with the view now; true when it failed (wholly or some operations).
    pub fn reconcile(&mut self) -> Result<bool, O::Error> {
        let (generation, snapshot) = self.view.snapshot();
        self.seen = self.seen.max(generation);
        let started = Instant::now();
        let cfg = &self.settings.config;
        let outcome = self
            .kernel
            .reconcile(cfg, &snapshot, self.settings.iface.as_deref());
        Ok(match outcome {
            Ok(r) => {
                for e in self.failure.update(None::<String>).cleared {
                    info!(error = %e, "routes: reconciled again after failing");
                }
                if !r.applied.is_empty() || !r.failed.is_empty() {
                    info!(
                        backend = cfg.backend.type_name(),
                        applied = r.applied.len(),
                        failed = r.failed.len(),
                        elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
                        "routes reconciled"
                    );
                }
                self.observer.reconciled(&r)?;
                !r.failed.is_empty()
            }
            Err(e) => {
                // A different error replaces the one said before.
                for e in self.failure.update([format!("{e:#}")]).appeared {
                    warn!(
                        error = %e,
                        "routes: reconciliation failed (kernel state left as it was); retrying"
                    );
                }
                self.observer.failed(&e);
                true
            }
        })
    }

    /// Waits for a change in the view, or the resync period (at most a second after a
    /// failure).
    pub fn wait(&mut self, failed: bool) {
        let period = self.settings.resync_period;
        let wait = if failed {
            period.min(Duration::from_secs(1))
        } else {
            period
        };
        if let Some(g) = self.view.wait_newer(self.seen, wait) {
            self.seen = g;
        }
    }

    /// Reconciles and waits, for good; returns only the observer's error.
    pub fn run(mut self) -> Result<Infallible, O::Error> {
        loop {
            let failed = self.reconcile()?;
            self.wait(failed);
        }
    }
}
