//! Applies plans to the kernel of the calling thread's network namespace.
//!
//! * Full sync (first sync of a process, node-wide changes, after a failure): the structure
//!   (chains, rules, declarations, small node-wide sets) in one `nft -f` transaction written
//!   in place, then the service and endpoint maps reconciled element by element over netlink
//!   against what the kernel holds — so a restart changes nothing that is already right, and
//!   a cold start is split into transactions of [`COLD_START_CHUNK`] elements instead of one
//!   that would stall the datapath. The elements are held between rendering and sending
//!   only as the bytes netlink carries ([`ruleset_encoded`]), and the operations are built
//!   one transaction at a time: a full sync's heap does not hold every element as a value,
//!   nor a list of every operation.
//! * Partial sync: the elements of the changed service ports, one netlink transaction; an
//!   update that needs new chains or sets (affinity, a new endpoint count) goes through
//!   `nft -f` as one transaction instead.

use std::collections::HashMap;
use std::process::Command;
use std::time::Instant;

use weir_model::{Plan, PlanDiff};

use super::netlink::{EncodedElements, NftNetlink, Op, RawData, RawElement, Sent, Wire};
use super::render::{
    render_full, render_structure, render_update_parts, ruleset_encoded, update, EncodedSets,
    EndpointRefs, NftOptions, Ruleset, Update,
};
use crate::backend::{Backend, Error, Result, SyncKind, SyncReport};

/// Element operations per transaction when a full sync has many to make.
pub const COLD_START_CHUNK: usize = 20_000;

/// The nftables mode.
pub struct NftBackend {
    opts: NftOptions,
    applied: Option<Plan>,
    /// Endpoint address counts of `applied` (hairpin pairs), kept up to date incrementally.
    refs: EndpointRefs,
    /// Rules per chain that the kernel holds after the last sync (what `intact` compares
    /// with). Kept up to date by every path that writes chains.
    expected_rules: HashMap<String, usize>,
    netlink: Option<NftNetlink>,
}

impl NftBackend {
    pub fn new(opts: NftOptions) -> Self {
        NftBackend {
            opts,
            applied: None,
            refs: EndpointRefs::default(),
            expected_rules: HashMap::new(),
            netlink: None,
        }
    }

    /// What the backend's netlink socket has sent (zero before it opened one): counts for
    /// tests, never times.
    pub fn netlink_sent(&self) -> Sent {
        self.netlink
            .as_ref()
            .map(NftNetlink::sent)
            .unwrap_or_default()
    }

    fn netlink(&mut self) -> Result<&mut NftNetlink> {
        if self.netlink.is_none() {
            self.netlink = Some(NftNetlink::new()?);
        }
        Ok(self.netlink.as_mut().expect("just set"))
    }

    fn full_sync(&mut self, plan: &Plan) -> Result<()> {
        let t0 = Instant::now();
        let (rs, encoded) = ruleset_encoded(plan, &self.opts);
        let expected = rs
            .chains
            .iter()
            .filter(|(_, _, rules)| !rules.is_empty())
            .map(|(name, _, rules)| (name.clone(), rules.len()))
            .collect();
        let rendered = t0.elapsed();
        if let Err(e) = nft_script(&render_structure(&rs, &self.opts)) {
            // A declaration that differs from the kernel's (an older weir's table) cannot
            // be changed in place: replace the whole table in one transaction.
            tracing::warn!("in-place structure update failed ({e}); replacing the table");
            drop(encoded);
            nft_script(&render_full(plan, &self.opts))?;
        } else {
            let structure = t0.elapsed();
            let (deletes, adds) = self.reconcile_elements(&rs, &encoded)?;
            let reconciled = t0.elapsed();
            let table = self.opts.table.clone();
            // Deletes first (dispatch maps before the endpoint maps they lead to), then adds
            // (endpoint maps first), in transactions of COLD_START_CHUNK operations built one
            // at a time.
            let ops = deletes
                .iter()
                .rev()
                .flat_map(|(name, els)| {
                    els.iter()
                        .map(move |e| (Op::Delete, *name, Wire::Raw(e.clone())))
                })
                .chain(adds.iter().flat_map(|(name, els, keep)| {
                    els.iter()
                        .enumerate()
                        .filter(move |(i, _)| keep.as_ref().is_none_or(|k| k[*i]))
                        .map(move |(_, a)| (Op::Add, *name, Wire::Encoded(a)))
                }));
            let mut chunk = Vec::with_capacity(COLD_START_CHUNK);
            let mut element_ops = 0;
            for op in ops {
                chunk.push(op);
                if chunk.len() == COLD_START_CHUNK {
                    self.netlink()?.apply(&table, &chunk)?;
                    element_ops += chunk.len();
                    chunk.clear();
                }
            }
            self.netlink()?.apply(&table, &chunk)?;
            element_ops += chunk.len();
            drop(chunk);
            let encoded_bytes: usize = encoded.values().map(EncodedElements::capacity_bytes).sum();
            drop(adds);
            drop(encoded);
            let elements = t0.elapsed();
            self.remove_stale(&rs)?;
            // Where a full sync's time goes (the figures docs/benchmarks.md reports).
            tracing::info!(
                render_ms = ms(rendered),
                nft_structure_ms = ms(structure - rendered),
                reconcile_ms = ms(reconciled - structure),
                element_ops,
                encoded_mib = encoded_bytes as f64 / f64::from(1 << 20),
                netlink_ms = ms(elements - reconciled),
                remove_stale_ms = ms(t0.elapsed() - elements),
                "full sync phases"
            );
        }
        self.refs = rs.refs;
        self.expected_rules = expected;
        Ok(())
    }

