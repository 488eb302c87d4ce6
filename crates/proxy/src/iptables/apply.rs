//! [`IptablesBackend`]: applies rendered scripts to the calling thread's network namespace.

use std::collections::BTreeMap;
use std::time::Instant;

use weir_model::{IpFamily, NodePortAddresses, Plan, PlanDiff, ServicePortPlan};

use super::detect;
use super::jumps::jumps;
use super::names::is_service_chain;
use super::render::{
    chains_in, delete_in_batches, diff_to_plan, family_diff, family_view, is_weir_chain,
    nft_chains_per_commit, render_diff, render_full_replacing, IptablesOptions, KUBE_FIREWALL,
    KUBE_FORWARD, KUBE_MARK_MASQ, KUBE_SERVICES, NFT_CHAINS_PER_COMMIT,
};
use super::restore::{Restore, Table};
use super::tools::{Flavor, Tool};
use crate::backend::{Backend, Result, SyncKind, SyncReport};

/// The iptables mode (kube-proxy's layout, `iptables-restore --noflush`).
///
/// * The first sync of a process, the first after a failure, one after node-wide
///   settings changed, and one after [`intact`](Backend::intact) found the kernel's rules
///   differing from what weir wrote (someone flushed a table or a chain, or deleted a jump)
///   are **full**: every weir chain is declared and refilled in one restore per
///   table, which replaces them atomically — no moment without rules, and established
///   connections keep their conntrack NAT state. Per-service chains the kernel holds but
///   the plan no longer uses (left by a previous process) are deleted in the same step.
///   Then the jump rules in the built-in chains are checked (`iptables -C`) and only
///   missing ones inserted, so restarts never duplicate them.
/// * Other syncs are **partial**: the chains of changed service ports, and the listing
///   chains only when a port's listing rules changed ([`render_diff`]). Its own work follows
///   the change: given the planner's diff ([`Backend::sync_diff`]) it reads only the touched
///   ports; without it, one walk comparing pointers finds them.
///
/// Each family is its own set of tables (`iptables` / `ip6tables`) and is synced in turn.
///
/// With iptables-nft (found with `iptables --version` at the first sync) the nat table is
/// committed in batches of service ports (see `IptablesOptions::chains_per_commit`), the
/// nat chains a full sync must compare against are read with `nft list chains`, and the
/// check before each sync starts with the nf_tables generation counter: unchanged since
/// weir's last sync, nothing can differ, and no chain is listed. A change naming more
/// chains than one batch (a full sync of a big table) is not one transaction then: if a
/// commit fails, the ones before it stay (each left a working ruleset: service chains
/// before the listing that jumps to them, deletions last) and the next sync is full.
pub struct IptablesBackend {
    opts: IptablesOptions,
    /// The implementation driven (resolved from `opts.backend` at the first sync).
    flavor: Option<Flavor>,
    /// Whether `iptables` is iptables-nft (unknown before the first sync).
    nf_tables: Option<bool>,
    /// The nf_tables generation right after weir's last successful sync (iptables-nft only).
    synced_generation: Option<u32>,
    /// Per family, the view of the plan the kernel holds (absent: next sync is full).
    applied: BTreeMap<IpFamily, Plan>,
    /// Per family, the number of rules weir wrote into each of its chains.
    expected: BTreeMap<IpFamily, RuleCounts>,
    /// Per family, about how many nat chains `applied` needs ([`chains_in`]), kept up to date
    /// by each partial sync: it sets the batch size without a walk over every port.
    chains: BTreeMap<IpFamily, usize>,
}

/// Rules per (table, chain) that weir wrote, read from its own restore input.
type RuleCounts = BTreeMap<(Table, String), usize>;

/// Applies restore input to `counts`: a `:CHAIN` line creates or empties the chain,
/// `-A CHAIN` adds a rule, `-X CHAIN` deletes it.
fn count_rules(counts: &mut RuleCounts, text: &str) {
    let mut table = None;
    for line in text.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = Table::parse(t.trim());
            continue;
        }
        let Some(t) = table else { continue };
        let word = |rest: &str| {
            rest.split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string()
        };
        if let Some(rest) = line.strip_prefix(':') {
            counts.insert((t, word(rest)), 0);
        } else if let Some(rest) = line.strip_prefix("-A ") {
            *counts.entry((t, word(rest))).or_default() += 1;
        } else if let Some(rest) = line.strip_prefix("-X ") {
            counts.remove(&(t, word(rest)));
        }
    }
}

