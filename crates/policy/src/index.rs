//! Pods indexed for selection, so a peer costs the pods it could match rather than all pods.

use std::collections::HashMap;

use crate::model::{Cluster, NamespaceScope, PodInfo, Selector};

/// The policy pods (live, not hostNetwork) of a cluster, by namespace and by label.
pub(crate) struct PodIndex<'a> {
    cluster: &'a Cluster,
    /// Sorted by key, so every list of positions below is sorted too.
    pub pods: Vec<&'a PodInfo>,
    by_namespace: HashMap<&'a str, Vec<u32>>,
    by_label: HashMap<(&'a str, &'a str), Vec<u32>>,
    /// Namespaces holding policy pods, sorted.
    namespaces: Vec<&'a str>,
    namespace_matches: HashMap<&'a Selector, Vec<&'a str>>,
}

impl<'a> PodIndex<'a> {
    pub fn new(cluster: &'a Cluster) -> PodIndex<'a> {
        let pods: Vec<&PodInfo> = cluster
            .pods
            .values()
            .map(|p| &**p)
            .filter(|p| p.is_policy_pod())
            .collect();
        let mut by_namespace: HashMap<&str, Vec<u32>> = HashMap::new();
        let mut by_label: HashMap<(&str, &str), Vec<u32>> = HashMap::new();
        let mut namespaces = Vec::new();
        for (i, pod) in pods.iter().enumerate() {
            let i = i as u32;
            let ns = &*pod.key.namespace;
            if namespaces.last() != Some(&ns) {
                namespaces.push(ns);
            }
            by_namespace.entry(ns).or_default().push(i);
            for (k, v) in &pod.labels {
                by_label.entry((&**k, &**v)).or_default().push(i);
            }
        }
        PodIndex {
            cluster,
            pods,
            by_namespace,
            by_label,
            namespaces,
            namespace_matches: HashMap::new(),
        }
    }

    /// Positions (into [`Self::pods`]) of the pods `selector` matches in the namespaces of
    /// `scope`, read from a policy in `own_namespace`; sorted.
    pub fn select(
        &mut self,
        own_namespace: &'a str,
        scope: &'a NamespaceScope,
        selector: &Selector,
    ) -> Vec<u32> {
        let namespaces: Vec<&str> = match scope {
            NamespaceScope::Own => vec![own_namespace],
            NamespaceScope::Matching(ns_selector) => self.matching_namespaces(ns_selector).to_vec(),
        };
        let in_namespaces: usize = namespaces
            .iter()
            .map(|ns| self.by_namespace.get(ns).map_or(0, Vec::len))
            .sum();
        // The shortest posting list among the labels the selector requires, if shorter.
        let narrowest = selector
            .required_pairs()
            .filter_map(|pair| self.by_label.get(&pair))
            .min_by_key(|list| list.len());
        let missing_pair = selector
            .required_pairs()
            .any(|pair| !self.by_label.contains_key(&pair));
        if missing_pair {
            return Vec::new();
        }
        let matches = |i: &u32| selector.matches(&self.pods[*i as usize].labels);
        match narrowest {
            Some(list) if list.len() < in_namespaces => {
                let in_scope = |i: &u32| {
                    let ns = &*self.pods[*i as usize].key.namespace;
                    namespaces.binary_search(&ns).is_ok()
                };
                list.iter()
                    .copied()
                    .filter(|i| in_scope(i) && matches(i))
                    .collect()
            }
            _ => {
                // Namespaces are sorted and pods sorted by namespace first: the concatenation
                // is sorted.
                let lists = namespaces.iter().filter_map(|ns| self.by_namespace.get(ns));
                lists.flatten().copied().filter(|i| matches(i)).collect()
            }
        }
    }

    fn matching_namespaces(&mut self, selector: &'a Selector) -> &[&'a str] {
        let (cluster, namespaces) = (self.cluster, &self.namespaces);
        self.namespace_matches.entry(selector).or_insert_with(|| {
            namespaces
                .iter()
                .copied()
                .filter(|ns| selector.matches(&cluster.namespace_labels(ns)))
                .collect()
        })
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
        let mut index = PodIndex::new(&cluster);
        for own in ["ns0", "ns4", "elsewhere"] {
            for scope in &scopes {
                for selector in &selectors {
                    let got: Vec<&ObjectKey> = index
                        .select(own, scope, selector)
                        .into_iter()
                        .map(|i| &index.pods[i as usize].key)
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
