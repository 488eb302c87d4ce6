//! A family's rendering kept per service port, so that a sync after a change renders only the
//! service ports the planner's diff names and reports what that changed (virtual servers, ipset
//! entries, the iptables text) instead of rendering every service and comparing the whole state.
//! Rendering everything was most of a one-endpoint sync: ~7 ms of CPU at 1,000 services and
//! ~110 ms at 10,000 (`examples/ipvs_render.rs`).
//!
//! Pure. [`super::render::render`], which adds the same fragments the plain way, is its oracle:
//! a property test (`tests/ipvs_incremental.rs`) checks that after any sequence of updates the
//! state equals the full rendering, and that what an update reports changed is what differs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use weir_model::{IpFamily, Plan, ServicePortKey};

use super::netlink::ServiceKey;
use super::render::{
    empty_sets, iptables_rules, render_service, set_name, Desired, EntryChange, Fragment,
    IpvsOptions, NoLocal, VirtualServer,
};

/// One family's [`Desired`] and the per-service-port parts it is made of.
#[derive(Debug, Clone)]
pub struct Rendering {
    family: IpFamily,
    /// The NodePort addresses it was rendered for (a change needs a full rendering).
    node_ips: Vec<IpAddr>,
    fragments: HashMap<ServicePortKey, Fragment>,
    /// How many fragments hold each ipset entry and each address.
    set_refs: HashMap<(&'static str, String), u32>,
    address_refs: HashMap<IpAddr, u32>,
    /// The service ports each virtual server is made from (in plan order: the first one's
    /// scheduler and persistence win, as in a full rendering).
    contributors: HashMap<ServiceKey, BTreeSet<ServicePortKey>>,
    no_local: BTreeMap<ServicePortKey, Vec<NoLocal>>,
    pub desired: Desired,
}

/// Each ipset entry and virtual server an update touches, as it was before its first touch.
#[derive(Default)]
struct Before {
    entries: BTreeMap<(&'static str, String), bool>,
    addresses: BTreeMap<IpAddr, bool>,
    servers: BTreeMap<ServiceKey, Option<VirtualServer>>,
}

/// What a [`Rendering::update`] changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Virtual servers added, removed or changed.
    pub servers: BTreeSet<ServiceKey>,
    /// The ipset entries added and deleted.
    pub ipset: Vec<EntryChange>,
    /// `kube-ipvs0`'s addresses added (true) and removed (false).
    pub addresses: Vec<(IpAddr, bool)>,
    pub iptables_changed: bool,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
            && self.ipset.is_empty()
            && self.addresses.is_empty()
            && !self.iptables_changed
    }
}

impl Rendering {
    /// Every service port of `family` in `plan`.
    pub fn full(plan: &Plan, family: IpFamily, node_ips: &[IpAddr], opts: &IpvsOptions) -> Self {
        let mut r = Rendering {
            family,
            node_ips: node_ips.to_vec(),
            fragments: HashMap::new(),
            set_refs: HashMap::new(),
            address_refs: HashMap::new(),
            contributors: HashMap::new(),
            no_local: BTreeMap::new(),
            desired: Desired {
                ipsets: empty_sets(family),
                ..Desired::default()
            },
        };
        for (key, sp) in plan.services.iter().filter(|(k, _)| k.family == family) {
            r.insert(key, render_service(key, sp, node_ips, opts), None);
        }
        let keys: Vec<ServiceKey> = r.contributors.keys().copied().collect();
        for k in keys {
            let vs = r.rebuild_server(&k).expect("a contributed server");
            r.desired.services.insert(k, vs);
        }
        r.desired.iptables = r.rules(plan, opts);
        r
    }

    /// Whether [`Rendering::update`] may follow a change rendered for `node_ips`.
    pub fn serves(&self, node_ips: &[IpAddr]) -> bool {
        self.node_ips == node_ips
    }

