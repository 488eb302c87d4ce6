//! The NetworkPolicy part of a topology file: the namespaces' labels, each pod's namespace and
//! labels, the NetworkPolicy objects, and more outside addresses to probe from (pure).
//!
//! Policies are written as Kubernetes writes them (`networking.k8s.io/v1` objects, as `kubectl
//! apply` would take them), so what the lab enforces and what the oracle reads are the user's
//! objects, not a lab dialect. A lab whose topology has policies runs `weir policy` on every
//! node and writes Namespaces, Pods and the policies beside its other objects.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use weir_policy::k8s_openapi::api::networking::v1::NetworkPolicy;

/// The namespace of pods the topology gives none (and of the lab's Services).
pub const DEFAULT_NAMESPACE: &str = "default";

/// A pod's namespace and labels (`podMetadata.<pod>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct PodMeta {
    #[serde(default = "default_namespace")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

fn default_namespace() -> String {
    DEFAULT_NAMESPACE.into()
}

/// What [`validate`] reads: the topology's policy fields and its pod names.
pub struct Parts<'a> {
    pub namespaces: &'a BTreeMap<String, BTreeMap<String, String>>,
    pub pod_metadata: &'a BTreeMap<String, PodMeta>,
    pub policies: &'a [Value],
    pub outside_addresses: &'a [Ipv4Addr],
    pub pods: &'a BTreeSet<String>,
}

