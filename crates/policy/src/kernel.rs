//! The nftables backend: the first plan as the whole `table inet weir-policy` in one
//! transaction, later plans as the keyed diff ([`crate::nft::render_ruleset_diff`]), one
//! transaction each; the check of the kernel's table; cleanup.
//!
//! The scripts go to libnftables inside the process ([`NftLibrary`]) where the library
//! loads, else to the `nft` command ([`NftCommand`]); [`NftAny`] picks. Both parse the same
//! text into the same one-transaction netlink batch; the library saves the command's start
//! (`weir_kernel::libnftables` has the figures).
//!
//! [`Nft`] is the seam: tests hand in a recording fake, so what is sent when (whole table,
//! diff, nothing, after a failure) is tested without root.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::process::Command;
use std::time::Instant;

use crate::backend::{Backend, Error, SyncKind, SyncReport};
use crate::nft::{self, Ruleset, VerdictMap, TABLE};
use crate::plan::PolicyPlan;

/// How the backend talks to nftables.
pub trait Nft {
    /// Runs `script` as one transaction (`nft -f -`): all of it applies, or none.
    fn apply(&mut self, script: &str) -> Result<(), Error>;
    /// The table as `nft -j list table inet weir-policy` prints it; `None` when the kernel
    /// has no such table.
    fn list_table(&mut self) -> Result<Option<String>, Error>;
}

/// The `nft` command, in the network namespace of the calling thread (or through a prefix
/// such as `ip netns exec NAME`).
#[derive(Debug, Clone)]
pub struct NftCommand {
    argv: Vec<String>,
}

impl Default for NftCommand {
    fn default() -> Self {
        NftCommand {
            argv: vec!["nft".into()],
        }
    }
}

impl NftCommand {
    pub fn new() -> Self {
        Self::default()
    }

    /// `prefix` then `nft` (tests: `["ip", "netns", "exec", NAME]`).
    pub fn with_prefix(prefix: &[&str]) -> Self {
        let mut argv: Vec<String> = prefix.iter().map(|s| s.to_string()).collect();
        argv.push("nft".into());
        NftCommand { argv }
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.argv[0]);
        c.args(&self.argv[1..]);
        c
    }
}

impl Nft for NftCommand {
    fn apply(&mut self, script: &str) -> Result<(), Error> {
        use weir_kernel::nft::NftError;
        weir_kernel::nft::apply_with(self.command(), script).map_err(|e| match e {
            NftError::Spawn(e) | NftError::Io(e) => Error::Spawn(e),
            NftError::Rejected(why) => Error::Rejected(why),
        })
    }

    fn list_table(&mut self) -> Result<Option<String>, Error> {
        let out = self
            .command()
            .args(["-j", "list", "table", "inet", TABLE])
            .output()?;
        if out.status.success() {
            return Ok(Some(String::from_utf8_lossy(&out.stdout).into_owned()));
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("No such file or directory") {
            return Ok(None);
        }
        Err(Error::Listing(stderr.trim().to_string()))
    }
}

/// libnftables in this process (one context, kept: its socket and its cache).
pub struct NftLibrary {
    nft: weir_kernel::libnftables::Nftables,
}

impl NftLibrary {
    /// A context in the calling thread's network namespace.
    pub fn new() -> Result<NftLibrary, Error> {
        let nft = weir_kernel::libnftables::Nftables::new().map_err(library_error)?;
        Ok(NftLibrary { nft })
    }

    /// A context that writes into `netns` (tests).
    pub fn in_netns(netns: weir_kernel::NetNs) -> Result<NftLibrary, Error> {
        let nft = weir_kernel::libnftables::Nftables::in_netns(netns).map_err(library_error)?;
        Ok(NftLibrary { nft })
    }
}

fn library_error(e: weir_kernel::libnftables::LibError) -> Error {
    use weir_kernel::libnftables::LibError;
    match e {
        LibError::Rejected(why) => Error::Rejected(why),
        other => Error::Library(other.to_string()),
    }
}

impl Nft for NftLibrary {
    fn apply(&mut self, script: &str) -> Result<(), Error> {
        self.nft.run(script).map(drop).map_err(library_error)
    }

