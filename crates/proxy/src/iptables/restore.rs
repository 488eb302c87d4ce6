//! `iptables-restore` input, built table by table.
//!
//! With `--noflush`, a table section only touches the chains it names: a `:CHAIN - [0:0]`
//! line creates the chain or flushes it, the `-A` lines refill it, `-X` deletes it, and the
//! whole section commits atomically. That is what makes both the full sync (every weir
//! chain replaced in one step, no empty moment) and the partial sync (only some chains
//! named) possible with the same tool.

use std::collections::{BTreeMap, BTreeSet};
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

/// An `iptables-restore` script under construction.
#[derive(Debug, Default)]
pub struct Restore {
    sections: BTreeMap<Table, Section>,
}

impl Restore {
    /// Creates or flushes `chain` (idempotent within one script).
    pub fn declare(&mut self, t: Table, chain: &str) {
        let s = self.sections.entry(t).or_default();
        if s.declared.insert(chain.to_string()) {
            s.chains.push(chain.to_string());
        }
    }

    /// Appends `-A chain args` (the chain must be declared, or exist in the kernel).
    pub fn rule(&mut self, t: Table, chain: &str, args: &str) {
        let s = self.sections.entry(t).or_default();
        s.rules.push(format!("-A {chain} {args}"));
    }

    /// Flushes and deletes `chain`. Declaring it first makes this succeed whether or not
    /// it exists, and empties it so the `-X` cannot fail on its own rules.
    pub fn delete(&mut self, t: Table, chain: &str) {
        self.declare(t, chain);
        self.sections
            .entry(t)
            .or_default()
            .deleted
            .push(chain.to_string());
    }

    pub fn is_declared(&self, t: Table, chain: &str) -> bool {
        self.sections
            .get(&t)
            .is_some_and(|s| s.declared.contains(chain))
    }

    /// The script text, after a `#` comment line (iptables-restore skips those).
    pub fn text(&self, header: &str) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# {header}");
        for (t, s) in &self.sections {
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
