//! `iptables-restore` input, built table by table.
//!
//! With `--noflush`, a table section only touches the chains it names: a `:CHAIN - [0:0]`
//! line creates the chain or flushes it, the `-A` lines refill it, `-X` deletes it, and the
//! whole section commits atomically. That is what makes both the full sync (every weir
//! chain replaced in one step, no empty moment) and the partial sync (only some chains
//! named) possible with the same tool.
//!
//! A table may be split into several sections ([`Restore::next_commit`]), committed one
//! after the other: iptables-nft's restore costs time quadratic in the number of chains one
//! commit names (its cache request keeps them in a sorted linked list, walked once per
//! `:CHAIN` and `-A` line and jump target: 2.2 s of CPU for 5,500 chains, 500 services ×
//! 10 endpoints), so weir commits a big nat table in batches of whole service ports, in
//! an order where every commit leaves a consistent ruleset (see `render_full_replacing`).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt::Write as _;

/// The tables weir writes to, in the order their sections are emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Table {
    Mangle,
    Filter,
    Nat,
}

impl Table {
    pub fn name(self) -> &'static str {
        match self {
            Table::Mangle => "mangle",
            Table::Filter => "filter",
            Table::Nat => "nat",
        }
    }

    pub fn parse(s: &str) -> Option<Table> {
        match s {
            "mangle" => Some(Table::Mangle),
            "filter" => Some(Table::Filter),
            "nat" => Some(Table::Nat),
            _ => None,
        }
    }
}

#[derive(Debug, Default)]
struct Section {
    /// Declared (created or flushed) chains, in first-declaration order.
    chains: Vec<String>,
    declared: BTreeSet<String>,
    rules: Vec<String>,
    deleted: Vec<String>,
}

/// An `iptables-restore` script under construction: per table, one or more sections, each
/// committed on its own.
#[derive(Debug, Default)]
pub struct Restore {
    sections: BTreeMap<Table, Vec<Section>>,
    /// Every chain any section declares, per table: [`Restore::is_declared`] is asked once
    /// per chain the kernel holds, which a walk over the sections made quadratic (a full
    /// sync over 55,000 chains in 550 commits).
    declared: BTreeMap<Table, HashSet<String>>,
}

impl Restore {
    /// The section of `t` that declarations and rules go to now.
    fn current(&mut self, t: Table) -> &mut Section {
        let v = self.sections.entry(t).or_default();
        if v.is_empty() {
            v.push(Section::default());
        }
        v.last_mut().expect("just ensured")
    }

    /// Creates or flushes `chain` (idempotent within one section).
    pub fn declare(&mut self, t: Table, chain: &str) {
        let s = self.current(t);
        if s.declared.insert(chain.to_string()) {
            s.chains.push(chain.to_string());
            self.declared
                .entry(t)
                .or_default()
                .insert(chain.to_string());
        }
    }

    /// Appends `-A chain args` (the chain must be declared, or exist in the kernel).
    pub fn rule(&mut self, t: Table, chain: &str, args: &str) {
        self.current(t).rules.push(format!("-A {chain} {args}"));
    }

    /// Flushes and deletes `chain`. Declaring it first makes this succeed whether or not
    /// it exists, and empties it so the `-X` cannot fail on its own rules.
    pub fn delete(&mut self, t: Table, chain: &str) {
        self.declare(t, chain);
        self.current(t).deleted.push(chain.to_string());
    }

    /// Whether any section of `t` declares `chain`.
    pub fn is_declared(&self, t: Table, chain: &str) -> bool {
        self.declared.get(&t).is_some_and(|d| d.contains(chain))
    }

    /// Chains the current section of `t` declares.
    pub fn declared_now(&self, t: Table) -> usize {
        self.sections
            .get(&t)
            .and_then(|v| v.last())
            .map_or(0, |s| s.chains.len())
    }

    /// Closes the current section of `t`: what follows goes into a new `COMMIT`. A no-op
    /// while the current section is empty.
    pub fn next_commit(&mut self, t: Table) {
        let s = self.current(t);
        if !(s.chains.is_empty() && s.rules.is_empty()) {
            self.sections.entry(t).or_default().push(Section::default());
        }
    }

    /// The script text, after a `#` comment line (iptables-restore skips those).
    pub fn text(&self, header: &str) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# {header}");
        let sections = self
            .sections
            .iter()
            .flat_map(|(t, v)| v.iter().map(move |s| (t, s)))
            .filter(|(_, s)| !(s.chains.is_empty() && s.rules.is_empty()));
        for (t, s) in sections {
            let _ = writeln!(out, "*{}", t.name());
            for c in &s.chains {
                let _ = writeln!(out, ":{c} - [0:0]");
            }
            for r in &s.rules {
                let _ = writeln!(out, "{r}");
            }
            // Deletions last: the rules that referenced these chains were flushed above.
            for c in &s.deleted {
                let _ = writeln!(out, "-X {c}");
            }
            let _ = writeln!(out, "COMMIT");
        }
        out
    }
}
