//! The fake API server's storage: objects with resourceVersions, the change history watches
//! replay, compaction (watches from before it get `410 Gone`), and consistent paged lists.
//! Pure: the HTTP side is in `server`.
//!
//! Like the real API server's watch cache, each object is encoded once, when it is applied
//! (as a list item and as a watch event object), and lists and watch streams are built by
//! concatenating those bytes: serving a list of N objects is N copies, not N serializations.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use hyper::body::Bytes;
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{json, Map, Value};

use crate::selector::{FieldSelector, LabelSelector};

/// The collections the fake serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    Services,
    EndpointSlices,
    Nodes,
    Pods,
    Namespaces,
    NetworkPolicies,
}

impl Resource {
    pub const ALL: [Resource; 6] = [
        Resource::Services,
        Resource::EndpointSlices,
        Resource::Nodes,
        Resource::Pods,
        Resource::Namespaces,
        Resource::NetworkPolicies,
    ];

    pub fn kind(self) -> &'static str {
        match self {
            Resource::Services => "Service",
            Resource::EndpointSlices => "EndpointSlice",
            Resource::Nodes => "Node",
            Resource::Pods => "Pod",
            Resource::Namespaces => "Namespace",
            Resource::NetworkPolicies => "NetworkPolicy",
        }
    }

    pub fn api_version(self) -> &'static str {
        match self {
            Resource::EndpointSlices => "discovery.k8s.io/v1",
            Resource::NetworkPolicies => "networking.k8s.io/v1",
            _ => "v1",
        }
    }

    pub fn namespaced(self) -> bool {
        !matches!(self, Resource::Nodes | Resource::Namespaces)
    }

    /// The collection's URL path (cluster-wide, or in `namespace`).
    pub fn path(self, namespace: Option<&str>) -> String {
        let prefix = match self {
            Resource::EndpointSlices => "/apis/discovery.k8s.io/v1",
            Resource::NetworkPolicies => "/apis/networking.k8s.io/v1",
            _ => "/api/v1",
        };
        let plural = match self {
            Resource::Services => "services",
            Resource::EndpointSlices => "endpointslices",
            Resource::Nodes => "nodes",
            Resource::Pods => "pods",
            Resource::Namespaces => "namespaces",
            Resource::NetworkPolicies => "networkpolicies",
        };
        match namespace {
            Some(ns) => format!("{prefix}/namespaces/{ns}/{plural}"),
            None => format!("{prefix}/{plural}"),
        }
    }

    pub fn from_kind(kind: &str) -> Option<Resource> {
        Resource::ALL.into_iter().find(|r| r.kind() == kind)
    }
}

