//! HTTP/1.1 serving: routes, list and watch responses (chunked JSON lines), and the faults
//! a test turns on.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame};
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

use crate::selector::{FieldSelector, LabelSelector};
use crate::state::{Query, Resource, State, Status, WatchEvent};

/// Faults and pacing a test sets.
#[derive(Debug, Clone)]
pub struct Faults {
    /// List requests wait until this is false again.
    pub hold_lists: bool,
    /// Every list response is delayed this long.
    pub list_delay: Duration,
    /// New watches get their headers and then nothing, not even bookmarks.
    pub hang_watches: bool,
    /// How often open watches that asked for bookmarks get one.
    pub bookmark_interval: Duration,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            hold_lists: false,
            list_delay: Duration::ZERO,
            hang_watches: false,
            bookmark_interval: Duration::from_secs(1),
        }
    }
}

/// Which Kubernetes release the fake behaves as, where releases differ for weir's clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Emulate {
    /// Today's API server: EndpointSlices `discovery.k8s.io/v1` only (v1beta1 went in 1.25),
    /// every field selector weir sends.
    #[default]
    Current,
    /// kube-apiserver 1.20 as found by pointing weir at a real one: EndpointSlices
    /// `discovery.k8s.io/v1beta1` only (`v1` is 404; endpoints carry `topology` instead of
    /// `nodeName`/`zone`, no `hints`), and a Service list refuses any field selector but
    /// `metadata.name`/`metadata.namespace` with 400.
    Kube1_20,
}

pub type Body = UnsyncBoxBody<Bytes, std::io::Error>;

/// What connections share.
pub struct Shared {
    pub state: Mutex<State>,
    /// Bumped (to the new resourceVersion) on every change.
    pub changed: watch::Sender<u64>,
    pub faults: watch::Sender<Faults>,
    /// Bumped to drop every open connection at once (a dropped network, a restart).
    pub kill: watch::Sender<u64>,
    /// Every request served: `GET <path>?<query>`.
    pub requests: Mutex<Vec<String>>,
    pub emulate: Mutex<Emulate>,
}

impl Shared {
    pub fn new() -> Self {
        Shared {
            state: Mutex::new(State::default()),
            changed: watch::channel(0).0,
            faults: watch::channel(Faults::default()).0,
            kill: watch::channel(0).0,
            requests: Mutex::new(Vec::new()),
            emulate: Mutex::new(Emulate::default()),
        }
    }

    pub fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Default for Shared {
    fn default() -> Self {
        Self::new()
    }
}

fn full(status: StatusCode, body: Value) -> Response<Body> {
    json_bytes(status, Bytes::from(body.to_string()))
}

fn json_bytes(status: StatusCode, body: Bytes) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(
            Full::new(body)
                .map_err(|e: Infallible| match e {})
                .boxed_unsync(),
        )
        .expect("valid response")
}

