//! The one store as each part's loop reads it: a change feed of the part's own kinds (so a
//! Pod churn never wakes the proxy, nor a Service the policy enforcer), the source's health,
//! and the objects.

use std::sync::Arc;
use std::time::Duration;

use weir_dns::agent::ZoneView;
use weir_model::{Kind, Object, ObjectKey, Snapshot};
use weir_policy::agent::{Change, Changes as PolicyChanges, PolicySource};
use weir_proxy::agent::ObjectSource;
use weir_proxy::health::SourceCheck;
use weir_routes::agent::NodeView;
use weir_source::{Changes, FeedId, SharedStore};

use super::source::SourceHealth;

/// The kinds each part reads.
pub const PROXY_KINDS: [Kind; 3] = [Kind::Service, Kind::EndpointSlice, Kind::Node];
pub const ROUTES_KINDS: [Kind; 1] = [Kind::Node];
pub const POLICY_KINDS: [Kind; 3] = [Kind::Namespace, Kind::Pod, Kind::NetworkPolicy];

/// A part's window on the store.
pub struct View {
    store: SharedStore,
    feed: FeedId,
    health: SourceHealth,
}

impl View {
    /// Opens a change feed of `kinds` on `store`.
    pub fn new(store: &SharedStore, kinds: &[Kind], health: SourceHealth) -> Self {
        View {
            store: store.clone(),
            feed: store.feed(kinds),
            health,
        }
    }
}

impl ObjectSource for View {
    fn ready(&self) -> bool {
        self.health.ready()
    }

    fn check(&self) -> Result<(), String> {
        self.health.check()
    }

    fn health_check(&self) -> SourceCheck {
        let health = self.health.clone();
        Box::new(move || health.check())
    }

    fn wait_newer(&self, seen: u64, timeout: Duration) -> u64 {
        self.store.wait_feed(self.feed, seen, timeout)
    }

    fn take_changes(&self) -> Changes {
        self.store.take(self.feed)
    }

    fn get(&self, key: &ObjectKey) -> Option<Object> {
        self.store.get(key)
    }
}

impl PolicySource for View {
    fn ready(&self) -> bool {
        self.health.ready()
    }

    fn check(&self) -> Result<(), String> {
        self.health.check()
    }

    fn wait_newer(&self, seen: u64, timeout: Duration) -> u64 {
        self.store.wait_feed(self.feed, seen, timeout)
    }

    fn take_changes(&self) -> PolicyChanges {
        let c = self.store.take(self.feed);
        PolicyChanges {
            generation: c.generation,
            changes: c
                .objects
                .into_iter()
                .filter_map(|(k, o)| policy_change(&k, o))
                .collect(),
            since: c.since,
        }
    }
}

impl ZoneView for View {
    fn snapshot(&self) -> (u64, Arc<Snapshot>) {
        self.store.feed_snapshot(self.feed)
    }

    fn wait_newer(&self, seen: u64, timeout: Duration) -> Option<(u64, Arc<Snapshot>)> {
        let now = self.store.wait_feed(self.feed, seen, timeout);
        (now > seen).then(|| self.store.feed_snapshot(self.feed))
    }
}

impl NodeView for View {
    fn snapshot(&self) -> (u64, Snapshot) {
        let (generation, shared) = self.store.feed_snapshot(self.feed);
        (generation, Snapshot::clone(&shared))
    }

    fn wait_newer(&self, seen: u64, timeout: Duration) -> Option<u64> {
        let now = self.store.wait_feed(self.feed, seen, timeout);
        (now > seen).then_some(now)
    }
}

/// A store change as the policy loop reads it; other kinds are not its business.
pub fn policy_change(key: &ObjectKey, object: Option<Object>) -> Option<Change> {
    let policy_key = || weir_policy::ObjectKey::new(&key.namespace, &key.name);
    match key.kind {
        Kind::Namespace => Some(Change::Namespace {
            name: key.name.as_str().into(),
            now: match object {
                Some(Object::Namespace(ns)) => Some(ns),
                _ => None,
            },
        }),
        Kind::Pod => Some(Change::Pod {
            key: policy_key(),
            now: match object {
                Some(Object::Pod(p)) => p.policy.clone(),
                _ => None,
            },
        }),
        Kind::NetworkPolicy => Some(Change::Policy {
            key: policy_key(),
            now: match object {
                Some(Object::NetworkPolicy(p)) => Some(p),
                _ => None,
            },
        }),
        Kind::Service | Kind::EndpointSlice | Kind::Node => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// Namespaces, Pods (their policy part) and NetworkPolicies become the policy loop's
    /// changes, deletions too; other kinds are left out.
    #[test]
    fn store_changes_become_the_policy_loops() {
        let opts = weir_source::ParseOptions {
            policy: true,
            ..Default::default()
        };
        let parsed = weir_source::parse_manifest_with(
            Path::new("t.yaml"),
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n---\n\
             apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: shop, labels: {app: x}}\n\
             spec: {nodeName: n1, containers: [{name: c}]}\nstatus: {podIP: 10.0.0.1}\n---\n\
             apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: d, namespace: shop}\n\
             spec: {podSelector: {}}\n---\n\
             apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n",
            &opts,
        );
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let changes: Vec<Change> = parsed
            .objects
            .into_iter()
            .filter_map(|o| policy_change(&o.key(), Some(o)))
            .collect();
        assert_eq!(changes.len(), 3);
        assert!(
            matches!(&changes[0], Change::Namespace { name, now: Some(_) } if &**name == "shop")
        );
        assert!(matches!(&changes[1], Change::Pod { key, now: Some(p) }
            if key.to_string() == "shop/p" && p.value.labels.len() == 1));
        assert!(matches!(&changes[2], Change::Policy { now: Some(_), .. }));
        let gone = ObjectKey::new(Kind::NetworkPolicy, "shop", "d");
        assert!(matches!(
            policy_change(&gone, None),
            Some(Change::Policy { now: None, .. })
        ));
    }
}
