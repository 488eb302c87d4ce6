//! What changes between two [`Ruleset`]s, keyed by chain and map element.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use super::ruleset::{Ruleset, VerdictMap};

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RulesetDiff {
    /// New chains with their rules.
    pub added_chains: BTreeMap<String, Arc<[String]>>,
    /// Chains whose rules differ: flushed and refilled.
    pub changed_chains: BTreeMap<String, Arc<[String]>>,
    /// Chains no longer wanted; deleted after the elements that jump to them.
    pub removed_chains: BTreeSet<String>,
    /// Elements to delete: gone, or pointing elsewhere now.
    pub removed_elements: BTreeMap<VerdictMap, BTreeSet<IpAddr>>,
    /// Elements to add: new, or pointing elsewhere now.
    pub added_elements: BTreeMap<VerdictMap, BTreeMap<IpAddr, String>>,
}

impl RulesetDiff {
    pub fn is_empty(&self) -> bool {
        *self == RulesetDiff::default()
    }
}

impl Ruleset {
    pub fn diff(&self, new: &Ruleset) -> RulesetDiff {
        let mut diff = RulesetDiff::default();
        for (name, rules) in &new.chains {
            match self.chains.get(name) {
                None => {
                    diff.added_chains.insert(name.clone(), rules.clone());
                }
                Some(old) if old != rules => {
                    diff.changed_chains.insert(name.clone(), rules.clone());
                }
                Some(_) => {}
            }
        }
        let gone = self.chains.keys().filter(|c| !new.chains.contains_key(*c));
        diff.removed_chains = gone.cloned().collect();
        let empty = BTreeMap::new();
        for map in VerdictMap::ALL {
            let old = self.maps.get(&map).unwrap_or(&empty);
            let now = new.maps.get(&map).unwrap_or(&empty);
            let removed: BTreeSet<IpAddr> = old
                .iter()
                .filter(|(ip, chain)| now.get(ip) != Some(chain))
                .map(|(ip, _)| *ip)
                .collect();
            let added: BTreeMap<IpAddr, String> = now
                .iter()
                .filter(|(ip, chain)| old.get(ip) != Some(chain))
                .map(|(ip, chain)| (*ip, chain.clone()))
                .collect();
            if !removed.is_empty() {
                diff.removed_elements.insert(map, removed);
            }
            if !added.is_empty() {
                diff.added_elements.insert(map, added);
            }
        }
        diff
    }

    /// This ruleset moved forward by `diff` (what the kernel holds after the diff script).
    pub fn apply(&mut self, diff: &RulesetDiff) {
        for (name, rules) in diff.added_chains.iter().chain(&diff.changed_chains) {
            self.chains.insert(name.clone(), rules.clone());
        }
        for name in &diff.removed_chains {
            self.chains.remove(name);
        }
        for (map, ips) in &diff.removed_elements {
            let elements = self.maps.entry(*map).or_default();
            for ip in ips {
                elements.remove(ip);
            }
        }
        for (map, added) in &diff.added_elements {
            let elements = self.maps.entry(*map).or_default();
            elements.extend(added.iter().map(|(ip, c)| (*ip, c.clone())));
        }
    }
}