fn status_response(s: &Status) -> Response<Body> {
    full(
        StatusCode::from_u16(s.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        s.to_json(),
    )
}

/// `%XX` and `+` decoding of a query component.
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn params(query: Option<&str>) -> Vec<(String, String)> {
    query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// The collection and namespace a path names.
fn route(path: &str) -> Option<(Resource, Option<String>)> {
    for r in Resource::ALL {
        if path == r.path(None) {
            return Some((r, None));
        }
        if r.namespaced() {
            let prefix = r.path(Some("\u{0}"));
            let (head, tail) = prefix.split_once('\u{0}')?;
            if let Some(ns) = path.strip_prefix(head).and_then(|p| p.strip_suffix(tail)) {
                if !ns.is_empty() && !ns.contains('/') {
                    return Some((r, Some(ns.to_string())));
                }
            }
        }
    }
    None
}

fn version(emulate: Emulate) -> Value {
    let (minor, git, go) = match emulate {
        Emulate::Current => ("37", "v1.37.0-weir-fakeapi", "go1.25"),
        Emulate::Kube1_20 => ("20", "v1.20.2-weir-fakeapi", "go1.19"),
    };
    json!({
        "major": "1", "minor": minor, "gitVersion": git,
        "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z", "goVersion": go, "compiler": "gc",
        "platform": "linux/amd64"
    })
}

const SLICES_V1: &str = "/apis/discovery.k8s.io/v1";
const SLICES_V1BETA1: &str = "/apis/discovery.k8s.io/v1beta1";

/// The discovery document of a group version the emulated release serves (`GET
/// /apis/discovery.k8s.io/v1`), or `None`.
fn discovery(emulate: Emulate, path: &str) -> Option<Value> {
    let group_version = match (emulate, path) {
        (Emulate::Current, SLICES_V1) => "discovery.k8s.io/v1",
        (Emulate::Kube1_20, SLICES_V1BETA1) => "discovery.k8s.io/v1beta1",
        _ => return None,
    };
    Some(json!({
        "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
        "resources": [{
            "name": "endpointslices", "singularName": "", "namespaced": true,
            "kind": "EndpointSlice",
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
        }]
    }))
}

/// The path as stored (EndpointSlices under v1), and whether the client asked for v1beta1;
/// `None` for a version the emulated release does not serve.
fn served_path(emulate: Emulate, path: &str) -> Option<(String, bool)> {
    let beta = path
        .strip_prefix(SLICES_V1BETA1)
        .filter(|rest| rest.starts_with('/'));
    let v1 = path
        .strip_prefix(SLICES_V1)
        .filter(|rest| rest.starts_with('/'));
    match emulate {
        Emulate::Current if beta.is_some() => None,
        Emulate::Kube1_20 if v1.is_some() => None,
        Emulate::Kube1_20 => match beta {
            Some(rest) => Some((format!("{SLICES_V1}{rest}"), true)),
            None => Some((path.to_string(), false)),
        },
        Emulate::Current => Some((path.to_string(), false)),
    }
}

/// A v1 EndpointSlice as 1.20 serves it in `discovery.k8s.io/v1beta1`: `nodeName` and
/// `zone` in each endpoint's `topology` map (with `deprecatedTopology`), no `hints`.
pub fn slice_v1_to_v1beta1(slice: &mut Value) {
    if let Some(o) = slice.as_object_mut() {
        if o.contains_key("apiVersion") {
            o.insert("apiVersion".into(), "discovery.k8s.io/v1beta1".into());
        }
    }
    let Some(endpoints) = slice.get_mut("endpoints").and_then(Value::as_array_mut) else {
        return;
    };
    for e in endpoints.iter_mut().filter_map(Value::as_object_mut) {
        let mut topology = match e.remove("deprecatedTopology") {
            Some(Value::Object(t)) => t,
            _ => serde_json::Map::new(),
        };
        if let Some(node) = e.remove("nodeName") {
            topology.insert("kubernetes.io/hostname".into(), node);
        }
        if let Some(zone) = e.remove("zone") {
            topology.insert("topology.kubernetes.io/zone".into(), zone);
        }
        e.remove("hints");
        if !topology.is_empty() {
            e.insert("topology".into(), Value::Object(topology));
        }
    }
}

/// Re-encodes one stored object for a v1beta1 client.
fn as_v1beta1(object: &[u8]) -> Bytes {
    match serde_json::from_slice::<Value>(object) {
        Ok(mut v) => {
            slice_v1_to_v1beta1(&mut v);
            Bytes::from(v.to_string())
        }
        Err(_) => Bytes::copy_from_slice(object),
    }
}

pub async fn handle(shared: Arc<Shared>, req: Request<hyper::body::Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    shared
        .requests
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(format!("{} {}", req.method(), req.uri()));
    if req.method() == hyper::Method::PATCH {
        return patch_node(&shared, req).await;
    }
    if req.method() != hyper::Method::GET {
        return status_response(&Status {
            code: 405,
            reason: "MethodNotAllowed",
            message: "the fake API server serves GET, and PATCH of a Node".into(),
        });
    }
    let emulate = *shared.emulate.lock().unwrap_or_else(|p| p.into_inner());
    if path == "/version" {
        return full(StatusCode::OK, version(emulate));
    }
    if let Some(doc) = discovery(emulate, &path) {
        return full(StatusCode::OK, doc);
    }
    let Some((resource, namespace, beta)) =
        served_path(emulate, &path).and_then(|(p, beta)| route(&p).map(|(r, ns)| (r, ns, beta)))
    else {
        return status_response(&Status {
            code: 404,
            reason: "NotFound",
            message: format!("the server could not find the requested resource ({path})"),
        });
    };
    let p = params(req.uri().query());
    let get = |k: &str| p.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let labels = match LabelSelector::parse(get("labelSelector").unwrap_or("")) {
        Ok(l) => l,
        Err(e) => return status_response(&Status::bad_request(e)),
    };
    let fields = match FieldSelector::parse(get("fieldSelector").unwrap_or("")) {
        Ok(f) => f,
        Err(e) => return status_response(&Status::bad_request(e)),
    };
    if emulate == Emulate::Kube1_20 && resource == Resource::Services {
        if let Some(field) = fields.fields().find(|f| !f.starts_with("metadata.")) {
            return status_response(&Status::bad_request(format!(
                "\"{field}\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
            )));
        }
    }
    let query = Query {
        namespace,
        labels,
        fields,
        limit: get("limit").and_then(|l| l.parse().ok()),
        continue_token: get("continue")
            .filter(|c| !c.is_empty())
            .map(str::to_string),
    };
    if matches!(get("watch"), Some("true" | "1")) {
        let from = get("resourceVersion").unwrap_or("");
        let bookmarks = get("allowWatchBookmarks") == Some("true");
        let timeout = get("timeoutSeconds")
            .and_then(|t| t.parse().ok())
            .map_or(Duration::from_secs(1800), Duration::from_secs);
        return watch_response(shared, resource, query, from, bookmarks, timeout, beta);
    }
    list_response(&shared, resource, &query, beta).await
}

/// `PATCH /api/v1/nodes/<name>` with a JSON merge patch (RFC 7386, what `kubectl patch
/// --type merge` and kube-rs's `Patch::Merge` send): how node routes publish their VTEP.
async fn patch_node(shared: &Shared, req: Request<hyper::body::Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    let Some(name) = path
        .strip_prefix("/api/v1/nodes/")
        .filter(|n| !n.is_empty() && !n.contains('/'))
        .map(str::to_string)
    else {
        return status_response(&Status {
            code: 405,
            reason: "MethodNotAllowed",
            message: format!("PATCH is served for Nodes only ({path})"),
        });
    };
    let merge = req
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .is_some_and(|c| c.as_bytes().starts_with(b"application/merge-patch+json"));
    if !merge {
        return status_response(&Status {
            code: 415,
            reason: "UnsupportedMediaType",
            message: "only application/merge-patch+json is served".into(),
        });
    }
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return status_response(&Status::bad_request(e.to_string())),
    };
    let patch: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return status_response(&Status::bad_request(e.to_string())),
    };
    let mut state = shared.state();
    let Some(mut node) = state.get(Resource::Nodes, "", &name) else {
        return status_response(&Status {
            code: 404,
            reason: "NotFound",
            message: format!("nodes \"{name}\" not found"),
        });
    };
    merge_patch(&mut node, &patch);
    match state.apply(node.clone()) {
        Ok(_) => full(
            StatusCode::OK,
            state.get(Resource::Nodes, "", &name).unwrap_or(node),
        ),
        Err(e) => status_response(&Status::bad_request(e)),
    }
}

