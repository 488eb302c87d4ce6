//! The interface between the agent loop and a proxy mode.

use std::time::Duration;

use weir_model::{Plan, PlanDiff};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An external tool (`nft`, `iptables-restore`, …) failed; `detail` is its stderr.
    #[error("{tool} failed: {detail}")]
    Tool { tool: String, detail: String },
    #[error("netlink: {0}")]
    Netlink(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

pub type Result<T> = std::result::Result<T, Error>;

/// Whether a sync rewrote the whole ruleset or only what changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncKind {
    Full,
    Partial,
    /// Nothing differed from what the kernel already holds.
    Noop,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncReport {
    pub kind: SyncKind,
    pub elapsed: Duration,
    /// Service ports whose rules were (re)written.
    pub service_ports_touched: usize,
}

/// One proxy mode. Implementations act on the network namespace of the calling thread.
///
/// A backend remembers the plan it last applied. The first `sync` of a process must not
/// flush working rules before the new ones are in place (a restart keeps established
/// connections): it replaces weir's rules atomically or updates them in place.
pub trait Backend: Send {
    /// `"nftables"`, `"iptables"`, …
    fn mode(&self) -> &'static str;
    /// Brings the kernel to `plan`. On error the previous rules stay as they were, and the
    /// next call retries with a full sync. (One exception: iptables mode on iptables-nft
    /// writes a big change in several commits, each leaving a working ruleset; a failure
    /// keeps the commits before it. See `IptablesBackend`.)
    fn sync(&mut self, plan: &Plan) -> Result<SyncReport>;
    /// [`Backend::sync`], told what changed: `diff` is `previous.diff(plan)`, `previous` being
    /// the plan of the previous `sync` or `sync_diff` call (whether it succeeded or not). A
    /// backend that keeps the applied plan up to date from the diff never compares or copies
    /// whole plans, so a change costs what it touches (the agent's planner finds the diff
    /// while replanning). The default ignores the diff.
    fn sync_diff(&mut self, plan: &Plan, diff: &PlanDiff) -> Result<SyncReport> {
        let _ = diff;
        self.sync(plan)
    }
    /// Whether the kernel still holds the rules the last sync wrote — cheap enough to call
    /// every few seconds, and sensitive to contents, not just to chains existing: an outside
    /// flush (`iptables -t nat -F`, `nft flush table`) or a deleted jump rule makes it
    /// false. `sync` checks what it can see cheaply too (nftables: the same check; ipvs: the
    /// dummy and the virtual servers, from the dumps the sync makes anyway), so such a flush
    /// turns the next sync into a full one; the agent calls this every --sync-period for the
    /// rest. True before the first sync.
    fn intact(&mut self) -> Result<bool>;
    /// Makes the next `sync` a full one (the periodic full resync).
    fn invalidate(&mut self);
    /// Removes everything this mode ever installed (tables, chains, sets), ignoring absence.
    fn cleanup(&mut self) -> Result<()>;
}

/// A boxed mode is a mode (the agent picks one at run time).
impl<B: Backend + ?Sized> Backend for Box<B> {
    fn mode(&self) -> &'static str {
        (**self).mode()
    }
    fn sync(&mut self, plan: &Plan) -> Result<SyncReport> {
        (**self).sync(plan)
    }
    fn sync_diff(&mut self, plan: &Plan, diff: &PlanDiff) -> Result<SyncReport> {
        (**self).sync_diff(plan, diff)
    }
    fn intact(&mut self) -> Result<bool> {
        (**self).intact()
    }
    fn invalidate(&mut self) {
        (**self).invalidate()
    }
    fn cleanup(&mut self) -> Result<()> {
        (**self).cleanup()
    }
}
