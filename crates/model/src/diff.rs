use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::plan::{Plan, ServicePortKey, ServicePortPlan};

/// The old and new plan of a service port that changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    pub old: Arc<ServicePortPlan>,
    pub new: Arc<ServicePortPlan>,
}

/// What changed between two plans, per service port. Renderers rewrite only these.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PlanDiff {
    pub added: BTreeMap<ServicePortKey, Arc<ServicePortPlan>>,
    pub removed: BTreeMap<ServicePortKey, Arc<ServicePortPlan>>,
    pub changed: BTreeMap<ServicePortKey, Changed>,
    /// Node-wide settings (nodeport addresses, cluster CIDRs, masquerade-all) differ:
    /// renderers should re-render the global parts (or everything).
    pub globals_changed: bool,
    /// The new plan's globals (applied by [`Plan::apply`]).
    new_globals: Option<Plan>,
}

impl PlanDiff {
    /// Records how the node-wide settings differ from `old` to `new` (their services are
    /// not looked at).
    pub(crate) fn note_globals(&mut self, old: &Plan, new: &Plan) {
        let (og, ng) = (globals(old), globals(new));
        // Warnings are informational; they do not make the dataplane differ.
        self.globals_changed = og.node_port_addresses_v4 != ng.node_port_addresses_v4
            || og.node_port_addresses_v6 != ng.node_port_addresses_v6
            || og.cluster_cidrs != ng.cluster_cidrs
            || og.masquerade_all != ng.masquerade_all;
        self.new_globals = (og != ng).then_some(ng);
    }

    /// This diff followed by `next` as one diff: if `self` is `a.diff(b)` and `next` is
    /// `b.diff(c)`, the result is `a.diff(c)` (what a consumer that missed `b` needs).
    /// Costs the service ports the two touch.
    pub fn then(mut self, next: PlanDiff) -> PlanDiff {
        // Each key's value in `a` (`None`: absent) and in `b`, as far as `self` knows.
        for (k, new) in next.added {
            // Absent in b: either absent in a too, or removed by `self`.
            match self.removed.remove(&k) {
                Some(old) if Arc::ptr_eq(&old, &new) || old == new => {}
                Some(old) => {
                    self.changed.insert(k, Changed { old, new });
                }
                None => {
                    self.added.insert(k, new);
                }
            }
        }
        for (k, old_b) in next.removed {
            if self.added.remove(&k).is_some() {
                continue; // absent in a, absent in c
            }
            let old = self.changed.remove(&k).map_or(old_b, |c| c.old);
            self.removed.insert(k, old);
        }
        for (k, c) in next.changed {
            if let Some(new) = self.added.get_mut(&k) {
                *new = c.new;
                continue;
            }
            let old = self.changed.remove(&k).map_or(c.old, |first| first.old);
            if !(Arc::ptr_eq(&old, &c.new) || old == c.new) {
                self.changed.insert(k, Changed { old, new: c.new });
            }
        }
        if let Some(g) = next.new_globals {
            self.new_globals = Some(g);
        }
        self.globals_changed |= next.globals_changed;
        self
    }

    /// The touched service ports as two small plans: their old values and their new ones
    /// (no globals). For consumers written against whole plans whose result depends only on
    /// the ports that differ (stale conntrack flows).
    pub fn sides(&self) -> (Plan, Plan) {
        let (mut old, mut new) = (Plan::default(), Plan::default());
        for (k, v) in &self.removed {
            old.services.insert(k.clone(), v.clone());
        }
        for (k, v) in &self.added {
            new.services.insert(k.clone(), v.clone());
        }
        for (k, c) in &self.changed {
            old.services.insert(k.clone(), c.old.clone());
            new.services.insert(k.clone(), c.new.clone());
        }
        (old, new)
    }

    pub fn is_empty(&self) -> bool {
        self.added.is_empty()
            && self.removed.is_empty()
            && self.changed.is_empty()
            && !self.globals_changed
    }

    /// Every service port touched, in order.
    pub fn touched(&self) -> BTreeSet<&ServicePortKey> {
        self.added
            .keys()
            .chain(self.removed.keys())
            .chain(self.changed.keys())
            .collect()
    }
}

/// The plan without its services (cloned field by field: cloning the plan would copy the
/// whole service map).
pub(crate) fn globals(p: &Plan) -> Plan {
    Plan {
        services: BTreeMap::new(),
        node_port_addresses_v4: p.node_port_addresses_v4.clone(),
        node_port_addresses_v6: p.node_port_addresses_v6.clone(),
        cluster_cidrs: p.cluster_cidrs.clone(),
        masquerade_all: p.masquerade_all,
        warnings: p.warnings.clone(),
    }
}

impl Plan {
    /// `old.diff(new)`: what to do to go from `old` to `new`.
    pub fn diff(&self, new: &Plan) -> PlanDiff {
        let mut d = PlanDiff::default();
        // Both maps are sorted by key: walk them side by side (no lookups).
        let mut old_it = self.services.iter().peekable();
        let mut new_it = new.services.iter().peekable();
        loop {
            match (old_it.peek(), new_it.peek()) {
                (None, None) => break,
                (Some((k, v)), None) => {
                    d.removed.insert((*k).clone(), (*v).clone());
                    old_it.next();
                }
                (None, Some((k, v))) => {
                    d.added.insert((*k).clone(), (*v).clone());
                    new_it.next();
                }
                (Some((ok, ov)), Some((nk, nv))) => match ok.cmp(nk) {
                    std::cmp::Ordering::Less => {
                        d.removed.insert((*ok).clone(), (*ov).clone());
                        old_it.next();
                    }
                    std::cmp::Ordering::Greater => {
                        d.added.insert((*nk).clone(), (*nv).clone());
                        new_it.next();
                    }
                    std::cmp::Ordering::Equal => {
                        // Pointer first: the planner reuses unchanged service ports' Arcs.
                        if !Arc::ptr_eq(ov, nv) && ov != nv {
                            d.changed.insert(
                                (*ok).clone(),
                                Changed {
                                    old: (*ov).clone(),
                                    new: (*nv).clone(),
                                },
                            );
                        }
                        old_it.next();
                        new_it.next();
                    }
                },
            }
        }
        d.note_globals(self, new);
        d
    }

    /// Applies a diff: `old.apply(&old.diff(&new)) == new`.
    pub fn apply(&mut self, d: &PlanDiff) {
        for k in d.removed.keys() {
            self.services.remove(k);
        }
        for (k, v) in &d.added {
            self.services.insert(k.clone(), v.clone());
        }
        for (k, c) in &d.changed {
            self.services.insert(k.clone(), c.new.clone());
        }
        if let Some(g) = &d.new_globals {
            let services = std::mem::take(&mut self.services);
            *self = Plan {
                services,
                ..g.clone()
            };
        }
    }
}