/// RFC 7386: objects merge key by key, `null` removes, anything else replaces.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let t = target.as_object_mut().expect("made an object above");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

async fn list_response(
    shared: &Shared,
    resource: Resource,
    q: &Query,
    beta: bool,
) -> Response<Body> {
    let mut faults = shared.faults.subscribe();
    loop {
        let (hold, delay) = {
            let f = faults.borrow_and_update();
            (f.hold_lists, f.list_delay)
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if !hold {
            break;
        }
        if faults.changed().await.is_err() {
            break;
        }
    }
    let result = shared.state().list(resource, q);
    match result {
        Ok(list) if beta => {
            let mut v: Value = serde_json::from_slice(&list).unwrap_or_default();
            v["apiVersion"] = "discovery.k8s.io/v1beta1".into();
            if let Some(items) = v.get_mut("items").and_then(Value::as_array_mut) {
                items.iter_mut().for_each(slice_v1_to_v1beta1);
            }
            full(StatusCode::OK, v)
        }
        Ok(list) => json_bytes(StatusCode::OK, list),
        Err(s) => status_response(&s),
    }
}

type Chunk = Result<Frame<Bytes>, std::io::Error>;

fn line(v: &Value) -> Chunk {
    let mut s = v.to_string();
    s.push('\n');
    Ok(Frame::data(Bytes::from(s)))
}

fn event(kind: &str, object: Value) -> Value {
    json!({ "type": kind, "object": object })
}

/// Watch events up to this many bytes go out as one chunk.
const CHUNK_BYTES: usize = 64 * 1024;

/// Sends events as JSON lines built from the objects' stored encodings, several to a chunk.
async fn send_events(
    tx: &mpsc::Sender<Chunk>,
    events: Vec<WatchEvent>,
    beta: bool,
) -> Result<(), mpsc::error::SendError<Chunk>> {
    let mut buf = Vec::new();
    for (kind, object) in events {
        let object = if beta { as_v1beta1(&object) } else { object };
        buf.extend_from_slice(b"{\"type\":\"");
        buf.extend_from_slice(kind.as_bytes());
        buf.extend_from_slice(b"\",\"object\":");
        buf.extend_from_slice(&object);
        buf.extend_from_slice(b"}\n");
        if buf.len() >= CHUNK_BYTES {
            tx.send(Ok(Frame::data(Bytes::from(std::mem::take(&mut buf)))))
                .await?;
        }
    }
    if !buf.is_empty() {
        tx.send(Ok(Frame::data(Bytes::from(buf)))).await?;
    }
    Ok(())
}

/// A 200 whose chunked body carries the watch's events, one JSON object per line.
fn watch_response(
    shared: Arc<Shared>,
    resource: Resource,
    q: Query,
    from: &str,
    bookmarks: bool,
    timeout: Duration,
    beta: bool,
) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Chunk>(64);
    let from = from.to_string();
    tokio::spawn(async move {
        let watch = Watch {
            resource,
            q: &q,
            from: &from,
            bookmarks,
            timeout,
            beta,
        };
        let _ = stream_watch(&shared, watch, &tx).await;
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        let item = rx.recv().await?;
        Some((item, rx))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(StreamBody::new(stream).boxed_unsync())
        .expect("valid response")
}

/// What one watch asked for.
struct Watch<'a> {
    resource: Resource,
    q: &'a Query,
    from: &'a str,
    bookmarks: bool,
    timeout: Duration,
    /// EndpointSlices as `discovery.k8s.io/v1beta1`.
    beta: bool,
}

/// Feeds one watch until its timeout (a clean end), the client leaves, or the connection is
/// killed (an abrupt end: the body fails, so the client sees a broken chunked stream).
async fn stream_watch(
    shared: &Shared,
    w: Watch<'_>,
    tx: &mpsc::Sender<Chunk>,
) -> Result<(), mpsc::error::SendError<Chunk>> {
    let Watch {
        resource,
        q,
        from,
        bookmarks,
        timeout,
        beta,
    } = w;
    let mut kill = shared.kill.subscribe();
    kill.borrow_and_update();
    let mut changed = shared.changed.subscribe();
    let faults = shared.faults.borrow().clone();
    let deadline = tokio::time::Instant::now() + timeout;
    let abort = || {
        Err(std::io::Error::other(
            "connection dropped by the fake API server",
        ))
    };
    if faults.hang_watches {
        // Headers went out; nothing else ever does.
        let _ = kill.changed().await;
        return tx.send(abort()).await;
    }
    let mut at: u64 = match from {
        "" | "0" => {
            let (events, rv) = {
                let s = shared.state();
                (s.current_as_added(resource, q), s.resource_version())
            };
            send_events(tx, events, beta).await?;
            rv
        }
        rv => match rv.parse() {
            Ok(rv) => rv,
            Err(_) => {
                let s = Status::bad_request(format!("invalid resourceVersion {rv:?}"));
                return tx.send(line(&event("ERROR", s.to_json()))).await;
            }
        },
    };
    loop {
        changed.borrow_and_update();
        let result = shared.state().events_since(resource, q, at);
        match result {
            Ok((events, rv)) => {
                send_events(tx, events, beta).await?;
                at = rv;
            }
            Err(gone) => {
                // The real API server answers a too-old resourceVersion on a watch with a
                // 200 and one ERROR event carrying the 410 Status.
                return tx.send(line(&event("ERROR", gone.to_json()))).await;
            }
        }
        let interval = shared.faults.borrow().bookmark_interval;
        tokio::select! {
            _ = changed.changed() => {}
            _ = tokio::time::sleep(interval), if bookmarks => {
                let api_version = if beta {
                    "discovery.k8s.io/v1beta1"
                } else {
                    resource.api_version()
                };
                let mark = json!({
                    "kind": resource.kind(),
                    "apiVersion": api_version,
                    "metadata": {
                        "resourceVersion": at.to_string(),
                        "annotations": {}
                    }
                });
                tx.send(line(&event("BOOKMARK", mark))).await?;
            }
            _ = tokio::time::sleep_until(deadline) => return Ok(()),
            _ = kill.changed() => return tx.send(abort()).await,
            _ = tx.closed() => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_patch_merges_objects_removes_nulls_and_replaces_the_rest() {
        let mut node = json!({"metadata": {"name": "n", "annotations": {"a": "1", "b": "2"}}});
        merge_patch(
            &mut node,
            &json!({"metadata": {"annotations": {"b": null, "c": "3"}}}),
        );
        assert_eq!(
            node,
            json!({"metadata": {"name": "n", "annotations": {"a": "1", "c": "3"}}})
        );
    }

    #[test]
    fn routes_cluster_wide_and_namespaced_collections() {
        assert_eq!(route("/api/v1/services"), Some((Resource::Services, None)));
        assert_eq!(
            route("/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices"),
            Some((Resource::EndpointSlices, Some("kube-system".into())))
        );
        assert_eq!(route("/api/v1/nodes"), Some((Resource::Nodes, None)));
        assert_eq!(route("/api/v1/namespaces/x/nodes"), None);
        assert_eq!(route("/api/v1/pods"), Some((Resource::Pods, None)));
        assert_eq!(
            route("/api/v1/namespaces"),
            Some((Resource::Namespaces, None))
        );
        assert_eq!(
            route("/apis/networking.k8s.io/v1/namespaces/shop/networkpolicies"),
            Some((Resource::NetworkPolicies, Some("shop".into())))
        );
        assert_eq!(route("/api/v1/configmaps"), None);
    }

    #[tokio::test]
    async fn watch_events_are_json_lines_from_the_stored_bytes_several_to_a_chunk() {
        let mut state = State::default();
        for i in 0..2000 {
            let svc = json!({"kind": "Service", "metadata": {"name": format!("s{i}")}});
            state.apply(svc).unwrap();
        }
        let events = state.current_as_added(Resource::Services, &Query::default());
        let (tx, mut rx) = mpsc::channel(1024);
        send_events(&tx, events, false).await.unwrap();
        drop(tx);
        let mut chunks = 0;
        let mut names = Vec::new();
        while let Some(chunk) = rx.recv().await {
            chunks += 1;
            let data = chunk.unwrap().into_data().unwrap();
            assert!(data.ends_with(b"\n"), "a chunk ends with a whole line");
            for line in data.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                let event: Value = serde_json::from_slice(line).unwrap();
                assert_eq!(event["type"], "ADDED");
                assert_eq!(event["object"]["kind"], "Service");
                assert_eq!(event["object"]["apiVersion"], "v1");
                names.push(
                    event["object"]["metadata"]["name"]
                        .as_str()
                        .unwrap()
                        .to_string(),
                );
            }
        }
        assert_eq!(names.len(), 2000);
        assert!(
            (2..2000).contains(&chunks),
            "{chunks} chunks for 2000 events"
        );
    }

    #[test]
    fn query_components_are_percent_decoded() {
        let p = params(Some(
            "labelSelector=%21service.kubernetes.io%2Fheadless&fieldSelector=spec.clusterIP%21%3DNone&watch=true",
        ));
        assert_eq!(p[0].1, "!service.kubernetes.io/headless");
        assert_eq!(p[1].1, "spec.clusterIP!=None");
        assert_eq!(decode("a+b%2"), "a b%2");
    }
}