/// Whether `listing` (`iptables -S chain`) has a rule jumping to `target`.
fn has_jump(listing: &str, chain: &str, target: &str) -> bool {
    let (head, tail) = (format!("-A {chain} "), format!("-j {target}"));
    listing
        .lines()
        .any(|l| l.starts_with(&head) && l.trim_end().ends_with(&tail))
}

impl IptablesBackend {
    pub fn new(opts: IptablesOptions) -> Self {
        IptablesBackend {
            opts,
            flavor: None,
            nf_tables: None,
            synced_generation: None,
            applied: BTreeMap::new(),
            expected: BTreeMap::new(),
            chains: BTreeMap::new(),
        }
    }

    /// The options the renderer gets: the caller's, batched for iptables-nft unless the
    /// caller chose a batch size. `reachable`: weir's chains are hooked into the built-in
    /// chains already (any sync but a first load), so every commit pays the kernel's check
    /// of the whole table and fewer, larger commits are cheaper ([`nft_chains_per_commit`]).
    fn render_options(&self, view: &Plan, reachable: bool) -> IptablesOptions {
        let mut o = self.opts.clone();
        if self.nf_tables == Some(true) && o.chains_per_commit.is_none() {
            o.chains_per_commit = Some(nft_chains_per_commit(chains_in(view), reachable));
        }
        o
    }

    /// The current nf_tables generation, if `iptables` is iptables-nft and it can be read.
    fn generation(&self) -> Option<u32> {
        if self.nf_tables != Some(true) {
            return None;
        }
        crate::nft::netlink::NftNetlink::new()
            .and_then(|mut n| n.generation())
            .ok()
    }

    pub fn options(&self) -> &IptablesOptions {
        &self.opts
    }

    /// The implementation this backend drives, once its first sync (or cleanup) chose it.
    pub fn flavor(&self) -> Option<Flavor> {
        self.flavor
    }

    /// `family`'s programs of the chosen implementation (the system's before the choice).
    fn tool(&self, family: IpFamily) -> Tool {
        Tool {
            family,
            flavor: self.flavor.unwrap_or_default(),
        }
    }

    /// Picks the implementation (`--iptables-backend`) and whether it is nf_tables, once.
    fn choose_flavor(&mut self) -> Result<()> {
        if self.flavor.is_none() {
            let family = self.opts.families.first().copied().unwrap_or(IpFamily::V4);
            let flavor = detect::resolve(self.opts.backend, family);
            tracing::info!(
                choice = ?self.opts.backend,
                implementation = flavor.name(),
                "iptables implementation"
            );
            self.flavor = Some(flavor);
        }
        if self.nf_tables.is_none() {
            let family = self.opts.families.first().copied().unwrap_or(IpFamily::V4);
            self.nf_tables = Some(self.tool(family).is_nf_tables()?);
        }
        Ok(())
    }

