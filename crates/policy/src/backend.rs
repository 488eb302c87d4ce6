//! What the policy loop programs: one [`Backend`] trait, so the loop is tested with a
//! recording fake and runs on the node with [`crate::kernel::NftBackend`].

use std::time::Duration;

use crate::plan::PolicyPlan;

/// What a sync did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncKind {
    /// The whole table was written (first sync of a process, after a failure or a failed
    /// check of the kernel's table).
    Full,
    /// Only the chains and map elements that differ, in one transaction.
    Diff,
    /// Nothing differed: nothing was sent.
    Noop,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncReport {
    pub kind: SyncKind,
    pub elapsed: Duration,
    /// Per-pod chains in the table now.
    pub chains: usize,
    /// nft rules in the table now (per-pod chains and base chains).
    pub rules: usize,
    /// Chains added, changed or removed by this sync (all of them on a full one).
    pub chains_written: usize,
    /// Bytes of nft script sent.
    pub script_bytes: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot run nft (package nftables): {0}")]
    Spawn(#[from] std::io::Error),
    /// nft refused the transaction: nothing of it was applied.
    #[error("nft rejected the transaction (the rules before it stay): {0}")]
    Rejected(String),
    /// libnftables could not be loaded or its context not used (not a refusal of the rules).
    #[error("{0}")]
    Library(String),
    #[error("cannot read the table back: {0}")]
    Listing(String),
}

/// A policy datapath. The contract, as the proxy's backends have it:
/// - [`Backend::sync`] makes the kernel hold `plan` in one transaction: the first sync of a
///   process (and the one after [`Backend::invalidate`]) writes the whole table, later ones
///   only what changed; on an error nothing of that sync stays, the rules before it keep
///   working, and the next sync writes the whole table again.
/// - [`Backend::intact`] says whether the kernel still holds what the last sync wrote (an
///   outside `nft flush ruleset` makes it false); the loop then invalidates.
/// - [`Backend::cleanup`] removes everything this backend ever wrote and nothing else.
pub trait Backend {
    fn sync(&mut self, plan: &PolicyPlan) -> Result<SyncReport, Error>;
    fn intact(&mut self) -> Result<bool, Error>;
    /// The next sync writes everything.
    fn invalidate(&mut self);
    fn cleanup(&mut self) -> Result<(), Error>;
}

impl<B: Backend + ?Sized> Backend for Box<B> {
    fn sync(&mut self, plan: &PolicyPlan) -> Result<SyncReport, Error> {
        (**self).sync(plan)
    }
    fn intact(&mut self) -> Result<bool, Error> {
        (**self).intact()
    }
    fn invalidate(&mut self) {
        (**self).invalidate()
    }
    fn cleanup(&mut self) -> Result<(), Error> {
        (**self).cleanup()
    }
}
