//! Writes to the real cluster's API server, timed: a thread in the control plane's network
//! namespace (where the apiserver's address is reachable) with a one-thread runtime and a
//! kube-rs client from the cluster's kubeconfig. Each write reports when its request left
//! and when the server's answer (the object stored) came back.

use std::fs::File;
use std::path::Path;
use std::sync::mpsc;
use std::thread;
use std::time::Instant;

use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::Value;
use weir_model::k8s_openapi::api::core::v1::Pod;
use weir_model::k8s_openapi::api::networking::v1::NetworkPolicy;

/// One write.
pub enum Write {
    /// A JSON merge patch of a Pod.
    PatchPod(String, String, Value),
    /// A JSON merge patch of a NetworkPolicy.
    PatchPolicy(String, String, Value),
    /// NetworkPolicies created one request after another.
    Create(Vec<Value>),
    /// Every NetworkPolicy of a namespace, in one request.
    DeletePolicies(String),
}

/// (request sent, answer received)
pub type Timed = Result<(Instant, Instant), String>;

pub struct KubeApi {
    tx: Option<mpsc::Sender<(Write, mpsc::Sender<Timed>)>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl KubeApi {
    pub fn connect(netns: &str, kubeconfig: &Path) -> Result<KubeApi, String> {
        let (tx, rx) = mpsc::channel::<(Write, mpsc::Sender<Timed>)>();
        let (ready_tx, ready_rx) = mpsc::channel();
        let (path, kubeconfig) = (format!("/run/netns/{netns}"), kubeconfig.to_path_buf());
        let thread = thread::spawn(move || {
            let setup = File::open(&path)
                .map_err(|e| format!("{path}: {e}"))
                .and_then(|f| {
                    nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET)
                        .map_err(|e| format!("setns {path}: {e}"))
                })
                .and_then(|()| client(&kubeconfig));
            let (runtime, client) = match setup {
                Ok(v) => v,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(()));
            for (write, reply) in rx {
                let _ = reply.send(runtime.block_on(perform(&client, write)));
            }
        });
        ready_rx
            .recv()
            .map_err(|_| "API client thread died".to_string())??;
        Ok(KubeApi {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    pub fn write(&self, w: Write) -> Timed {
        let (reply, answer) = mpsc::channel();
        self.tx
            .as_ref()
            .expect("open until drop")
            .send((w, reply))
            .map_err(|_| "API client thread died".to_string())?;
        answer
            .recv()
            .map_err(|_| "API client thread died".to_string())?
    }
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn client(kubeconfig: &Path) -> Result<(tokio::runtime::Runtime, Client), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let client = runtime.block_on(async {
        let file = Kubeconfig::read_from(kubeconfig).map_err(|e| e.to_string())?;
        let config = Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        Client::try_from(config).map_err(|e| e.to_string())
    })?;
    Ok((runtime, client))
}

async fn perform(client: &Client, w: Write) -> Timed {
    let err = |e: kube::Error| e.to_string();
    let sent = Instant::now();
    match w {
        Write::PatchPod(ns, name, patch) => {
            Api::<Pod>::namespaced(client.clone(), &ns)
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(err)?;
        }
        Write::PatchPolicy(ns, name, patch) => {
            Api::<NetworkPolicy>::namespaced(client.clone(), &ns)
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(err)?;
        }
        Write::Create(objects) => {
            for v in objects {
                let p: NetworkPolicy = serde_json::from_value(v).map_err(|e| e.to_string())?;
                let ns = p.metadata.namespace.clone().unwrap_or_default();
                Api::<NetworkPolicy>::namespaced(client.clone(), &ns)
                    .create(&PostParams::default(), &p)
                    .await
                    .map_err(err)?;
            }
        }
        Write::DeletePolicies(ns) => {
            Api::<NetworkPolicy>::namespaced(client.clone(), &ns)
                .delete_collection(&DeleteParams::default(), &ListParams::default())
                .await
                .map_err(err)?;
        }
    }
    Ok((sent, Instant::now()))
}
