//! What happens around each sync: health state and servers, metrics, UDP conntrack cleanup.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tracing::{debug, info, warn};
use weir_model::conditions::Conditions;
use weir_model::{Plan, PlanDiff, ServicePortKey};

use super::SyncObserver;
use crate::conntrack::{stale_udp_flows, Conntrack};
use crate::health::{
    health_check_services, HttpRuntime, OtherParts, ProxyHealth, ProxyServers,
    ServiceHealthServers, ServiceName, SourceCheck,
};
use crate::metrics::ProxyMetrics;
use crate::{SyncKind, SyncReport};

/// Where [`Operations`] serves, and the sync period its health timeout derives from.
#[derive(Debug, Clone)]
pub struct OperationsSettings {
    /// `/healthz` and `/livez` (`None`: not served).
    pub healthz: Option<SocketAddr>,
    /// `/metrics` (`None`: not served; the same address as `healthz` serves all three).
    pub metrics: Option<SocketAddr>,
    /// `--sync-period`: health fails when a change waits longer than twice this.
    pub sync_period: Duration,
}

/// The agent's [`SyncObserver`]: health state and servers, metrics, healthCheckNodePort
/// servers and UDP conntrack cleanup.
pub struct Operations {
    health: Arc<ProxyHealth>,
    metrics: Arc<ProxyMetrics>,
    service_health: ServiceHealthServers,
    conntrack: Option<Conntrack>,
    /// When the oldest change not yet programmed was seen.
    queued_at: Option<Instant>,
    /// Kept up to date from each sync's diff, so that a change costs what it touches:
    /// the healthCheckNodePort servers wanted, and the no-local-endpoints counts
    /// (internal, external).
    health_checks: BTreeMap<ServiceName, (u16, usize)>,
    no_local: (i64, i64),
    /// healthCheckNodePorts that could not be opened (retried at every sync): each said when
    /// it first fails or its error changes, and when it opens.
    health_check_failures: Conditions,
    // Kept alive for the life of the agent; dropped last.
    servers: ProxyServers,
    _runtime: HttpRuntime,
}

impl Operations {
    /// Starts the health and metrics servers in the current network namespace.
    pub fn start(settings: &OperationsSettings, mode: &str) -> std::io::Result<Self> {
        Self::start_with(settings, mode, OtherParts::default())
    }

    /// [`Operations::start`] in the node agent: the servers answer for its `others` too.
    pub fn start_with(
        settings: &OperationsSettings,
        mode: &str,
        others: OtherParts,
    ) -> std::io::Result<Self> {
        // kube-proxy's health timeout: twice the sync period.
        let health = Arc::new(ProxyHealth::new(2 * settings.sync_period));
        let metrics = Arc::new(ProxyMetrics::new(mode));
        let runtime = HttpRuntime::new()?;
        let servers = ProxyServers::start_with(
            &runtime,
            settings.healthz,
            settings.metrics,
            health.clone(),
            metrics.clone(),
            others,
        )?;
        let service_health = ServiceHealthServers::new(&runtime, Vec::new(), health.clone());
        Ok(Operations {
            health,
            metrics,
            service_health,
            conntrack: None,
            queued_at: None,
            health_checks: BTreeMap::new(),
            no_local: (0, 0),
            health_check_failures: Conditions::default(),
            servers,
            _runtime: runtime,
        })
    }

    /// The health state the servers answer from.
    pub fn health(&self) -> &Arc<ProxyHealth> {
        &self.health
    }

    /// The metrics `/metrics` encodes (the object source's reporters add to them too).
    pub fn metrics(&self) -> &Arc<ProxyMetrics> {
        &self.metrics
    }

    /// Where `/healthz` is served (the bound address, with the real port).
    pub fn healthz_addr(&self) -> Option<SocketAddr> {
        self.servers.healthz_addr()
    }

    fn clean_conntrack(&mut self, previous: &Plan, plan: &Plan) {
        let filters = stale_udp_flows(previous, plan);
        if filters.is_empty() {
            return;
        }
        if self.conntrack.is_none() {
            match Conntrack::new() {
                Ok(c) => self.conntrack = Some(c),
                Err(e) => return warn!("conntrack: {e}"),
            }
        }
        let ct = self.conntrack.as_mut().expect("just opened");
        match ct.delete_matching(&filters) {
            Ok(n) => {
                debug!(
                    entries = n,
                    filters = filters.len(),
                    "stale UDP conntrack entries deleted"
                );
                self.metrics.conntrack_deleted(n);
            }
            Err(e) => {
                // A fresh socket next time (e.g. after ENOBUFS on a huge table).
                self.conntrack = None;
                warn!("conntrack cleanup failed: {e}");
            }
        }
    }
}

