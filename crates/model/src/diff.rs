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

fn globals(p: &Plan) -> Plan {
    Plan {
        services: BTreeMap::new(),
        ..p.clone()
    }
}

impl Plan {
    /// `old.diff(new)`: what to do to go from `old` to `new`.
    pub fn diff(&self, new: &Plan) -> PlanDiff {
        let mut d = PlanDiff::default();
        for (k, v) in &self.services {
            match new.services.get(k) {
                None => {
                    d.removed.insert(k.clone(), v.clone());
                }
                // Pointer first: the planner reuses unchanged service ports' Arcs.
                Some(n) if !Arc::ptr_eq(n, v) && n != v => {
                    d.changed.insert(
                        k.clone(),
                        Changed {
                            old: v.clone(),
                            new: n.clone(),
                        },
                    );
                }
                Some(_) => {}
            }
        }
        for (k, v) in &new.services {
            if !self.services.contains_key(k) {
                d.added.insert(k.clone(), v.clone());
            }
        }
        let (og, ng) = (globals(self), globals(new));
        // Warnings are informational; they do not make the dataplane differ.
        d.globals_changed = Plan {
            warnings: vec![],
            ..og.clone()
        } != Plan {
            warnings: vec![],
            ..ng.clone()
        };
        if og != ng {
            d.new_globals = Some(ng);
        }
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
