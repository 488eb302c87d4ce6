//! Pods indexed for selection, so a peer costs the pods it could match rather than all pods.
//! Kept between plans and moved by each pod change ([`PodIndex::insert`], [`PodIndex::remove`]):
//! building it for 10,000 pods was most of a change's planning time.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use crate::key::ObjectKey;
use crate::model::{Cluster, NamespaceScope, PodInfo, Selector};

/// The policy pods (live, not hostNetwork) of a cluster, by namespace and by label.
#[derive(Default)]
pub(crate) struct PodIndex {
    pods: BTreeMap<ObjectKey, Arc<PodInfo>>,
    /// Namespaces holding policy pods (sorted) and their pods.
    by_namespace: BTreeMap<Arc<str>, BTreeSet<ObjectKey>>,
    /// label key → value → pods.
    by_label: HashMap<Box<str>, HashMap<Box<str>, BTreeSet<ObjectKey>>>,
}

impl PodIndex {
    pub fn new(cluster: &Cluster) -> PodIndex {
        let mut index = PodIndex::default();
        for pod in cluster.pods.values() {
            index.insert(pod);
        }
        index
    }

    /// Every policy pod.
    pub fn pods(&self) -> impl Iterator<Item = &PodInfo> + '_ {
        self.pods.values().map(|p| &**p)
    }

    /// Namespaces holding policy pods, sorted.
    pub fn namespaces(&self) -> impl Iterator<Item = &Arc<str>> + '_ {
        self.by_namespace.keys()
    }

    /// Adds `pod` if it is a policy pod (replace: [`Self::remove`] the old one first);
    /// whether its namespace is new to the index.
    pub fn insert(&mut self, pod: &Arc<PodInfo>) -> bool {
        if !pod.is_policy_pod() {
            return false;
        }
        let key = &pod.key;
        self.pods.insert(key.clone(), pod.clone());
        let in_namespace = self.by_namespace.entry(key.namespace.clone()).or_default();
        let new_namespace = in_namespace.is_empty();
        in_namespace.insert(key.clone());
        for (k, v) in &pod.labels {
            let values = self.by_label.entry(k.clone()).or_default();
            values.entry(v.clone()).or_default().insert(key.clone());
        }
        new_namespace
    }

    /// Removes the pod `key` names, if indexed; whether its namespace left the index
    /// with it.
    pub fn remove(&mut self, key: &ObjectKey) -> bool {
        let Some(pod) = self.pods.remove(key) else {
            return false;
        };
        let mut namespace_gone = false;
        if let Some(set) = self.by_namespace.get_mut(&key.namespace) {
            set.remove(key);
            if set.is_empty() {
                self.by_namespace.remove(&key.namespace);
                namespace_gone = true;
            }
        }
        for (k, v) in &pod.labels {
            let Some(values) = self.by_label.get_mut(&**k) else {
                continue;
            };
            if let Some(set) = values.get_mut(&**v) {
                set.remove(key);
                if set.is_empty() {
                    values.remove(&**v);
                }
            }
            if values.is_empty() {
                self.by_label.remove(&**k);
            }
        }
        namespace_gone
    }

    /// The pods `selector` matches in `namespaces` (sorted), in key order.
    pub fn select(&self, namespaces: &[&str], selector: &Selector) -> Vec<&PodInfo> {
        let in_namespaces: usize = namespaces
            .iter()
            .map(|ns| self.by_namespace.get(*ns).map_or(0, BTreeSet::len))
            .sum();
        let mut narrowest: Option<&BTreeSet<ObjectKey>> = None;
        for (k, v) in selector.required_pairs() {
            let Some(list) = self.by_label.get(k).and_then(|values| values.get(v)) else {
                return Vec::new(); // a required label no pod has
            };
            if narrowest.is_none_or(|n| list.len() < n.len()) {
                narrowest = Some(list);
            }
        }
        let pod = |key: &ObjectKey| &*self.pods[key];
        match narrowest {
            Some(list) if list.len() < in_namespaces => list
                .iter()
                .filter(|k| namespaces.binary_search(&&*k.namespace).is_ok())
                .map(pod)
                .filter(|p| selector.matches(&p.labels))
                .collect(),
            _ => namespaces
                .iter()
                .filter_map(|ns| self.by_namespace.get(*ns))
                .flatten()
                .map(pod)
                .filter(|p| selector.matches(&p.labels))
                .collect(),
        }
    }

    /// The namespaces holding policy pods that `selector` matches, sorted.
    pub fn matching_namespaces(&self, cluster: &Cluster, selector: &Selector) -> Vec<Arc<str>> {
        self.namespaces()
            .filter(|ns| selector.matches(&cluster.namespace_labels(ns)))
            .cloned()
            .collect()
    }
}