impl Operations {
    /// Moves the health-check services and no-local counts by `diff` (`plan`: after it).
    fn follow(&mut self, diff: &PlanDiff, plan: &Plan) {
        let olds = diff
            .removed
            .values()
            .chain(diff.changed.values().map(|c| &c.old));
        let news = diff
            .added
            .values()
            .chain(diff.changed.values().map(|c| &c.new));
        for (sp, sign) in olds.map(|sp| (sp, -1)).chain(news.map(|sp| (sp, 1))) {
            let (i, e) = ProxyMetrics::no_local_endpoints(sp);
            self.no_local.0 += sign * i;
            self.no_local.1 += sign * e;
        }
        let services: std::collections::BTreeSet<ServiceName> = diff
            .touched()
            .into_iter()
            .map(|k| (k.namespace.to_string(), k.name.to_string()))
            .collect();
        for name in services {
            self.health_checks.remove(&name);
            // The service's ports now: keys sort by namespace, then name.
            let from = ServicePortKey {
                namespace: name.0.as_str().into(),
                name: name.1.as_str().into(),
                port_name: "".into(),
                protocol: weir_model::Protocol::Tcp,
                family: weir_model::IpFamily::V4,
            };
            let mut ports = Plan::default();
            ports.services.extend(
                plan.services
                    .range(from..)
                    .take_while(|(k, _)| *k.namespace == *name.0 && *k.name == *name.1)
                    .map(|(k, v)| (k.clone(), v.clone())),
            );
            self.health_checks.extend(health_check_services(&ports));
        }
    }
}

impl SyncObserver for Operations {
    fn queued(&mut self) {
        self.health.queued_update();
        self.metrics.sync_queued();
        self.queued_at.get_or_insert_with(Instant::now);
    }

    fn synced(
        &mut self,
        diff: Option<&PlanDiff>,
        plan: &Plan,
        report: &SyncReport,
        change_triggers: &[SystemTime],
    ) {
        self.metrics.observe_sync(report.kind, report.elapsed);
        self.health.updated();
        let seen_at = self.queued_at.take();
        if !change_triggers.is_empty() {
            // kube-proxy's meaning: from the EndpointSlice's last-change-trigger-time.
            let now = SystemTime::now();
            for t in change_triggers {
                if let Ok(latency) = now.duration_since(*t) {
                    self.metrics.observe_network_programming(latency);
                }
            }
        } else if let (Some(at), true) = (seen_at, report.kind != SyncKind::Noop) {
            // Objects without trigger times (hand-written manifests): from when weir saw it.
            self.metrics.observe_network_programming(at.elapsed());
        }
        match diff {
            Some(diff) => {
                let endpoints = diff
                    .changed
                    .values()
                    .filter(|c| c.old.cluster_endpoints != c.new.cluster_endpoints)
                    .count()
                    + diff.added.len()
                    + diff.removed.len();
                self.metrics.record_changes(diff.touched().len(), endpoints);
                // Only the touched ports matter to stale flows: the diff's two sides.
                let (old, new) = diff.sides();
                self.clean_conntrack(&old, &new);
                self.follow(diff, plan);
            }
            None => {
                self.health_checks = health_check_services(plan);
                self.no_local = (0, 0);
                for sp in plan.services.values() {
                    let (i, e) = ProxyMetrics::no_local_endpoints(sp);
                    self.no_local.0 += i;
                    self.no_local.1 += e;
                }
            }
        }
        self.metrics
            .set_no_local_endpoints(self.no_local.0, self.no_local.1);
        let errors = self.service_health.sync(&self.health_checks);
        let said = self.health_check_failures.update(
            errors
                .iter()
                .map(|e| format!("{:?} port {}: {}", e.service, e.port, e.error)),
        );
        for e in said.cleared {
            info!("healthCheckNodePort no longer failing: {e}");
        }
        for e in said.appeared {
            warn!("healthCheckNodePort not opened (retried at every sync): {e}");
        }
    }

    fn failed(&mut self, _error: &crate::Error) {
        self.metrics.sync_failed();
    }

    fn node_eligible(&mut self, eligible: bool) {
        self.health.set_node_eligible(eligible);
    }

    fn source_started(&mut self, check: SourceCheck) {
        self.health.set_source_check(check);
    }
}