/// A `Status` object as the API server sends for errors.
#[derive(Debug, Clone, PartialEq)]
pub struct Status {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

impl Status {
    pub fn to_json(&self) -> Value {
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        })
    }

    pub fn gone(message: impl Into<String>) -> Status {
        Status {
            code: 410,
            reason: "Expired",
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Status {
        Status {
            code: 400,
            reason: "BadRequest",
            message: message.into(),
        }
    }
}

/// What a list or watch asks for.
#[derive(Debug, Clone, Default)]
pub struct Query {
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
}

impl Query {
    fn matches(&self, object: &Value) -> bool {
        let ns_ok = self.namespace.as_deref().is_none_or(|ns| {
            object
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                == Some(ns)
        });
        ns_ok && self.labels.matches(object) && self.fields.matches(object)
    }
}

/// An object as stored: its value (what selectors, `get` and patches read) and its encodings,
/// made once when it is stored and shared by every list page and watch event that carries it.
#[derive(Debug)]
struct Stored {
    value: Value,
    /// The JSON of a list item: without kind and apiVersion, as the real API server lists.
    item: Bytes,
    /// The JSON of a watch event's object: with kind and apiVersion.
    typed: Bytes,
}

/// One change: the object before (none when created) and after (none when deleted). A
/// deletion's `old` carries the resourceVersion of the deletion, as its DELETED event does.
#[derive(Debug, Clone)]
struct Change {
    rv: u64,
    resource: Resource,
    old: Option<Arc<Stored>>,
    new: Option<Arc<Stored>>,
}

type Key = (Resource, String, String);

/// A watch event: its type (`ADDED`, `MODIFIED`, `DELETED`) and the object's JSON.
pub type WatchEvent = (&'static str, Bytes);

#[derive(Debug, Default)]
pub struct State {
    rv: u64,
    uid: u64,
    objects: BTreeMap<Key, Arc<Stored>>,
    history: Vec<Change>,
    /// Watches from a resourceVersion older than this get 410 Gone.
    compacted: u64,
    /// Paged lists in progress: a token's snapshot (its resourceVersion and its items' JSON),
    /// shared so that serving a page copies that page's bytes only.
    pages: HashMap<u64, (u64, Arc<Vec<Bytes>>)>,
    next_page: u64,
    /// Object serializations made so far (two per stored object): lists and watches must not
    /// add to it.
    encodings: u64,
}

fn key_of(resource: Resource, object: &Value) -> Result<Key, String> {
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or("object without metadata.name")?;
    let ns = if resource.namespaced() {
        object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("default")
    } else {
        ""
    };
    Ok((resource, ns.to_string(), name.to_string()))
}

/// An object map serialized without its kind and apiVersion (a list item), without copying it.
struct Untyped<'a>(&'a Map<String, Value>);

impl Serialize for Untyped<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let fields = self
            .0
            .iter()
            .filter(|(k, _)| *k != "kind" && *k != "apiVersion");
        let mut map = s.serialize_map(None)?;
        for (k, v) in fields {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl State {
    /// Encodes an object (with its kind and apiVersion set) for storing.
    fn store(&mut self, value: Value) -> Arc<Stored> {
        let typed = serde_json::to_vec(&value).expect("a JSON value serializes");
        let item = match value.as_object() {
            Some(m) => serde_json::to_vec(&Untyped(m)).expect("a JSON map serializes"),
            None => typed.clone(),
        };
        self.encodings += 2;
        Arc::new(Stored {
            value,
            item: Bytes::from(item),
            typed: Bytes::from(typed),
        })
    }

    /// How many object serializations the state has made: two per object stored, none for
    /// serving lists and watches (they reuse the stored bytes).
    pub fn encodings(&self) -> u64 {
        self.encodings
    }

    /// One object as stored (with its kind and apiVersion).
    pub fn get(&self, resource: Resource, namespace: &str, name: &str) -> Option<Value> {
        let ns = if resource.namespaced() { namespace } else { "" };
        self.objects
            .get(&(resource, ns.to_string(), name.to_string()))
            .map(|s| s.value.clone())
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// Creates or replaces an object (its `kind` says which collection); returns its new
    /// resourceVersion.
    pub fn apply(&mut self, mut object: Value) -> Result<u64, String> {
        let kind = object
            .get("kind")
            .and_then(Value::as_str)
            .ok_or("object without kind")?;
        let resource = Resource::from_kind(kind).ok_or(format!("kind {kind} is not served"))?;
        let key = key_of(resource, &object)?;
        self.rv += 1;
        let old = self.objects.get(&key).cloned();
        let meta = object
            .get_mut("metadata")
            .and_then(Value::as_object_mut)
            .ok_or("object without metadata")?;
        if resource.namespaced() {
            meta.insert("namespace".into(), key.1.clone().into());
        }
        meta.insert("resourceVersion".into(), self.rv.to_string().into());
        let uid = match old.as_ref().and_then(|o| o.value.pointer("/metadata/uid")) {
            Some(u) => u.clone(),
            None => {
                self.uid += 1;
                format!("00000000-0000-4000-8000-{:012}", self.uid).into()
            }
        };
        meta.insert("uid".into(), uid);
        meta.entry("creationTimestamp")
            .or_insert_with(|| "2026-01-01T00:00:00Z".into());
        object["apiVersion"] = resource.api_version().into();
        let new = self.store(object);
        self.objects.insert(key, Arc::clone(&new));
        self.history.push(Change {
            rv: self.rv,
            resource,
            old,
            new: Some(new),
        });
        Ok(self.rv)
    }

    /// Deletes an object; its resourceVersion of deletion, or `None` if there was none.
    pub fn delete(&mut self, resource: Resource, namespace: &str, name: &str) -> Option<u64> {
        let ns = if resource.namespaced() { namespace } else { "" };
        let old = self
            .objects
            .remove(&(resource, ns.to_string(), name.to_string()))?;
        self.rv += 1;
        let mut last = old.value.clone();
        last["metadata"]["resourceVersion"] = self.rv.to_string().into();
        let old = self.store(last);
        self.history.push(Change {
            rv: self.rv,
            resource,
            old: Some(old),
            new: None,
        });
        Some(self.rv)
    }

    /// Forgets the history up to now (etcd compaction): a watch that resumes from an older
    /// resourceVersion gets 410 Gone and must list again.
    pub fn compact(&mut self) {
        self.compacted = self.rv;
        self.history.clear();
    }

    /// Drops every paged list in progress: their continue tokens get 410 Gone.
    pub fn expire_continue_tokens(&mut self) {
        self.pages.clear();
    }

    /// The current objects of `resource` that `q` selects, in key order.
    fn selected<'a>(
        &'a self,
        resource: Resource,
        q: &'a Query,
    ) -> impl Iterator<Item = &'a Arc<Stored>> + 'a {
        self.objects
            .range((resource, String::new(), String::new())..)
            .take_while(move |((r, _, _), _)| *r == resource)
            .map(|(_, o)| o)
            .filter(|o| q.matches(&o.value))
    }

    /// A list response (`<Kind>List` JSON), paged when `limit` is set: the stored item
    /// encodings joined, nothing serialized again.
    pub fn list(&mut self, resource: Resource, q: &Query) -> Result<Bytes, Status> {
        let (rv, items, offset, page) = match &q.continue_token {
            Some(token) => {
                let (id, offset) = token
                    .split_once(':')
                    .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<usize>().ok()?)))
                    .ok_or_else(|| Status::bad_request(format!("invalid continue {token:?}")))?;
                let (rv, items) = self.pages.get(&id).cloned().ok_or_else(|| {
                    Status::gone("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.")
                })?;
                (rv, items, offset, Some(id))
            }
            None => {
                let items: Vec<Bytes> =
                    self.selected(resource, q).map(|o| o.item.clone()).collect();
                (self.rv, Arc::new(items), 0, None)
            }
        };
        let end = q
            .limit
            .filter(|l| *l > 0)
            .map_or(items.len(), |l| (offset + l).min(items.len()));
        let page_items = &items[offset.min(items.len())..end];
        let mut metadata = json!({ "resourceVersion": rv.to_string() });
        if end < items.len() {
            let id = page.unwrap_or_else(|| {
                self.next_page += 1;
                self.pages.insert(self.next_page, (rv, Arc::clone(&items)));
                self.next_page
            });
            metadata["continue"] = format!("{id}:{end}").into();
            metadata["remainingItemCount"] = (items.len() - end).into();
        } else if let Some(id) = page {
            self.pages.remove(&id);
        }
        let head = json!({
            "kind": format!("{}List", resource.kind()),
            "apiVersion": resource.api_version(),
            "metadata": metadata,
        })
        .to_string();
        let head = head.strip_suffix('}').expect("a JSON object ends with }");
        let size = head.len() + 16 + page_items.iter().map(|i| i.len() + 1).sum::<usize>();
        let mut body = Vec::with_capacity(size);
        body.extend_from_slice(head.as_bytes());
        body.extend_from_slice(b",\"items\":[");
        for (i, item) in page_items.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(item);
        }
        body.extend_from_slice(b"]}");
        Ok(Bytes::from(body))
    }

    /// The watch events (type, object) after `from` for `q`, and the resourceVersion they
    /// bring the watcher to; 410 Gone when `from` is older than the compacted history.
    /// An object that stops (starts) matching the selectors is DELETED (ADDED), as the API
    /// server does.
    pub fn events_since(
        &self,
        resource: Resource,
        q: &Query,
        from: u64,
    ) -> Result<(Vec<WatchEvent>, u64), Status> {
        if from < self.compacted {
            return Err(Status::gone(format!(
                "too old resource version: {from} ({})",
                self.compacted
            )));
        }
        let mut out = Vec::new();
        for c in self
            .history
            .iter()
            .filter(|c| c.rv > from && c.resource == resource)
        {
            let was = c.old.as_ref().filter(|o| q.matches(&o.value));
            let is = c.new.as_ref().filter(|o| q.matches(&o.value));
            let event = match (was, is) {
                (None, Some(n)) => ("ADDED", n),
                (Some(_), Some(n)) => ("MODIFIED", n),
                // Stopped matching: the object as it is now; deleted: as it was, with the
                // deletion's resourceVersion (stored so at delete).
                (Some(o), None) => ("DELETED", c.new.as_ref().unwrap_or(o)),
                (None, None) => continue,
            };
            out.push((event.0, event.1.typed.clone()));
        }
        Ok((out, self.rv))
    }

    /// Every current object of `q` as ADDED events (a watch from resourceVersion "0" or "").
    pub fn current_as_added(&self, resource: Resource, q: &Query) -> Vec<WatchEvent> {
        self.selected(resource, q)
            .map(|o| ("ADDED", o.typed.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str, ip: &str) -> Value {
        json!({"kind": "Service", "apiVersion": "v1",
               "metadata": {"name": name, "namespace": "ns"},
               "spec": {"clusterIP": ip}})
    }

    #[test]
    fn paged_lists_are_consistent_and_expire_with_410() {
        let mut s = State::default();
        for i in 0..5 {
            s.apply(svc(&format!("s{i}"), "10.96.0.1")).unwrap();
        }
        let q = |limit, cont: Option<&str>| Query {
            limit: Some(limit),
            continue_token: cont.map(str::to_string),
            ..Query::default()
        };
        let first = list_page(&mut s, &q(2, None));
        assert_eq!(first["items"].as_array().unwrap().len(), 2);
        assert!(first["items"][0].get("kind").is_none());
        assert_eq!(first["metadata"]["resourceVersion"], "5");
        let token = first["metadata"]["continue"].as_str().unwrap().to_string();
        // A change after the first page does not show in later pages.
        s.delete(Resource::Services, "ns", "s4");
        let second = list_page(&mut s, &q(10, Some(&token)));
        assert_eq!(second["items"].as_array().unwrap().len(), 3);
        assert_eq!(second["metadata"]["resourceVersion"], "5");
        assert!(second["metadata"].get("continue").is_none());

        let first = list_page(&mut s, &q(2, None));
        let token = first["metadata"]["continue"].as_str().unwrap().to_string();
        s.expire_continue_tokens();
        let gone = s.list(Resource::Services, &q(2, Some(&token))).unwrap_err();
        assert_eq!((gone.code, gone.reason), (410, "Expired"));
    }

    fn list_page(s: &mut State, q: &Query) -> Value {
        serde_json::from_slice(&s.list(Resource::Services, q).unwrap()).unwrap()
    }

    fn objects(events: &[WatchEvent]) -> Vec<Value> {
        events
            .iter()
            .map(|(_, o)| serde_json::from_slice(o).unwrap())
            .collect()
    }

    /// A list of N objects costs N encodings at apply and none after, whatever the page size.
    #[test]
    fn lists_and_watches_reuse_the_encodings_made_at_apply() {
        let mut s = State::default();
        let n = 1000;
        for i in 0..n {
            s.apply(svc(&format!("s{i:04}"), "10.96.0.1")).unwrap();
        }
        let at_apply = s.encodings();
        assert!(
            at_apply <= 2 * n as u64,
            "{at_apply} encodings for {n} objects"
        );
        for limit in [1, 7, 500, 0] {
            let mut names = Vec::new();
            let mut token = None;
            loop {
                let q = Query {
                    limit: Some(limit),
                    continue_token: token.take(),
                    ..Query::default()
                };
                let page = list_page(&mut s, &q);
                for item in page["items"].as_array().unwrap() {
                    names.push(item["metadata"]["name"].as_str().unwrap().to_string());
                }
                match page["metadata"]["continue"].as_str() {
                    Some(t) => token = Some(t.to_string()),
                    None => break,
                }
            }
            let expected: Vec<String> = (0..n).map(|i| format!("s{i:04}")).collect();
            assert_eq!(names, expected, "pages of {limit}");
            assert_eq!(
                s.encodings() - at_apply,
                0,
                "listing by pages of {limit} encoded objects again"
            );
        }
        let q = Query::default();
        assert_eq!(s.current_as_added(Resource::Services, &q).len(), n);
        assert_eq!(
            s.events_since(Resource::Services, &q, 0).unwrap().0.len(),
            n
        );
        assert_eq!(
            s.encodings(),
            at_apply,
            "watch events encoded objects again"
        );
    }

    #[test]
    fn watch_replays_history_applies_selectors_and_expires_after_compaction() {
        let mut s = State::default();
        s.apply(svc("a", "10.96.0.1")).unwrap();
        s.apply(svc("h", "None")).unwrap();
        let q = Query {
            fields: FieldSelector::parse("spec.clusterIP!=None").unwrap(),
            ..Query::default()
        };
        let (ev, rv) = s.events_since(Resource::Services, &q, 0).unwrap();
        assert_eq!(rv, 2);
        assert_eq!(ev.len(), 1, "the headless one is filtered: {ev:?}");
        assert_eq!(ev[0].0, "ADDED");
        assert_eq!(objects(&ev)[0]["kind"], "Service");
        s.apply(svc("a", "None")).unwrap();
        s.apply(svc("h", "10.96.0.8")).unwrap();
        s.delete(Resource::Services, "ns", "h");
        let (ev, _) = s.events_since(Resource::Services, &q, 2).unwrap();
        let types: Vec<&str> = ev.iter().map(|e| e.0).collect();
        assert_eq!(types, ["DELETED", "ADDED", "DELETED"]);
        assert_eq!(objects(&ev)[2]["metadata"]["resourceVersion"], "5");
        s.compact();
        let gone = s.events_since(Resource::Services, &q, 2).unwrap_err();
        assert_eq!(gone.code, 410);
        assert!(s.events_since(Resource::Services, &q, 5).is_ok());
    }
}
