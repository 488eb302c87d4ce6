//! userspace mode: a proxy inside the agent process, like kube-proxy's old userspace mode.
//! nftables (table `inet weir_userspace`) redirects each service frontend to a local
//! listener; the listener balances new connections over the ready endpoints (round robin,
//! sessionAffinity ClientIP) and, when a dial fails, tries the next endpoint with kube-proxy's
//! backoff (250 ms, 500 ms, 1 s, 2 s), so a client does not see a dead backend while another
//! is alive. Frontends without endpoints are refused by nftables (TCP reset / ICMP), not by
//! the proxy.
//!
//! * [`balance`]: pure endpoint choice and the dial schedule.
//! * [`render`]: pure, plan + listener ports → the `nft -f` script.
//! * [`serve`]: the sockets (tokio; data copied with `copy_bidirectional`).
//!
//! What it does not do: splice(2) (data passes through user space), SCTP, keeping the
//! client's address towards the endpoint (endpoints see the node's address, as with
//! kube-proxy's userspace mode).

pub mod balance;
pub mod render;
pub mod serve;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use weir_model::{EndpointSet, Plan, Protocol, Verdict};

use crate::backend::{Backend, Error, Result, SyncKind, SyncReport};
use crate::nft::netlink::NftNetlink;
use crate::nft::nft_script;
use balance::Pool;
use render::{render, ListenerKey, TABLE};
use serve::{Listener, Runtime};

/// The userspace proxy [`Backend`].
#[derive(Default)]
pub struct UserspaceBackend {
    runtime: Option<Runtime>,
    listeners: BTreeMap<ListenerKey, Listener>,
    /// The plan the kernel and the listeners hold (absent: the next sync rewrites all).
    applied: Option<Plan>,
    /// Rules per chain of weir's table after the last sync, read back from the kernel.
    expected: Option<HashMap<String, usize>>,
}

impl UserspaceBackend {
    pub fn new() -> Self {
        Self::default()
    }

    /// The listeners `plan` needs: per forwarding (service port, endpoint set), its endpoints
    /// and affinity timeout. Public for weir-netdiag's check of the rendered rules.
    pub fn wanted(plan: &Plan) -> BTreeMap<ListenerKey, (Vec<SocketAddr>, Option<Duration>)> {
        let mut out = BTreeMap::new();
        for (key, sp) in &plan.services {
            if key.protocol == Protocol::Sctp {
                continue;
            }
            for fe in sp
                .frontends
                .iter()
                .filter(|f| f.verdict == Verdict::Forward)
            {
                let eps = sp
                    .endpoints(fe.endpoints)
                    .iter()
                    .map(|e| SocketAddr::new(e.ip, e.port))
                    .collect();
                let affinity = sp.affinity_timeout.map(|s| Duration::from_secs(s.into()));
                out.insert((key.clone(), fe.endpoints), (eps, affinity));
            }
            // Pods and the node reach an external VIP with policy Local through the cluster
            // endpoints (render's short circuit), even where no endpoint is local.
            if sp.frontends.iter().any(|f| f.short_circuit) && !sp.cluster_endpoints.is_empty() {
                let eps = sp
                    .cluster_endpoints
                    .iter()
                    .map(|e| SocketAddr::new(e.ip, e.port))
                    .collect();
                let affinity = sp.affinity_timeout.map(|s| Duration::from_secs(s.into()));
                out.insert((key.clone(), EndpointSet::Cluster), (eps, affinity));
            }
        }
        out
    }
}

impl Backend for UserspaceBackend {
    fn mode(&self) -> &'static str {
        "userspace"
    }

    fn sync(&mut self, plan: &Plan) -> Result<SyncReport> {
        let start = Instant::now();
        if self.applied.as_ref() == Some(plan) && self.intact()? {
            return Ok(SyncReport {
                kind: SyncKind::Noop,
                elapsed: start.elapsed(),
                service_ports_touched: 0,
            });
        }
        if self.runtime.is_none() {
            self.runtime = Some(Runtime::start()?);
        }
        let rt = self.runtime.as_ref().expect("just started");
        let wanted = Self::wanted(plan);
        // Listeners first, so that no redirect ever points at a closed port.
        for (key, (eps, affinity)) in &wanted {
            match self.listeners.get(key) {
                Some(l) => l
                    .pool
                    .lock()
                    .expect("pool lock")
                    .update(eps.clone(), *affinity),
                None => {
                    let pool = Pool::new(eps.clone(), *affinity);
                    match Listener::open(rt, key.0.family, key.0.protocol, pool) {
                        Ok(l) => {
                            self.listeners.insert(key.clone(), l);
                        }
                        // Its frontends are rejected by the rules instead (see `render`).
                        Err(e) => {
                            tracing::warn!(service = ?key.0, error = %e, "userspace proxy: cannot listen")
                        }
                    }
                }
            }
        }
        let ports = self
            .listeners
            .iter()
            .filter(|(k, _)| wanted.contains_key(*k))
            .map(|(k, l)| (k.clone(), l.port))
            .collect();
        self.applied = None;
        self.expected = None;
        nft_script(&render(plan, &ports))?;
        self.listeners.retain(|k, _| wanted.contains_key(k));
        self.expected = Some(NftNetlink::new()?.rule_counts(TABLE)?);
        self.applied = Some(plan.clone());
        Ok(SyncReport {
            kind: SyncKind::Full,
            elapsed: start.elapsed(),
            service_ports_touched: plan.services.len(),
        })
    }

    fn intact(&mut self) -> Result<bool> {
        let Some(expected) = &self.expected else {
            return Ok(true);
        };
        let held = match NftNetlink::new()?.rule_counts(TABLE) {
            Ok(h) => h,
            // The table is gone.
            Err(Error::Netlink(_)) => return Ok(false),
            Err(e) => return Err(e),
        };
        Ok(&held == expected)
    }

    fn invalidate(&mut self) {
        self.applied = None;
    }

    fn cleanup(&mut self) -> Result<()> {
        self.applied = None;
        self.expected = None;
        self.listeners.clear();
        match nft_script(&format!(
            "table inet {TABLE} {{}}\ndelete table inet {TABLE}\n"
        )) {
            Ok(()) => Ok(()),
            // No nft at all: nothing of ours can exist.
            Err(Error::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }
}