    fn list_table(&mut self) -> Result<Option<String>, Error> {
        match self.nft.run_json(&format!("list table inet {TABLE}")) {
            Ok(json) => Ok(Some(json)),
            Err(weir_kernel::libnftables::LibError::Rejected(why))
                if why.contains("No such file or directory") =>
            {
                Ok(None)
            }
            Err(e) => Err(Error::Listing(e.to_string())),
        }
    }
}

/// The library when it loads, the command otherwise.
pub enum NftAny {
    Library(NftLibrary),
    Command(NftCommand),
}

impl NftAny {
    /// libnftables if this host has it (`libnftables.so.1`), else `nft`.
    pub fn detect() -> NftAny {
        match NftLibrary::new() {
            Ok(library) => NftAny::Library(library),
            Err(e) => {
                tracing::info!("policy: writing rules with the nft command ({e})");
                NftAny::Command(NftCommand::new())
            }
        }
    }

    /// For logs: how rules are written.
    pub fn describe(&self) -> &'static str {
        match self {
            NftAny::Library(_) => "libnftables in process",
            NftAny::Command(_) => "the nft command",
        }
    }
}

impl Nft for NftAny {
    fn apply(&mut self, script: &str) -> Result<(), Error> {
        match self {
            NftAny::Library(n) => n.apply(script),
            NftAny::Command(n) => n.apply(script),
        }
    }

    fn list_table(&mut self) -> Result<Option<String>, Error> {
        match self {
            NftAny::Library(n) => n.list_table(),
            NftAny::Command(n) => n.list_table(),
        }
    }
}

/// The nftables policy backend.
pub struct NftBackend<N = NftAny> {
    nft: N,
    /// What the kernel holds since the last successful sync, and the plan it was made
    /// from; `None` before the first and after a failure or [`Backend::invalidate`] (the
    /// next sync writes the whole table).
    applied: Option<(PolicyPlan, Ruleset)>,
}

impl NftBackend<NftAny> {
    /// Writes with libnftables where it loads, else with the `nft` command.
    pub fn new() -> Self {
        NftBackend::with_nft(NftAny::detect())
    }
}

impl Default for NftBackend<NftAny> {
    fn default() -> Self {
        Self::new()
    }
}

impl<N: Nft> NftBackend<N> {
    pub fn with_nft(nft: N) -> Self {
        NftBackend { nft, applied: None }
    }

    pub fn nft(&self) -> &N {
        &self.nft
    }

    pub fn nft_mut(&mut self) -> &mut N {
        &mut self.nft
    }

    /// What the kernel holds according to the last successful sync.
    pub fn applied(&self) -> Option<&Ruleset> {
        self.applied.as_ref().map(|(_, ruleset)| ruleset)
    }
}

fn rule_count(ruleset: &Ruleset) -> usize {
    let base: usize = nft::base_chains().iter().map(|(_, n)| n).sum();
    base + ruleset
        .chains
        .values()
        .map(|rules| rules.len())
        .sum::<usize>()
}

impl<N: Nft> Backend for NftBackend<N> {
    fn sync(&mut self, plan: &PolicyPlan) -> Result<SyncReport, Error> {
        let start = Instant::now();
        // Taken out: on an error it stays `None`, and the next sync writes the whole table.
        let applied = self.applied.take();
        let new = Ruleset::from_plan_after(plan, applied.as_ref().map(|(p, r)| (p, r)));
        let (kind, script, written) = match applied {
            None => (
                SyncKind::Full,
                nft::render_ruleset(&new, &plan.node),
                new.chains.len(),
            ),
            Some((old_plan, old)) => {
                let diff = old.diff(&new);
                if diff.is_empty() {
                    self.applied = Some((old_plan, old));
                    (SyncKind::Noop, String::new(), 0)
                } else {
                    let written = diff.added_chains.len()
                        + diff.changed_chains.len()
                        + diff.removed_chains.len();
                    (SyncKind::Diff, nft::render_ruleset_diff(&diff), written)
                }
            }
        };
        if kind != SyncKind::Noop {
            self.nft.apply(&script)?;
        }
        let report = SyncReport {
            kind,
            elapsed: start.elapsed(),
            chains: new.chains.len(),
            rules: rule_count(&new),
            chains_written: written,
            script_bytes: script.len(),
        };
        self.applied = Some((plan.clone(), new));
        Ok(report)
    }