    /// Syncs one family; returns its kind and the number of service ports written.
    /// `untouched`: nothing in the kernel changed since weir's last sync (same nf_tables
    /// generation), so the rules need no listing to be trusted. `given`: the whole plan's
    /// diff from the previous sync's plan ([`Backend::sync_diff`]), when the caller has it.
    ///
    /// A partial sync reads only the touched service ports (of `given`, or found by a walk
    /// that compares pointers and copies nothing else), renders their chains, and moves the
    /// applied view forward by the diff: nothing in weir's own work grows with the cluster.
    /// (The kernel's commit still does: see docs/benchmarks.md.)
    fn sync_family(
        &mut self,
        family: IpFamily,
        plan: &Plan,
        given: Option<&PlanDiff>,
        untouched: bool,
    ) -> Result<(SyncKind, usize)> {
        let diff = match self.applied.get(&family) {
            Some(_) if !(untouched || self.family_intact(family, false)?) => {
                tracing::warn!(
                    ?family,
                    "weir's iptables rules were changed behind its back: full resync"
                );
                None
            }
            Some(held) => Some(match given {
                Some(d) if !d.globals_changed => family_diff(d, family),
                // Either family's settings changed (or no diff was given): compare this
                // family's settings and walk its ports.
                _ => diff_to_plan(held, plan, family),
            }),
            None => None,
        };
        let diff = match diff {
            Some(d) if d.is_empty() => return Ok((SyncKind::Noop, 0)),
            Some(d) if !d.globals_changed => d,
            _ => {
                let view = family_view(plan, family);
                self.full(family, &view)?;
                self.chains.insert(family, chains_in(&view));
                self.applied.insert(family, view);
                return Ok((SyncKind::Full, plan_ports(plan, family)));
            }
        };
        let held = self.applied.get_mut(&family).expect("matched above");
        let chains = self.chains.entry(family).or_default();
        let mut ropts = self.opts.clone();
        if self.nf_tables == Some(true) && ropts.chains_per_commit.is_none() {
            ropts.chains_per_commit = Some(nft_chains_per_commit(*chains, true));
        }
        let script = render_diff(held, &diff, family, &ropts);
        let tool = Tool {
            family,
            flavor: self.flavor.unwrap_or_default(),
        };
        tool.restore(&script)?;
        count_rules(self.expected.entry(family).or_default(), &script);
        // What the kernel now holds: the applied view moved by the diff, and its chain
        // count by the touched ports' (no walk over the other ports).
        let port_chains =
            |sp: &ServicePortPlan| sp.cluster_endpoints.len() + sp.local_endpoints.len() + 4;
        for sp in diff
            .removed
            .values()
            .chain(diff.changed.values().map(|c| &c.old))
        {
            *chains = chains.saturating_sub(port_chains(sp));
        }
        for sp in diff
            .added
            .values()
            .chain(diff.changed.values().map(|c| &c.new))
        {
            *chains += port_chains(sp);
        }
        held.apply(&diff);
        Ok((SyncKind::Partial, diff.touched().len()))
    }