/// Whether `scope`, read from a policy in `own_namespace`, covers `namespace`.
pub(crate) fn in_scope(
    cluster: &Cluster,
    own_namespace: &str,
    scope: &NamespaceScope,
    namespace: &str,
) -> bool {
    match scope {
        NamespaceScope::Own => own_namespace == namespace,
        NamespaceScope::Matching(s) => s.matches(&cluster.namespace_labels(namespace)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::ObjectKey;
    use crate::model::{Labels, NamespaceInfo, Requirement};

    /// Both ways of selecting (by namespace, by the narrowest label) give the naive answer.
    #[test]
    fn selection_equals_a_scan_of_every_pod() {
        let mut cluster = Cluster::default();
        let values = ["a", "b", "c", "d"];
        for n in 0..5 {
            let ns = format!("ns{n}");
            let labels = Labels::from([("team".into(), values[n % 2].into())]);
            cluster.insert_namespace(NamespaceInfo::new(&ns, labels));
            for i in 0..(10 + 40 * n) {
                let mut labels = Labels::new();
                labels.insert("app".into(), values[i % 4].into());
                if i % 7 == 0 {
                    labels.insert("rare".into(), values[n % 4].into());
                }
                cluster.insert_pod(PodInfo {
                    key: ObjectKey::new(&ns, &format!("p{i}")),
                    labels,
                    node: Some("n".into()),
                    ips: vec![format!("10.{n}.{}.{}", i / 200, i % 200).parse().unwrap()],
                    host_network: i % 13 == 5,
                    terminated: false,
                    named_ports: Default::default(),
                });
            }
        }
        let pair = |k: &str, v: &str| Requirement::In(k.into(), vec![v.into()]);
        let selectors = [
            Selector::everything(),
            Selector {
                requirements: vec![pair("app", "a")],
            },
            Selector {
                requirements: vec![pair("rare", "b")],
            },
            Selector {
                requirements: vec![pair("app", "b"), pair("rare", "b")],
            },
            Selector {
                requirements: vec![pair("rare", "zzz")],
            },
            Selector {
                requirements: vec![Requirement::Exists("rare".into())],
            },
        ];
        let scopes = [
            NamespaceScope::Own,
            NamespaceScope::Matching(Selector::everything()),
            NamespaceScope::Matching(Selector {
                requirements: vec![pair("team", "b")],
            }),
        ];
        let index = PodIndex::new(&cluster);
        for own in ["ns0", "ns4", "elsewhere"] {
            for scope in &scopes {
                for selector in &selectors {
                    let namespaces: Vec<Arc<str>> = match scope {
                        NamespaceScope::Own => vec![own.into()],
                        NamespaceScope::Matching(s) => index.matching_namespaces(&cluster, s),
                    };
                    let namespaces: Vec<&str> = namespaces.iter().map(|n| &**n).collect();
                    let got: Vec<&ObjectKey> = index
                        .select(&namespaces, selector)
                        .into_iter()
                        .map(|p| &p.key)
                        .collect();
                    let want: Vec<&ObjectKey> = cluster
                        .pods
                        .values()
                        .filter(|p| p.is_policy_pod() && selector.matches(&p.labels))
                        .filter(|p| match scope {
                            NamespaceScope::Own => *p.key.namespace == *own,
                            NamespaceScope::Matching(s) => {
                                s.matches(&cluster.namespace_labels(&p.key.namespace))
                            }
                        })
                        .map(|p| &p.key)
                        .collect();
                    assert_eq!(got, want, "{own} {scope:?} {selector:?}");
                }
            }
        }
    }
}