    /// The canary: every chain of weir's table holds as many rules as weir wrote. A deleted
    /// table (`nft flush ruleset`), a flushed table or chain (`nft flush table inet weir`,
    /// firewall reloads) or a rule someone added or deleted makes it false. One netlink
    /// dump of the table's rules, whose number does not grow with the number of services.
    fn canary_intact(&mut self) -> Result<bool> {
        let table = self.opts.table.clone();
        if !self.netlink()?.chain_exists(&table, "services")? {
            return Ok(false);
        }
        let counts = self.netlink()?.rule_counts(&table)?;
        Ok(counts == self.expected_rules)
    }

    /// One sync; `given` is `applied.diff(plan)` when the caller knows it (see
    /// [`Backend::sync_diff`]): then nothing here walks or copies the whole plan unless the
    /// sync is a full one, and the applied plan is moved forward by the diff.
    fn sync_with(&mut self, plan: &Plan, given: Option<&PlanDiff>) -> Result<SyncReport> {
        let start = Instant::now();
        // Taken out: on any failure `applied` stays None and the next sync is a full one.
        let mut old = self.applied.take();
        if old.is_some() && !self.canary_intact()? {
            tracing::warn!("weir's nftables table was changed behind its back: full resync");
            old = None;
        }
        let computed;
        let diff = match (&old, given) {
            (None, _) => None,
            (Some(_), Some(d)) => Some(d),
            (Some(old), None) => {
                computed = old.diff(plan);
                Some(&computed)
            }
        };
        let (kind, touched, applied) = match (old, diff) {
            (Some(old), Some(d)) if d.is_empty() => (SyncKind::Noop, 0, old),
            (Some(mut old), Some(d)) if !d.globals_changed => {
                let u = update(&old, plan, d, &self.opts, &self.refs);
                if u.elements_only() {
                    let ops: Vec<(Op, &str, Wire)> = u
                        .del_el
                        .iter()
                        .map(|(s, e)| (Op::Delete, s.as_str(), Wire::Plan(e)))
                        .chain(
                            u.add_el
                                .iter()
                                .map(|(s, e)| (Op::Add, s.as_str(), Wire::Plan(e))),
                        )
                        .collect();
                    let table = self.opts.table.clone();
                    self.netlink()?.apply(&table, &ops)?;
                } else {
                    nft_script(&render_update_parts(&u, &self.opts))?;
                    self.expect_update(&u);
                }
                self.refs.update(&old, plan, &d.touched(), &self.opts);
                // What the kernel now holds: the old plan moved by the diff (no copy of the
                // whole plan per change).
                old.apply(d);
                (SyncKind::Partial, u.touched, old)
            }
            _ => {
                self.full_sync(plan)?;
                (SyncKind::Full, plan.services.len(), plan.clone())
            }
        };
        self.applied = Some(applied);
        Ok(SyncReport {
            kind,
            elapsed: start.elapsed(),
            service_ports_touched: touched,
        })
    }

    /// Keeps `expected_rules` in step with an update written with `nft -f`.
    fn expect_update(&mut self, u: &Update) {
        for c in u.flush_chains.iter().chain(&u.delete_chains) {
            self.expected_rules.remove(c);
        }
        for (c, rules) in &u.add_chains {
            if rules.is_empty() {
                self.expected_rules.remove(c);
            } else {
                self.expected_rules.insert(c.clone(), rules.len());
            }
        }
    }

