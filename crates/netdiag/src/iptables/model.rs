//! The model an iptables dump is read into, whichever form it came in: `iptables-save`
//! ([`super::parse`]) or an `iptables -L` listing ([`crate::iptables_listing`]). Both parsers
//! import it; neither imports the other's model.

use std::collections::BTreeMap;

use serde::Serialize;

/// The back end an `iptables-save` header names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Nft,
    Legacy,
    /// No header, or a 1.4–1.6 header (those had only the legacy back end, but a grep-cut file
    /// cannot tell).
    Unknown,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Dump {
    /// `v1.8.9` from the header, when there was one.
    pub version: Option<String>,
    pub backend: Option<Backend>,
    /// Tables by name (`filter`, `nat`, `mangle`, `raw`, `security`).
    pub tables: BTreeMap<String, Table>,
    /// Guesses the parser had to make (a table inferred for a rule with no header).
    pub assumptions: Vec<String>,
    /// Read from an `iptables -L` listing ([`crate::iptables_listing`]), not iptables-save:
    /// only the chains listed are known, and some matches are lossy.
    pub listing: bool,
    /// A listing without `-v`: it prints no in/out interface columns, so a rule that looks
    /// unconditional may match on interfaces.
    pub ifaces_hidden: bool,
    /// Only part of the tables: cut with grep (`iptables-save | grep KUBE-SVC`), or `-A` lines
    /// with no `*table` header and no `-P` policy lines (an `iptables -S` prints those first).
    /// A chain or rule it lacks is unknown, not absent, and a rule's position in its chain is
    /// not known.
    pub partial: bool,
}

impl Dump {
    /// Adds another dump of the same node (another table, another chain, `iptables -L` of
    /// one chain after `iptables-save` of the others). A chain it shows again whole (a listing,
    /// or with its policy) replaces the earlier one, which is said; rules without either
    /// (grep cuts) are appended. A listing anywhere makes the whole a listing (its hedges
    /// apply).
    pub fn merge(&mut self, other: Dump) {
        self.version = self.version.take().or(other.version);
        self.backend = self.backend.take().or(other.backend);
        self.assumptions.extend(other.assumptions);
        self.listing |= other.listing;
        self.partial |= other.partial;
        self.ifaces_hidden |= other.ifaces_hidden;
        for (name, table) in other.tables {
            let mine = self.tables.entry(name).or_default();
            for chain in table.chains {
                match mine.chains.iter_mut().find(|c| c.name == chain.name) {
                    // A listing shows whole chains, and so does a built-in chain's policy
                    // line: a chain shown again is a later look at it.
                    Some(c) if other.listing || chain.policy.is_some() => {
                        self.assumptions.push(format!(
                            "chain {} is shown again: the later one ({} rules) is read, not the \
                             earlier ({} rules)",
                            chain.name,
                            chain.rules.len(),
                            c.rules.len()
                        ));
                        *c = chain;
                    }
                    // Rules cut out with grep: more of the same chain.
                    Some(c) => c.rules.extend(chain.rules),
                    None => mine.chains.push(chain),
                }
            }
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Table {
    /// Chains in the order they were declared or first used.
    pub chains: Vec<Chain>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Chain {
    pub name: String,
    /// `ACCEPT`/`DROP` for built-in chains; `None` for user chains (`-` in the dump) or when the
    /// declaration was cut away.
    pub policy: Option<String>,
    /// The packets the policy has decided, as the paste's counters show them (`[120:7200]`
    /// of `iptables-save -c`, `120 packets` or `12K packets` of `iptables -L -v`); `None`
    /// without counters or when they read zero (`iptables-save` without `-c` writes zeros).
    pub policy_packets: Option<String>,
    pub rules: Vec<Rule>,
}

/// One option of a rule: `-s 10.0.0.0/8`, `! --ctstate RELATED,ESTABLISHED`, `--comment "…"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Arg {
    /// The `-m` module this option belongs to (`None` for the base options and the target's).
    pub module: Option<String>,
    pub negated: bool,
    pub name: String,
    pub values: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Target {
    pub name: String,
    /// `-g` (goto) rather than `-j`.
    pub goto: bool,
    pub args: Vec<Arg>,
}

/// A rule's counters as the paste shows them: `[120:7200]` of `iptables-save -c`, or the
/// `pkts`/`bytes` columns of `iptables -L -v` (`12K` as printed without `-x`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Counters {
    pub packets: String,
    pub bytes: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Rule {
    /// 1-based line in the input, so a trace can point at it.
    pub line: usize,
    /// Its counters, when the paste has them (`iptables-save -c`, `iptables -L -v`).
    pub counters: Option<Counters>,
    /// Its number in its chain as a listing printed it (`--line-numbers`).
    pub number: Option<usize>,
    /// The line as written in the dump.
    pub text: String,
    /// Match modules named with `-m`, in order.
    pub modules: Vec<String>,
    pub args: Vec<Arg>,
    pub target: Option<Target>,
}

impl Rule {
    /// The first option called `name` (`-s`, `--dport`, …), any module.
    pub fn arg(&self, name: &str) -> Option<&Arg> {
        self.args.iter().find(|a| a.name == name)
    }

    /// The first option called `name` of module `module`.
    pub fn module_arg(&self, module: &str, name: &str) -> Option<&Arg> {
        self.args
            .iter()
            .find(|a| a.name == name && a.module.as_deref() == Some(module))
    }

    pub fn target_name(&self) -> Option<&str> {
        self.target.as_ref().map(|t| t.name.as_str())
    }

    /// A value of the target's option, e.g. `--to-destination` of DNAT.
    pub fn target_arg(&self, name: &str) -> Option<&str> {
        self.target
            .as_ref()?
            .args
            .iter()
            .find(|a| a.name == name)
            .and_then(|a| a.values.first())
            .map(String::as_str)
    }

    /// The comment, when the rule has one (`-m comment --comment`).
    pub fn comment(&self) -> Option<&str> {
        self.module_arg("comment", "--comment")
            .and_then(|a| a.values.first())
            .map(String::as_str)
    }
}

impl Dump {
    pub fn chain(&self, table: &str, chain: &str) -> Option<&Chain> {
        self.tables
            .get(table)?
            .chains
            .iter()
            .find(|c| c.name == chain)
    }

    /// Every rule of every table, with its table and chain.
    pub fn rules(&self) -> impl Iterator<Item = (&str, &str, &Rule)> {
        self.tables.iter().flat_map(|(t, table)| {
            table.chains.iter().flat_map(move |c| {
                c.rules
                    .iter()
                    .map(move |r| (t.as_str(), c.name.as_str(), r))
            })
        })
    }

    pub fn is_empty(&self) -> bool {
        self.tables.values().all(|t| t.chains.is_empty())
    }
}

impl Table {
    pub(crate) fn chain_mut(&mut self, name: &str) -> &mut Chain {
        if let Some(i) = self.chains.iter().position(|c| c.name == name) {
            return &mut self.chains[i];
        }
        self.chains.push(Chain {
            name: name.to_string(),
            policy: None,
            policy_packets: None,
            rules: Vec::new(),
        });
        self.chains.last_mut().unwrap()
    }
}
