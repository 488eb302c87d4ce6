//! weir-fakeapi: a fake Kubernetes API server for tests, speaking the real list/watch
//! protocol closely enough that kube-rs cannot tell (no real kube-apiserver can run where
//! weir's tests run).
//!
//! Serves Services, EndpointSlices, Nodes, Pods, Namespaces and NetworkPolicies (cluster-wide
//! and namespaced paths; EndpointSlices as 1.20's `v1beta1` when it [`Emulate`]s 1.20) over
//! HTTP/1.1: lists with `resourceVersion`, `limit`/`continue` pagination (a consistent
//! snapshot per paged list, `410 Gone` for an expired continue token), `labelSelector` and
//! `fieldSelector`; watches as chunked streams of `ADDED`/`MODIFIED`/`DELETED`/`BOOKMARK`
//! JSON lines from a resourceVersion, with `allowWatchBookmarks` and `timeoutSeconds`, and an
//! `ERROR` event with a `410 Expired` Status for a resourceVersion older than the compacted
//! history. On demand: held or slow lists, hanging watches, dropped connections, a stopped
//! or restarted server (objects and history survive, as etcd's do).
//!
//! The server runs on its own tokio runtime, optionally inside a named network namespace
//! (`ip netns add`), so a process in that namespace reaches it on its loopback.

mod selector;
mod server;
mod state;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;

pub use selector::{FieldSelector, LabelSelector};
pub use server::{slice_v1_to_v1beta1, Emulate, Faults};
pub use state::{Query, Resource, State, Status};

use server::Shared;

/// A running fake API server; stopped when dropped.
pub struct FakeApi {
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
    addr: SocketAddr,
    /// The accept loop while serving.
    serving: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl FakeApi {
    /// Starts on `addr` (port 0: any free port) in network namespace `netns` (a name under
    /// /var/run/netns) or the caller's.
    pub fn start(netns: Option<&str>, addr: SocketAddr) -> anyhow::Result<FakeApi> {
        let runtime = runtime_in(netns)?;
        let mut api = FakeApi {
            shared: Arc::new(Shared::new()),
            runtime: Some(runtime),
            addr,
            serving: Mutex::new(None),
        };
        api.addr = api.listen(addr)?;
        Ok(api)
    }

    /// `http://<addr>`, for `--master`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        self.runtime.as_ref().expect("runtime lives until drop")
    }

    /// Binds on a runtime worker (whose thread is in the namespace; `block_on` would run the
    /// bind on the caller's thread) and starts accepting.
    fn listen(&self, addr: SocketAddr) -> anyhow::Result<SocketAddr> {
        let shared = self.shared.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let task = self.rt().spawn(async move {
            let listener = match TcpListener::bind(addr).await {
                Ok(l) => l,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            let _ = tx.send(listener.local_addr());
            accept_loop(listener, shared).await;
        });
        let bound = rx
            .recv_timeout(Duration::from_secs(10))
            .context("fake API server: no answer from its runtime")?
            .with_context(|| format!("fake API server: bind {addr}"))?;
        *self.serving.lock().unwrap() = Some(task);
        Ok(bound)
    }

    /// Stops listening and drops every open connection (clients see refused connections).
    pub fn stop(&self) {
        if let Some(task) = self.serving.lock().unwrap().take() {
            task.abort();
        }
        self.drop_connections();
        // Let the aborted tasks run their drops (sockets closed) before returning.
        std::thread::sleep(Duration::from_millis(50));
    }

    /// Serves again on the same address, with the same objects and history.
    pub fn restart(&self) -> anyhow::Result<()> {
        self.stop();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            match self.listen(self.addr) {
                Ok(_) => return Ok(()),
                Err(e) if std::time::Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Cuts every open connection mid-stream (watches end without their final chunk).
    pub fn drop_connections(&self) {
        self.shared.kill.send_modify(|n| *n += 1);
    }

    /// Creates or replaces the objects of a (multi-document) YAML text.
    pub fn apply_yaml(&self, yaml: &str) -> anyhow::Result<()> {
        let mut reader = yaml.as_bytes();
        for doc in serde_saphyr::read::<_, Value>(&mut reader) {
            let v = doc.context("YAML")?;
            self.apply_json(v)?;
        }
        Ok(())
    }

    /// Creates or replaces a k8s-openapi object.
    pub fn apply<K: k8s_openapi::Resource + serde::Serialize>(
        &self,
        object: &K,
    ) -> anyhow::Result<()> {
        let mut v = serde_json::to_value(object)?;
        v["kind"] = K::KIND.into();
        v["apiVersion"] = K::API_VERSION.into();
        self.apply_json(v)
    }

    fn apply_json(&self, v: Value) -> anyhow::Result<()> {
        let rv = match self.shared.state().apply(v) {
            Ok(rv) => rv,
            Err(e) => bail!("fake API server: {e}"),
        };
        self.shared.changed.send_replace(rv);
        Ok(())
    }

    /// Deletes `kind` `namespace/name` (namespace ignored for Nodes); whether it existed.
    pub fn delete(&self, kind: &str, namespace: &str, name: &str) -> bool {
        let Some(resource) = Resource::from_kind(kind) else {
            return false;
        };
        let rv = self.shared.state().delete(resource, namespace, name);
        if let Some(rv) = rv {
            self.shared.changed.send_replace(rv);
        }
        rv.is_some()
    }

    /// Compacts the history: watches resuming from before now get 410 Gone.
    pub fn compact(&self) {
        self.shared.state().compact();
    }

    pub fn expire_continue_tokens(&self) {
        self.shared.state().expire_continue_tokens();
    }

    pub fn resource_version(&self) -> u64 {
        self.shared.state().resource_version()
    }

    /// Changes the faults (see [`Faults`]).
    pub fn set_faults(&self, f: impl FnOnce(&mut Faults)) {
        self.shared.faults.send_modify(f);
    }

    /// Behave as another Kubernetes release from now on (see [`Emulate`]).
    pub fn emulate(&self, release: Emulate) {
        *self.shared.emulate.lock().unwrap() = release;
    }

    /// Every request served so far (`GET /path?query`).
    pub fn requests(&self) -> Vec<String> {
        self.shared.requests.lock().unwrap().clone()
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.stop();
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let kill = shared.kill.subscribe();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let shared = shared.clone();
        let mut kill = kill.clone();
        kill.borrow_and_update();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, std::convert::Infallible>(server::handle(shared, req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc);
            // Dropping the connection closes the socket: a killed connection just vanishes.
            tokio::select! {
                _ = conn => {}
                _ = kill.changed() => {}
            }
        });
    }
}

/// A small tokio runtime whose threads live in `netns` (threads inherit the namespace of
/// the thread that creates them, so it is built on a thread that first enters it).
fn runtime_in(netns: Option<&str>) -> anyhow::Result<tokio::runtime::Runtime> {
    let netns = netns.map(str::to_string);
    std::thread::spawn(move || -> anyhow::Result<tokio::runtime::Runtime> {
        if let Some(ns) = &netns {
            let path = format!("/var/run/netns/{ns}");
            let f = std::fs::File::open(&path).with_context(|| format!("open {path}"))?;
            nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET)
                .with_context(|| format!("enter network namespace {ns}"))?;
        }
        Ok(tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("weir-fakeapi")
            .enable_all()
            .build()?)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("fake API server: runtime thread panicked"))?
}