    /// What turns the kernel's maps into `rs`'s: per set in declaration order, the elements
    /// to delete (sent first, in reverse order: dispatch maps before the endpoint maps they
    /// lead to) and the encoded elements to add, with which of them to send (`None`: all; a
    /// map the kernel holds empty, as on a first start, is compared with nothing).
    #[allow(clippy::type_complexity)]
    fn reconcile_elements<'r>(
        &mut self,
        rs: &'r Ruleset,
        encoded: &'r EncodedSets,
    ) -> Result<(
        Vec<(&'r str, Vec<RawElement>)>,
        Vec<(&'r str, &'r EncodedElements, Option<Vec<bool>>)>,
    )> {
        let table = self.opts.table.clone();
        let mut deletes = Vec::new();
        let mut adds = Vec::new();
        for (name, _) in rs.decls.iter().filter(|(n, _)| rs.via_netlink(n)) {
            let desired = encoded.get(name);
            let current = self.netlink()?.dump(&table, name)?;
            if current.is_empty() {
                if let Some(d) = desired {
                    adds.push((name.as_str(), d, None));
                }
                continue;
            }
            // Each desired element is decoded once, compared, and taken out of the kernel's
            // elements: what is left there is not wanted. No decoded copy of the desired set
            // is kept (a million elements at 100,000 services).
            let mut current: HashMap<Vec<u8>, Option<RawData>> =
                current.into_iter().map(|e| (e.key, e.data)).collect();
            let mut set_deletes = Vec::new();
            let mut keep = Vec::with_capacity(desired.map_or(0, EncodedElements::len));
            for a in desired.into_iter().flat_map(EncodedElements::iter) {
                let raw = RawElement::of_encoded(a).expect("an element weir encoded decodes");
                match current.remove(&raw.key) {
                    Some(data) if data == raw.data => keep.push(false),
                    Some(data) => {
                        set_deletes.push(RawElement { key: raw.key, data });
                        keep.push(true);
                    }
                    None => keep.push(true),
                }
            }
            set_deletes.extend(
                current
                    .into_iter()
                    .map(|(key, data)| RawElement { key, data }),
            );
            deletes.push((name.as_str(), set_deletes));
            if let Some(d) = desired {
                adds.push((name.as_str(), d, Some(keep)));
            }
        }
        Ok((deletes, adds))
    }

    /// Deletes chains and sets of weir's table that the ruleset no longer has (balancing
    /// chains of endpoint counts no service uses, affinity chains and sets of removed
    /// services). Chains go first: their rules reference the sets.
    fn remove_stale(&mut self, rs: &Ruleset) -> Result<()> {
        let t = &self.opts.table.clone();
        let mut script = String::new();
        for name in names_in_table(&nft_output(&["list", "chains", "inet"])?, t) {
            if !rs.chains.iter().any(|(n, _, _)| *n == name) {
                script.push_str(&format!(
                    "flush chain inet {t} {name}\ndelete chain inet {t} {name}\n"
                ));
            }
        }
        let table = t.clone();
        for name in self.netlink()?.set_names(&table)? {
            if !rs.decls.iter().any(|(n, _)| *n == name) {
                script.push_str(&format!("delete set inet {t} {name}\n"));
            }
        }
        if script.is_empty() {
            Ok(())
        } else {
            nft_script(&script)
        }
    }
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Names of the chains that a `nft list chains inet` listing shows under table `table`
/// (nft 1.0.6 cannot list them for one table only).
fn names_in_table(listing: &str, table: &str) -> Vec<String> {
    let header = format!("table inet {table} {{");
    let mut ours = false;
    let mut names = Vec::new();
    for line in listing.lines() {
        if line.starts_with("table ") {
            ours = line.trim() == header;
            continue;
        }
        let mut words = line.split_whitespace();
        if let (true, Some(kind), Some(name)) = (ours, words.next(), words.next()) {
            if kind == "chain" && line.trim_end().ends_with('{') {
                names.push(name.to_string());
            }
        }
    }
    names
}

/// Runs `nft -f -` with `script` on stdin (weir-kernel's runner).
pub(crate) fn nft_script(script: &str) -> Result<()> {
    use weir_kernel::nft::NftError;
    weir_kernel::nft::apply(script).map_err(|e| match e {
        NftError::Spawn(e) | NftError::Io(e) => Error::Io(e),
        NftError::Rejected(detail) => Error::Tool {
            tool: "nft".into(),
            detail,
        },
    })
}

fn nft_output(args: &[&str]) -> Result<String> {
    let out = Command::new("nft").args(args).output()?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Error::Tool {
            tool: format!("nft {}", args.join(" ")),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

impl Backend for NftBackend {
    fn mode(&self) -> &'static str {
        "nftables"
    }

    fn sync(&mut self, plan: &Plan) -> Result<SyncReport> {
        self.sync_with(plan, None)
    }

    fn sync_diff(&mut self, plan: &Plan, diff: &PlanDiff) -> Result<SyncReport> {
        self.sync_with(plan, Some(diff))
    }

    fn intact(&mut self) -> Result<bool> {
        if self.applied.is_none() {
            return Ok(true);
        }
        self.canary_intact()
    }

    fn invalidate(&mut self) {
        self.applied = None;
    }

    fn cleanup(&mut self) -> Result<()> {
        self.applied = None;
        let t = &self.opts.table;
        // Declaring first makes the delete succeed whether or not the table exists.
        nft_script(&format!("table inet {t} {{}}\ndelete table inet {t}\n"))
    }
}