    /// [`Backend::sync`] and [`Backend::sync_diff`].
    fn sync_with(&mut self, plan: &Plan, given: Option<&PlanDiff>) -> Result<SyncReport> {
        let start = Instant::now();
        if let Err(e) = self.choose_flavor() {
            // A diff given with the next call is relative to this call's plan: only a full
            // sync can follow a failed one.
            self.applied.clear();
            return Err(e);
        }
        // Read before anything of this sync: a generation equal to the one recorded after the
        // last sync means no transaction at all ran in between.
        let untouched =
            self.synced_generation.is_some() && self.generation() == self.synced_generation;
        self.synced_generation = None;
        let mut kinds = Vec::new();
        let mut touched = 0;
        for family in self.opts.families.clone() {
            match self.sync_family(family, plan, given, untouched) {
                Ok((k, n)) => {
                    kinds.push(k);
                    touched += n;
                }
                Err(e) => {
                    // The kernel may now hold anything between the old and the new rules:
                    // only a full sync (of every family) is safe next.
                    self.applied.clear();
                    self.expected.clear();
                    return Err(e);
                }
            }
        }
        // A change by someone else between weir's last commit and this read would go unseen
        // by the next quick check; the periodic `intact` (which always lists) catches it.
        self.synced_generation = self.generation();
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

    fn full(&mut self, family: IpFamily, view: &Plan) -> Result<()> {
        let tool = self.tool(family);
        let existing = tool.nat_chains(self.nf_tables == Some(true))?;
        // A first load (nothing of weir's in the nat table, so nothing hooked in yet) can use
        // small commits; over existing chains, every commit is checked against the table.
        let reachable = existing.iter().any(|c| is_service_chain(c));
        let ropts = self.render_options(view, reachable);
        let script = render_full_replacing(view, family, &ropts, &existing);
        self.expected.remove(&family);
        tool.restore(&script)?;
        ensure_jumps(tool)?;
        if localhost_node_ports(view, family) {
            ensure_localnet_protection(tool)?;
        }
        // A full script names every chain weir owns: it alone says what the kernel holds.
        let mut counts = RuleCounts::new();
        count_rules(&mut counts, &script);
        self.expected.insert(family, counts);
        Ok(())
    }

    /// Whether the kernel still holds what weir wrote into this family's tables. (Before a
    /// sync, an unchanged nf_tables generation answers first, without any of this.) Reading a
    /// whole table is slow with the nf_tables back end (`iptables-save`: 3.7 s at 1,000
    /// services × 10 endpoints), reading one small chain is not (≈ 8 ms at that size), so
    /// this lists only small chains that a flush empties. Before every sync (5 listings,
    /// ≈ 40 ms at 1,000 services, where the old canary check took 3):
    ///
    /// * `KUBE-MARK-MASQ` (nat) and `KUBE-FORWARD` (filter) hold the rules weir wrote:
    ///   `iptables -t nat -F`, `-t filter -F` and deleted chains show here (kube-proxy's
    ///   canary chains only notice the last);
    /// * nat PREROUTING, OUTPUT and POSTROUTING hold weir's jumps.
    ///
    /// `thorough` (the periodic check, every `--sync-period`) adds the filter table's jumps
    /// and the last rule weir wrote into the nat `KUBE-SERVICES` (`-S KUBE-SERVICES <n>`, one
    /// rule read), which sees `iptables -t nat -F KUBE-SERVICES`; a sync with changes
    /// rewrites that chain anyway.
    fn family_intact(&self, family: IpFamily, thorough: bool) -> Result<bool> {
        let Some(expected) = self.expected.get(&family) else {
            return Ok(false);
        };
        let rules = |text: &str, chain: &str| {
            text.lines()
                .filter(|l| l.starts_with(&format!("-A {chain} ")))
                .count()
        };
        for (table, chain) in [(Table::Nat, KUBE_MARK_MASQ), (Table::Filter, KUBE_FORWARD)] {
            let want = expected.get(&(table, chain.to_string())).copied();
            let held = self.tool(family).list_chain(table, chain, None)?;
            if held.as_deref().map(|t| rules(t, chain)) != want {
                return Ok(false);
            }
        }
        let mut builtin: BTreeMap<(Table, &str), String> = BTreeMap::new();
        for j in jumps()
            .into_iter()
            .filter(|j| thorough || j.table == Table::Nat)
        {
            let listing = match builtin.entry((j.table, j.chain)) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => {
                    let listing = self.tool(family).list_chain(j.table, j.chain, None)?;
                    e.insert(listing.unwrap_or_default())
                }
            };
            if !has_jump(listing, j.chain, j.target()) {
                return Ok(false);
            }
        }
        if thorough {
            let n = expected
                .get(&(Table::Nat, KUBE_SERVICES.to_string()))
                .copied()
                .unwrap_or(0);
            let last = self
                .tool(family)
                .list_chain(Table::Nat, KUBE_SERVICES, Some(n))?;
            if n > 0 && last.is_none() {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// The number of `family`'s service ports in `plan`.
fn plan_ports(plan: &Plan, family: IpFamily) -> usize {
    plan.services.keys().filter(|k| k.family == family).count()
}

/// Whether `view` serves NodePorts on a loopback address (`--nodeport-addresses
/// 127.0.0.0/8`, IPv4 only).
fn localhost_node_ports(view: &Plan, family: IpFamily) -> bool {
    family == IpFamily::V4
        && matches!(view.node_port_addresses(family),
            NodePortAddresses::List(l) if l.iter().any(|a| a.is_loopback()))
}

/// What localhost NodePorts need, as kube-proxy does it: `route_localnet=1` (so a packet
/// from 127.0.0.1 may be routed to a pod after DNAT), and kubelet's CVE-2020-8558 rule
/// ("block incoming localnet connections") in kubelet's `KUBE-FIREWALL`, hooked into INPUT
/// and OUTPUT. Added only if missing and never removed: the chain and its jumps are
/// kubelet's (same spelling), weir only makes sure the protection is there.
fn ensure_localnet_protection(tool: Tool) -> Result<()> {
    // /proc/sys/net belongs to the network namespace of the thread that opens it.
    std::fs::write("/proc/sys/net/ipv4/conf/all/route_localnet", "1")?;
    tool.ensure_chain(Table::Filter, KUBE_FIREWALL)?;
    let rule = [
        "-m",
        "comment",
        "--comment",
        "block incoming localnet connections",
        "-d",
        "127.0.0.0/8",
        "!",
        "-s",
        "127.0.0.0/8",
        "-m",
        "conntrack",
        "!",
        "--ctstate",
        "RELATED,ESTABLISHED,DNAT",
        "-j",
        "DROP",
    ];
    if !tool.has_rule(Table::Filter, KUBE_FIREWALL, &rule)? {
        tool.insert_rule(Table::Filter, KUBE_FIREWALL, &rule)?;
    }
    for chain in ["INPUT", "OUTPUT"] {
        let jump = ["-j", KUBE_FIREWALL];
        if !tool.has_rule(Table::Filter, chain, &jump)? {
            tool.insert_rule(Table::Filter, chain, &jump)?;
        }
    }
    Ok(())
}

/// Inserts the missing jump rules. Walking the list backwards with "insert at 1" leaves
/// them at the head of each built-in chain in list order.
fn ensure_jumps(tool: Tool) -> Result<()> {
    for j in jumps().iter().rev() {
        if !tool.has_rule(j.table, j.chain, &j.args)? {
            tool.insert_rule(j.table, j.chain, &j.args)?;
        }
    }
    Ok(())
}

/// Removes one family's jumps and chains; absence is not an error. `batch`: chains per
/// commit (iptables-nft), `None` for one commit per table.
fn cleanup_family(tool: Tool, batch: Option<usize>) -> Result<()> {
    if !tool.available() {
        return Ok(());
    }
    for j in jumps() {
        // Every copy, should something (an old version, a human) have added duplicates.
        for _ in 0..64 {
            if !tool.delete_rule(j.table, j.chain, &j.args) {
                break;
            }
        }
    }
    // A family whose tables cannot be read (IPv6 disabled) holds nothing of ours.
    let Ok(saved) = tool.save(None) else {
        return Ok(());
    };
    let mut r = Restore::default();
    let mut any = false;
    for (table, chains) in super::tools::chains_in_save(&saved) {
        let Some(t) = Table::parse(&table) else {
            continue;
        };
        let ours: Vec<String> = chains.into_iter().filter(|c| is_weir_chain(t, c)).collect();
        any |= !ours.is_empty();
        delete_in_batches(&mut r, t, ours, batch.unwrap_or(usize::MAX));
    }
    if any {
        tool.restore(&r.text("weir iptables cleanup"))?;
    }
    Ok(())
}

impl Backend for IptablesBackend {
    fn mode(&self) -> &'static str {
        "iptables"
    }

    fn sync(&mut self, plan: &Plan) -> Result<SyncReport> {
        self.sync_with(plan, None)
    }

    fn sync_diff(&mut self, plan: &Plan, diff: &PlanDiff) -> Result<SyncReport> {
        self.sync_with(plan, Some(diff))
    }

    fn intact(&mut self) -> Result<bool> {
        for family in self.applied.keys().copied().collect::<Vec<_>>() {
            if !self.family_intact(family, true)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn invalidate(&mut self) {
        self.applied.clear();
    }

    fn cleanup(&mut self) -> Result<()> {
        self.synced_generation = None;
        self.applied.clear();
        self.expected.clear();
        if self.flavor.is_none() {
            let family = self.opts.families.first().copied().unwrap_or(IpFamily::V4);
            self.flavor = Some(detect::resolve(self.opts.backend, family));
        }
        for family in self.opts.families.clone() {
            let tool = self.tool(family);
            let nf_tables = match self.nf_tables {
                Some(known) => known,
                None => tool.is_nf_tables().unwrap_or(false),
            };
            cleanup_family(tool, nf_tables.then_some(NFT_CHAINS_PER_COMMIT))?;
        }
        Ok(())
    }
}