/// DNS-1123 label: what a namespace name must be.
fn dns1123_label(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// Checks the policy fields; an error is (field, message) as the topology reports it.
pub fn validate(p: &Parts) -> Result<(), (String, String)> {
    for name in p.namespaces.keys() {
        if !dns1123_label(name) {
            return Err((
                format!("namespaces.{name}"),
                "a namespace name must be a DNS-1123 label ([a-z0-9-], at most 63)".into(),
            ));
        }
    }
    let known = |ns: &str| ns == DEFAULT_NAMESPACE || p.namespaces.contains_key(ns);
    for (pod, meta) in p.pod_metadata {
        if !p.pods.contains(pod) {
            return Err((
                format!("podMetadata.{pod}"),
                format!("no pod named {pod:?}"),
            ));
        }
        if !known(&meta.namespace) {
            return Err((
                format!("podMetadata.{pod}.namespace"),
                format!("{:?} is not in namespaces", meta.namespace),
            ));
        }
    }
    let mut names = BTreeSet::new();
    for (i, value) in p.policies.iter().enumerate() {
        let field = |f: &str| format!("policies[{i}]{f}");
        if value.get("kind").and_then(Value::as_str) != Some("NetworkPolicy") {
            return Err((field(".kind"), "must be NetworkPolicy".into()));
        }
        let object = policy_objects(std::slice::from_ref(value)).remove(0);
        let policy: NetworkPolicy = serde_json::from_value(object)
            .map_err(|e| (field(""), format!("not a NetworkPolicy: {e}")))?;
        let (Some(name), Some(ns)) = (&policy.metadata.name, &policy.metadata.namespace) else {
            return Err((field(".metadata"), "needs a name and a namespace".into()));
        };
        if !known(ns) {
            return Err((
                field(".metadata.namespace"),
                format!("{ns:?} is not in namespaces"),
            ));
        }
        if !names.insert((ns.clone(), name.clone())) {
            return Err((
                field(".metadata.name"),
                format!("duplicate policy {ns}/{name}"),
            ));
        }
    }
    if !p.policies.is_empty() {
        let mut seen = BTreeSet::new();
        for (i, a) in p.outside_addresses.iter().enumerate() {
            if !seen.insert(a) {
                return Err((
                    format!("outsideAddresses[{i}]"),
                    format!("duplicate address {a}"),
                ));
            }
        }
    } else if !p.outside_addresses.is_empty() {
        return Err((
            "outsideAddresses".into(),
            "only a topology with policies probes from more outside addresses".into(),
        ));
    }
    Ok(())
}

/// The NetworkPolicy objects as the lab writes them: `apiVersion` filled in when left out.
pub fn policy_objects(policies: &[Value]) -> Vec<Value> {
    policies
        .iter()
        .map(|p| {
            let mut p = p.clone();
            if p.get("apiVersion").is_none() {
                p["apiVersion"] = "networking.k8s.io/v1".into();
            }
            p
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(
        namespaces: &[(&str, &[(&str, &str)])],
        meta: &[(&str, &str)],
        policies: Vec<Value>,
        outside: &[Ipv4Addr],
    ) -> Result<(), (String, String)> {
        let namespaces = namespaces
            .iter()
            .map(|(n, l)| {
                let labels = l.iter().map(|(k, v)| (k.to_string(), v.to_string()));
                (n.to_string(), labels.collect())
            })
            .collect();
        let pod_metadata = meta
            .iter()
            .map(|(pod, ns)| {
                let m = PodMeta {
                    namespace: ns.to_string(),
                    labels: BTreeMap::new(),
                };
                (pod.to_string(), m)
            })
            .collect();
        let pods = ["a1", "b1"].iter().map(|s| s.to_string()).collect();
        validate(&Parts {
            namespaces: &namespaces,
            pod_metadata: &pod_metadata,
            policies: &policies,
            outside_addresses: outside,
            pods: &pods,
        })
    }

    fn deny(ns: &str, name: &str) -> Value {
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
               "metadata": {"name": name, "namespace": ns}, "spec": {"podSelector": {}}})
    }

    #[test]
    fn accepts_a_consistent_policy_part() {
        let ok = check(
            &[("prod", &[("team", "prod")])],
            &[("a1", "prod"), ("b1", "default")],
            vec![deny("prod", "deny"), deny("default", "deny")],
            &[Ipv4Addr::new(198, 51, 100, 200)],
        );
        assert_eq!(ok, Ok(()));
    }

    #[test]
    fn errors_name_the_field() {
        let field = |r: Result<(), (String, String)>| r.unwrap_err().0;
        assert_eq!(
            field(check(&[("Prod", &[])], &[], vec![], &[])),
            "namespaces.Prod"
        );
        assert_eq!(
            field(check(&[], &[("c9", "default")], vec![], &[])),
            "podMetadata.c9"
        );
        assert_eq!(
            field(check(&[], &[("a1", "prod")], vec![], &[])),
            "podMetadata.a1.namespace"
        );
        assert_eq!(
            field(check(&[], &[], vec![deny("prod", "x")], &[])),
            "policies[0].metadata.namespace"
        );
        assert_eq!(
            field(check(
                &[],
                &[],
                vec![deny("default", "x"), deny("default", "x")],
                &[]
            )),
            "policies[1].metadata.name"
        );
        let not_a_policy = json!({"kind": "NetworkPolicy", "metadata": {"name": "x", "namespace": "default"},
                                  "spec": {"podSelector": 5}});
        assert_eq!(
            field(check(&[], &[], vec![not_a_policy], &[])),
            "policies[0]"
        );
        let no_version = json!({"kind": "NetworkPolicy",
                                "metadata": {"name": "x", "namespace": "default"},
                                "spec": {"podSelector": {}}});
        assert_eq!(check(&[], &[], vec![no_version], &[]), Ok(()));
        let service = json!({"kind": "Service", "metadata": {"name": "x", "namespace": "default"}});
        assert_eq!(
            field(check(&[], &[], vec![service], &[])),
            "policies[0].kind"
        );
        let a = Ipv4Addr::new(198, 51, 100, 9);
        assert_eq!(field(check(&[], &[], vec![], &[a])), "outsideAddresses");
        assert_eq!(
            field(check(&[], &[], vec![deny("default", "x")], &[a, a])),
            "outsideAddresses[1]"
        );
    }

    #[test]
    fn policy_objects_get_their_api_version() {
        let mut p = deny("default", "x");
        p.as_object_mut().unwrap().remove("apiVersion");
        assert_eq!(
            policy_objects(&[p])[0]["apiVersion"],
            "networking.k8s.io/v1"
        );
    }
}
