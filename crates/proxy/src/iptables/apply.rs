//! [`IptablesBackend`]: applies rendered scripts to the calling thread's network namespace.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use weir_model::{IpFamily, Plan};

use super::jumps::jumps;
use super::render::{
    family_view, is_weir_chain, render_full_replacing, render_update, IptablesOptions,
    KUBE_PROXY_CANARY,
};
use super::restore::{Restore, Table};
use super::tools;
use crate::backend::{Backend, Result, SyncKind, SyncReport};

/// The iptables mode (kube-proxy's layout, `iptables-restore --noflush`).
///
/// * The first sync of a process, the first after a failure, one after node-wide
///   settings changed, and one after the canary chains vanished (someone flushed the
///   tables) are **full**: every weir chain is declared and refilled in one restore per
///   table, which replaces them atomically — no moment without rules, and established
///   connections keep their conntrack NAT state. Per-service chains the kernel holds but
///   the plan no longer uses (left by a previous process) are deleted in the same step.
///   Then the jump rules in the built-in chains are checked (`iptables -C`) and only
///   missing ones inserted, so restarts never duplicate them.
/// * Other syncs are **partial**: the listing chains plus the chains of changed service
///   ports ([`render_update`]).
///
/// Each family is its own set of tables (`iptables` / `ip6tables`) and is synced in turn.
pub struct IptablesBackend {
    opts: IptablesOptions,
    /// Per family, the view of the plan the kernel holds (absent: next sync is full).
    applied: BTreeMap<IpFamily, Plan>,
}

impl IptablesBackend {
    pub fn new(opts: IptablesOptions) -> Self {
        IptablesBackend {
            opts,
            applied: BTreeMap::new(),
        }
    }

    pub fn options(&self) -> &IptablesOptions {
        &self.opts
    }

    /// Syncs one family; returns its kind and the number of service ports written.
    fn sync_family(&mut self, family: IpFamily, plan: &Plan) -> Result<(SyncKind, usize)> {
        let view = family_view(plan, family);
        let partial = match self.applied.get(&family) {
            Some(old) if canaries_present(family)? => {
                let diff = old.diff(&view);
                if diff.is_empty() {
                    return Ok((SyncKind::Noop, 0));
                }
                (!diff.globals_changed).then(|| {
                    (
                        render_update(old, &view, family, &self.opts),
                        diff.touched().len(),
                    )
                })
            }
            _ => None,
        };
        let (kind, touched) = match partial {
            Some((script, touched)) => {
                tools::restore(family, &script)?;
                (SyncKind::Partial, touched)
            }
            None => {
                self.full(family, &view)?;
                (SyncKind::Full, view.services.len())
            }
        };
        self.applied.insert(family, view);
        Ok((kind, touched))
    }

    fn full(&self, family: IpFamily, view: &Plan) -> Result<()> {
        let saved = tools::save(family, Some(Table::Nat))?;
        let existing = tools::chains_in_save(&saved)
            .remove(Table::Nat.name())
            .unwrap_or_default();
        let script = render_full_replacing(view, family, &self.opts, &existing);
        tools::restore(family, &script)?;
        ensure_jumps(family)
    }
}

/// All three canaries still exist (kube-proxy's flush detection).
fn canaries_present(family: IpFamily) -> Result<bool> {
    for t in [Table::Mangle, Table::Nat, Table::Filter] {
        if !tools::chain_exists(family, t, KUBE_PROXY_CANARY)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Inserts the missing jump rules. Walking the list backwards with "insert at 1" leaves
/// them at the head of each built-in chain in list order.
fn ensure_jumps(family: IpFamily) -> Result<()> {
    for j in jumps().iter().rev() {
        if !tools::has_rule(family, j.table, j.chain, &j.args)? {
            tools::insert_rule(family, j.table, j.chain, &j.args)?;
        }
    }
    Ok(())
}

/// Removes one family's jumps and chains; absence is not an error.
fn cleanup_family(family: IpFamily) -> Result<()> {
    if !tools::available(family) {
        return Ok(());
    }
    for j in jumps() {
        // Every copy, should something (an old version, a human) have added duplicates.
        for _ in 0..64 {
            if !tools::delete_rule(family, j.table, j.chain, &j.args) {
                break;
            }
        }
    }
    // A family whose tables cannot be read (IPv6 disabled) holds nothing of ours.
    let Ok(saved) = tools::save(family, None) else {
        return Ok(());
    };
    let mut r = Restore::default();
    let mut any = false;
    for (table, chains) in tools::chains_in_save(&saved) {
        let Some(t) = Table::parse(&table) else {
            continue;
        };
        let ours: BTreeSet<&String> = chains.iter().filter(|c| is_weir_chain(t, c)).collect();
        for c in ours {
            r.delete(t, c);
            any = true;
        }
    }
    if any {
        tools::restore(family, &r.text("weir iptables cleanup"))?;
    }
    Ok(())
}

impl Backend for IptablesBackend {
    fn mode(&self) -> &'static str {
        "iptables"
    }

    fn sync(&mut self, plan: &Plan) -> Result<SyncReport> {
        let start = Instant::now();
        let mut kinds = Vec::new();
        let mut touched = 0;
        for family in self.opts.families.clone() {
            match self.sync_family(family, plan) {
                Ok((k, n)) => {
                    kinds.push(k);
                    touched += n;
                }
                Err(e) => {
                    // The kernel may now hold anything between the old and the new rules:
                    // only a full sync (of every family) is safe next.
                    self.applied.clear();
                    return Err(e);
                }
            }
        }
        let kind = if kinds.contains(&SyncKind::Full) {
            SyncKind::Full
        } else if kinds.contains(&SyncKind::Partial) {
            SyncKind::Partial
        } else {
            SyncKind::Noop
        };
        Ok(SyncReport {
            kind,
            elapsed: start.elapsed(),
            service_ports_touched: touched,
        })
    }

    fn cleanup(&mut self) -> Result<()> {
        self.applied.clear();
        for family in self.opts.families.clone() {
            cleanup_family(family)?;
        }
        Ok(())
    }
}