    /// Renders `keys` again from `plan` (a key `plan` lacks is removed) and reports what changed.
    pub fn update<'a>(
        &mut self,
        plan: &Plan,
        keys: impl IntoIterator<Item = &'a ServicePortKey>,
        opts: &IpvsOptions,
    ) -> Changes {
        let mut before = Before::default();
        let family = self.family;
        for key in keys.into_iter().filter(|k| k.family == family) {
            let new = plan
                .services
                .get(key)
                .map(|sp| render_service(key, sp, &self.node_ips, opts));
            if let Some(old) = self.fragments.remove(key) {
                self.remove(key, &old, &mut before);
            }
            self.no_local.remove(key);
            if let Some(new) = new {
                self.insert(key, new, Some(&mut before));
            }
        }
        let mut changes = Changes::default();
        for (key, before) in before.servers {
            let now = self.rebuild_server(&key);
            if now != before {
                changes.servers.insert(key);
            }
            match now {
                Some(vs) => self.desired.services.insert(key, vs),
                None => self.desired.services.remove(&key),
            };
        }
        for ((set, entry), was) in before.entries {
            let is = self.set_refs.contains_key(&(set, entry.clone()));
            if is != was {
                changes.ipset.push(EntryChange {
                    add: is,
                    set: set_name(set, self.family),
                    entry,
                });
            }
        }
        for (a, was) in before.addresses {
            let is = self.address_refs.contains_key(&a);
            if is != was {
                changes.addresses.push((a, is));
            }
        }
        let iptables = self.rules(plan, opts);
        changes.iptables_changed = iptables != self.desired.iptables;
        self.desired.iptables = iptables;
        changes
    }

    /// Takes `f` in as `key`'s part; `before` (none in a full rendering) records what it
    /// touches first.
    fn insert(&mut self, key: &ServicePortKey, f: Fragment, before: Option<&mut Before>) {
        self.add(key, &f, before);
        if !f.no_local.is_empty() {
            self.no_local.insert(key.clone(), f.no_local.clone());
        }
        self.fragments.insert(key.clone(), f);
    }

    /// The iptables text for the current state (the firewall drops in plan order).
    fn rules(&self, plan: &Plan, opts: &IpvsOptions) -> String {
        let no_local: Vec<NoLocal> = self.no_local.values().flatten().cloned().collect();
        iptables_rules(plan, self.family, &self.desired, opts, &no_local)
    }

    /// Counts `f` in; `before` (none in a full rendering) records what it touches first.
    fn add(&mut self, key: &ServicePortKey, f: &Fragment, mut before: Option<&mut Before>) {
        for (set, entry) in &f.sets {
            let id = (*set, entry.clone());
            let refs = match &mut before {
                Some(b) => {
                    let refs = self.set_refs.entry(id.clone()).or_insert(0);
                    b.entries.entry(id).or_insert(*refs > 0);
                    refs
                }
                None => self.set_refs.entry(id).or_insert(0),
            };
            *refs += 1;
            if *refs == 1 {
                self.set_entries(set).insert(entry.clone());
            }
        }
        for &a in &f.addresses {
            let refs = self.address_refs.entry(a).or_insert(0);
            if let Some(b) = &mut before {
                b.addresses.entry(a).or_insert(*refs > 0);
            }
            *refs += 1;
            self.desired.addresses.insert(a);
        }
        for (sk, _, _) in &f.servers {
            if let Some(b) = &mut before {
                b.servers
                    .entry(*sk)
                    .or_insert_with(|| self.desired.services.get(sk).cloned());
            }
            self.contributors
                .entry(*sk)
                .or_default()
                .insert(key.clone());
        }
    }

    fn remove(&mut self, key: &ServicePortKey, f: &Fragment, before: &mut Before) {
        for (set, entry) in &f.sets {
            let id = (*set, entry.clone());
            before.entries.entry(id.clone()).or_insert(true);
            let refs = self.set_refs.get_mut(&id).expect("a held entry is counted");
            *refs -= 1;
            if *refs == 0 {
                self.set_refs.remove(&id);
                self.set_entries(set).remove(entry);
            }
        }
        for a in &f.addresses {
            before.addresses.entry(*a).or_insert(true);
            let refs = self
                .address_refs
                .get_mut(a)
                .expect("a held address is counted");
            *refs -= 1;
            if *refs == 0 {
                self.address_refs.remove(a);
                self.desired.addresses.remove(a);
            }
        }
        for (sk, _, _) in &f.servers {
            before
                .servers
                .entry(*sk)
                .or_insert_with(|| self.desired.services.get(sk).cloned());
            if let Some(c) = self.contributors.get_mut(sk) {
                c.remove(key);
                if c.is_empty() {
                    self.contributors.remove(sk);
                }
            }
        }
    }

    /// A virtual server from its contributors: the first one's spec, every real server.
    fn rebuild_server(&self, sk: &ServiceKey) -> Option<VirtualServer> {
        let mut vs: Option<VirtualServer> = None;
        for c in self.contributors.get(sk)? {
            for (k, spec, real) in &self.fragments[c].servers {
                if k == sk {
                    vs.get_or_insert_with(|| VirtualServer {
                        spec: spec.clone(),
                        real_servers: BTreeSet::new(),
                    })
                    .real_servers
                    .extend(real.iter().copied());
                }
            }
        }
        vs
    }

    fn set_entries(&mut self, set: &'static str) -> &mut BTreeSet<String> {
        &mut self
            .desired
            .ipsets
            .get_mut(&set_name(set, self.family))
            .expect("every set is present")
            .entries
    }
}