    /// One listing of the table, compared with what the last sync wrote: every chain with
    /// its number of rules (the base chains' too) and every verdict map element. A deleted
    /// or flushed table, a deleted or emptied chain, an added or removed rule or element
    /// makes it false; a rule rewritten in place with the same count is not seen.
    fn intact(&mut self) -> Result<bool, Error> {
        let Some((_, applied)) = &self.applied else {
            return Ok(true); // the next sync writes everything anyway
        };
        let Some(json) = self.nft.list_table()? else {
            return Ok(false);
        };
        let found = TableState::from_json(&json).map_err(Error::Listing)?;
        Ok(found == TableState::expected(applied))
    }

    fn invalidate(&mut self) {
        self.applied = None;
    }

    fn cleanup(&mut self) -> Result<(), Error> {
        self.applied = None;
        self.nft.apply(&nft::render_cleanup())
    }
}

/// What [`NftBackend::intact`] compares: rules per chain, elements per verdict map.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TableState {
    pub chains: BTreeMap<String, usize>,
    pub maps: BTreeMap<String, BTreeMap<IpAddr, String>>,
}

impl TableState {
    /// The table `ruleset` renders to.
    pub fn expected(ruleset: &Ruleset) -> TableState {
        let mut chains: BTreeMap<String, usize> = nft::base_chains()
            .into_iter()
            .map(|(name, rules)| (name.to_string(), rules))
            .collect();
        for (name, rules) in &ruleset.chains {
            chains.insert(name.clone(), rules.len());
        }
        let maps = VerdictMap::ALL
            .iter()
            .map(|m| {
                let elements = ruleset.maps.get(m).cloned().unwrap_or_default();
                (m.name().to_string(), elements)
            })
            .collect();
        TableState { chains, maps }
    }

    /// Reads `nft -j list table inet weir-policy`.
    pub fn from_json(text: &str) -> Result<TableState, String> {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("nft -j output: {e}"))?;
        let items = v["nftables"]
            .as_array()
            .ok_or("nft -j output without an \"nftables\" list")?;
        let mut state = TableState::default();
        let ours = |o: &serde_json::Value| o["family"] == "inet" && o["table"] == TABLE;
        for item in items {
            if let Some(chain) = item.get("chain").filter(|c| ours(c)) {
                let name = chain["name"].as_str().ok_or("a chain without a name")?;
                state.chains.entry(name.to_string()).or_insert(0);
            } else if let Some(rule) = item.get("rule").filter(|r| ours(r)) {
                let chain = rule["chain"].as_str().ok_or("a rule without a chain")?;
                *state.chains.entry(chain.to_string()).or_insert(0) += 1;
            } else if let Some(map) = item.get("map").filter(|m| ours(m)) {
                let name = map["name"].as_str().ok_or("a map without a name")?;
                let mut elements = BTreeMap::new();
                for e in map["elem"].as_array().into_iter().flatten() {
                    let (Some(key), Some(target)) = (
                        e[0].as_str().and_then(|k| k.parse::<IpAddr>().ok()),
                        e[1]["jump"]["target"].as_str(),
                    ) else {
                        return Err(format!("map {name}: element {e} is not weir's"));
                    };
                    elements.insert(key, target.to_string());
                }
                state.maps.insert(name.to_string(), elements);
            } else if let Some(set) = item.get("set").filter(|s| ours(s)) {
                // weir writes no named sets: one here was added behind its back.
                let name = set["name"].as_str().unwrap_or("?");
                state.chains.insert(format!("set {name}"), 0);
            }
        }
        Ok(state)
    }
}

#[cfg(test)]
mod tests;
