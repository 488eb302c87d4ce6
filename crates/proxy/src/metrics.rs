//! Prometheus metrics of `weir proxy`, under kube-proxy's names where the meaning is the same
//! (pkg/proxy/metrics/metrics.go), so existing dashboards and alerts keep working.
//!
//! Differences from kube-proxy, on purpose:
//! * no `ip_family` label: one weir sync programs both families at once;
//! * a no-op sync (nothing differed) counts as a partial sync;
//! * `weir_proxy_sync_failures_total` counts failed syncs in every mode (kube-proxy only has
//!   the per-mode counter, which weir keeps too).
//!
//! Every handle inside is an atomic shared with the registry, so updates are lock-free and
//! `ProxyMetrics` is shared as `Arc<ProxyMetrics>` between the sync loop and the HTTP server.

use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::{text, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use weir_model::{Plan, ServicePortPlan};

use crate::SyncKind;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabel {
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabel {
    traffic_policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

pub struct ProxyMetrics {
    registry: Registry,
    sync: Histogram,
    sync_full: Histogram,
    sync_partial: Histogram,
    network_programming: Histogram,
    last_synced: FloatGauge,
    last_queued: FloatGauge,
    endpoint_changes_pending: Gauge,
    endpoint_changes: Counter,
    service_changes_pending: Gauge,
    service_changes: Counter,
    no_local_endpoints: Family<PolicyLabel, Gauge>,
    healthz: Family<CodeLabel, Counter>,
    livez: Family<CodeLabel, Counter>,
    sync_failures: Counter,
    /// kube-proxy's per-mode failure counter, when the mode has one.
    mode_failures: Option<Counter>,
    conntrack_deleted: Counter,
    source: SourceMetrics,
    process: ProcessMetrics,
}

/// The object source's health: scans, failures and standing manifest errors.
struct SourceMetrics {
    last_success: FloatGauge,
    scan_duration: Histogram,
    scan_failures: Counter,
    manifest_errors: Gauge,
    /// The Kubernetes API source, per kind.
    objects: Family<KindLabel, Gauge>,
    watch_restarts: Family<KindLabel, Counter>,
    last_list: Family<KindLabel, FloatGauge>,
}

/// Prometheus's standard `process_*` metrics, refreshed from `/proc/self` on every scrape.
#[derive(Default)]
struct ProcessMetrics {
    resident: Gauge,
    virtual_memory: Gauge,
    cpu: Counter<f64, AtomicU64>,
    open_fds: Gauge,
    start_time: FloatGauge,
}

/// `registry.register(name, help, handle.clone())` for each `name => handle, help;` entry: the
/// registry keeps a clone sharing the handle's atomics. Counters are named without `_total`: the
/// encoder appends it.
macro_rules! register_all {
    ($registry:expr; $($name:literal => $handle:expr, $help:literal;)+) => {
        $($registry.register($name, $help, $handle.clone());)+
    };
}

/// kube-proxy's sync latency buckets: 1 ms doubling 15 times (to ~16 s).
fn sync_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// kube-proxy's network programming buckets: 0.25 s, 0.5 s, 1–59 s, 60–115 s by 5, 2–5 min by 30 s.
fn programming_buckets() -> Histogram {
    let b = [0.25, 0.5]
        .into_iter()
        .chain((1..=59).map(f64::from))
        .chain((0..12).map(|i| 60.0 + 5.0 * f64::from(i)))
        .chain((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
    Histogram::new(b)
}

fn now_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl ProxyMetrics {
    /// `mode` is the backend's [`crate::Backend::mode`] (`"nftables"`, `"iptables"`, …).
    pub fn new(mode: &str) -> Self {
        let mut m = ProxyMetrics {
            registry: Registry::default(),
            sync: sync_buckets(),
            sync_full: sync_buckets(),
            sync_partial: sync_buckets(),
            network_programming: programming_buckets(),
            last_synced: FloatGauge::default(),
            last_queued: FloatGauge::default(),
            endpoint_changes_pending: Gauge::default(),
            endpoint_changes: Counter::default(),
            service_changes_pending: Gauge::default(),
            service_changes: Counter::default(),
            no_local_endpoints: Family::default(),
            healthz: Family::default(),
            livez: Family::default(),
            sync_failures: Counter::default(),
            mode_failures: None,
            conntrack_deleted: Counter::default(),
            source: SourceMetrics {
                last_success: FloatGauge::default(),
                scan_duration: sync_buckets(),
                scan_failures: Counter::default(),
                manifest_errors: Gauge::default(),
                objects: Family::default(),
                watch_restarts: Family::default(),
                last_list: Family::default(),
            },
            process: ProcessMetrics::default(),
        };
        let r = &mut m.registry;
        register_all! { r;
            "kubeproxy_sync_proxy_rules_duration_seconds" => m.sync,
                "SyncProxyRules latency in seconds";
            "kubeproxy_sync_full_proxy_rules_duration_seconds" => m.sync_full,
                "SyncProxyRules latency in seconds for full resyncs";
            "kubeproxy_sync_partial_proxy_rules_duration_seconds" => m.sync_partial,
                "SyncProxyRules latency in seconds for partial resyncs";
            "kubeproxy_network_programming_duration_seconds" => m.network_programming,
                "In Cluster Network Programming Latency in seconds";
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds" => m.last_synced,
                "The last time proxy rules were successfully synced";
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds" => m.last_queued,
                "The last time a sync of proxy rules was queued";
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending" => m.endpoint_changes_pending,
                "Pending proxy rules Endpoint changes";
            "kubeproxy_sync_proxy_rules_endpoint_changes" => m.endpoint_changes,
                "Cumulative proxy rules Endpoint changes";
            "kubeproxy_sync_proxy_rules_service_changes_pending" => m.service_changes_pending,
                "Pending proxy rules Service changes";
            "kubeproxy_sync_proxy_rules_service_changes" => m.service_changes,
                "Cumulative proxy rules Service changes";
            // A gauge despite the name, as in kube-proxy.
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total" => m.no_local_endpoints,
                "Number of services with a Local traffic policy and no endpoints";
            "kubeproxy_proxy_healthz" => m.healthz,
                "Cumulative proxy healthz HTTP status";
            "kubeproxy_proxy_livez" => m.livez,
                "Cumulative proxy livez HTTP status";
            "kubeproxy_conntrack_reconciler_deleted_entries" => m.conntrack_deleted,
                "Cumulative conntrack flows deleted by conntrack reconciler";
            "weir_proxy_sync_failures" => m.sync_failures,
                "Cumulative failed syncs of proxy rules (any mode); the previous rules stay in place";
            "weir_source_last_successful_scan_timestamp_seconds" => m.source.last_success,
                "When the manifest source last read its directory (alert when it falls behind)";
            "weir_source_scan_duration_seconds" => m.source.scan_duration,
                "Duration of manifest directory scans";
            "weir_source_scan_failures" => m.source.scan_failures,
                "Cumulative manifest scans that could not read the directory (the last view stays)";
            "weir_source_manifest_errors" => m.source.manifest_errors,
                "Manifest errors standing now (invalid files or objects, duplicates, unreadable paths)";
            "weir_source_objects" => m.source.objects,
                "Objects the Kubernetes API source holds, per kind";
            "weir_source_watch_restarts" => m.source.watch_restarts,
                "Cumulative failed lists or watches of the Kubernetes API source, each retried after a backoff";
            "weir_source_last_successful_list_timestamp_seconds" => m.source.last_list,
                "When the Kubernetes API source last completed a list of the kind (start, or re-list after 410 Gone)";
            "process_resident_memory_bytes" => m.process.resident,
                "Resident memory size in bytes";
            "process_virtual_memory_bytes" => m.process.virtual_memory,
                "Virtual memory size in bytes";
            "process_cpu_seconds" => m.process.cpu,
                "Total user and system CPU time spent in seconds";
            "process_open_fds" => m.process.open_fds,
                "Number of open file descriptors";
            "process_start_time_seconds" => m.process.start_time,
                "Start time of the process since unix epoch in seconds";
        }
        let mode_counter = match mode {
            "nftables" => Some((
                "kubeproxy_sync_proxy_rules_nftables_sync_failures",
                "Cumulative proxy nftables sync failures",
            )),
            "iptables" => Some((
                "kubeproxy_sync_proxy_rules_iptables_restore_failures",
                "Cumulative proxy iptables restore failures",
            )),
            _ => None,
        };
        if let Some((name, help)) = mode_counter {
            let c = Counter::default();
            r.register(name, help, c.clone());
            m.mode_failures = Some(c);
        }
        m
    }

    /// A change was seen and a sync is now wanted.
    pub fn sync_queued(&self) {
        self.last_queued.set(now_seconds());
    }

    /// Service and endpoint changes seen since the last call (counted as total and pending).
    pub fn record_changes(&self, services: usize, endpoints: usize) {
        self.service_changes.inc_by(services as u64);
        self.endpoint_changes.inc_by(endpoints as u64);
        self.service_changes_pending.inc_by(services as i64);
        self.endpoint_changes_pending.inc_by(endpoints as i64);
    }

    /// A sync succeeded: it consumed every pending change.
    pub fn observe_sync(&self, kind: SyncKind, elapsed: Duration) {
        let s = elapsed.as_secs_f64();
        self.sync.observe(s);
        match kind {
            SyncKind::Full => self.sync_full.observe(s),
            SyncKind::Partial | SyncKind::Noop => self.sync_partial.observe(s),
        }
        self.last_synced.set(now_seconds());
        self.service_changes_pending.set(0);
        self.endpoint_changes_pending.set(0);
    }

    /// A sync failed (the previous rules are still in place).
    pub fn sync_failed(&self) {
        self.sync_failures.inc();
        if let Some(c) = &self.mode_failures {
            c.inc();
        }
    }

    /// Time from a change (e.g. an EndpointSlice's last-change-trigger-time) to its rules
    /// being in place.
    pub fn observe_network_programming(&self, latency: Duration) {
        self.network_programming.observe(latency.as_secs_f64());
    }

    /// Service ports whose Local traffic policy finds no local endpoint although endpoints
    /// exist elsewhere (kube-proxy counts exactly those; ports with no endpoints at all are
    /// rejected, not "no local").
    pub fn record_plan(&self, plan: &Plan) {
        let (mut internal, mut external) = (0, 0);
        for sp in plan.services.values() {
            let (i, e) = Self::no_local_endpoints(sp);
            internal += i;
            external += e;
        }
        self.set_no_local_endpoints(internal, external);
    }

    /// What one service port adds to [`Self::record_plan`]'s (internal, external) counts (for
    /// callers that keep the counts up to date from plan diffs).
    pub fn no_local_endpoints(sp: &ServicePortPlan) -> (i64, i64) {
        if !sp.has_any_endpoints || !sp.local_endpoints.is_empty() {
            return (0, 0);
        }
        (
            i64::from(sp.internal_policy_local),
            i64::from(sp.external_policy_local),
        )
    }

    /// Sets the counts [`Self::record_plan`] computes.
    pub fn set_no_local_endpoints(&self, internal: i64, external: i64) {
        for (policy, n) in [("internal", internal), ("external", external)] {
            self.no_local_endpoints
                .get_or_create(&PolicyLabel {
                    traffic_policy: policy.into(),
                })
                .set(n);
        }
    }

    pub fn conntrack_deleted(&self, entries: usize) {
        self.conntrack_deleted.inc_by(entries as u64);
    }

    /// `/healthz` answered `code`.
    pub fn healthz_response(&self, code: u16) {
        self.healthz
            .get_or_create(&CodeLabel {
                code: code.to_string(),
            })
            .inc();
    }

    /// `/livez` answered `code`.
    pub fn livez_response(&self, code: u16) {
        self.livez
            .get_or_create(&CodeLabel {
                code: code.to_string(),
            })
            .inc();
    }

    /// A scan of the object source finished; `failed`: its directory could not be read.
    pub fn source_scanned(&self, duration: Duration, failed: bool) {
        self.source.scan_duration.observe(duration.as_secs_f64());
        if failed {
            self.source.scan_failures.inc();
        } else {
            self.source.last_success.set(now_seconds());
        }
    }

    /// A standing manifest error appeared (+1) or was resolved (-1).
    pub fn source_errors_changed(&self, delta: i64) {
        self.source.manifest_errors.inc_by(delta);
    }

    /// The API source completed a list of `kind` with `objects` objects.
    pub fn source_listed(&self, kind: &str, objects: usize) {
        let label = KindLabel { kind: kind.into() };
        self.source
            .last_list
            .get_or_create(&label)
            .set(now_seconds());
        self.source
            .objects
            .get_or_create(&label)
            .set(objects as i64);
    }

    /// The API source holds `objects` objects of `kind` now.
    pub fn source_objects(&self, kind: &str, objects: usize) {
        let label = KindLabel { kind: kind.into() };
        self.source
            .objects
            .get_or_create(&label)
            .set(objects as i64);
    }

    /// A list or watch of `kind` failed and will be retried.
    pub fn source_watch_restarted(&self, kind: &str) {
        let label = KindLabel { kind: kind.into() };
        self.source.watch_restarts.get_or_create(&label).inc();
    }

    fn refresh_process(&self) {
        let Some(s) = crate::process_stats::ProcessStats::read() else {
            return;
        };
        let p = &self.process;
        p.resident.set(s.resident_memory_bytes as i64);
        p.virtual_memory.set(s.virtual_memory_bytes as i64);
        p.open_fds.set(s.open_fds as i64);
        p.start_time.set(s.start_time_seconds);
        let more = s.cpu_seconds - p.cpu.get();
        if more > 0.0 {
            p.cpu.inc_by(more);
        }
    }

    /// The OpenMetrics text exposition (serve with [`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        self.refresh_process();
        let mut out = String::new();
        text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

/// Content type of [`ProxyMetrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;

    /// The value on the sample line `name value` of the exposition `text`.
    fn value<'a>(text: &'a str, name: &str) -> &'a str {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no sample {name:?} in\n{text}"))
    }

    #[test]
    fn api_source_figures_per_kind() {
        let m = ProxyMetrics::new("nftables");
        m.source_listed("Service", 3);
        m.source_objects("Service", 4);
        m.source_listed("Node", 1);
        m.source_watch_restarted("EndpointSlice");
        m.source_watch_restarted("EndpointSlice");
        let t = m.encode();
        for l in [
            "weir_source_objects{kind=\"Service\"} 4",
            "weir_source_objects{kind=\"Node\"} 1",
            "weir_source_watch_restarts_total{kind=\"EndpointSlice\"} 2",
        ] {
            assert!(t.lines().any(|x| x == l), "missing {l:?} in\n{t}");
        }
        let listed: f64 = value(
            &t,
            "weir_source_last_successful_list_timestamp_seconds{kind=\"Service\"}",
        )
        .parse()
        .unwrap();
        assert!(listed > 1.7e9, "{listed}");
    }

    #[test]
    fn names_and_values_follow_kube_proxy() {
        let m = ProxyMetrics::new("nftables");
        m.sync_queued();
        m.record_changes(2, 5);
        let t = m.encode();
        assert_eq!(
            value(&t, "kubeproxy_sync_proxy_rules_service_changes_pending"),
            "2"
        );
        assert_eq!(
            value(&t, "kubeproxy_sync_proxy_rules_endpoint_changes_total"),
            "5"
        );
        m.observe_sync(SyncKind::Full, Duration::from_millis(3));
        m.observe_sync(SyncKind::Partial, Duration::from_millis(1));
        m.sync_failed();
        m.conntrack_deleted(3);
        m.healthz_response(200);
        m.healthz_response(503);
        m.livez_response(200);
        let t = m.encode();
        for l in [
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending 0",
            "kubeproxy_sync_proxy_rules_duration_seconds_count 2",
            "kubeproxy_sync_full_proxy_rules_duration_seconds_count 1",
            "kubeproxy_sync_partial_proxy_rules_duration_seconds_count 1",
            "kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{le=\"0.004\"} 1",
            "kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{le=\"0.002\"} 0",
            "weir_proxy_sync_failures_total 1",
            "kubeproxy_sync_proxy_rules_nftables_sync_failures_total 1",
            "kubeproxy_conntrack_reconciler_deleted_entries_total 3",
            "kubeproxy_proxy_healthz_total{code=\"503\"} 1",
            "kubeproxy_proxy_livez_total{code=\"200\"} 1",
        ] {
            assert!(t.lines().any(|x| x == l), "missing {l:?} in\n{t}");
        }
        let ts: f64 = value(&t, "kubeproxy_sync_proxy_rules_last_timestamp_seconds")
            .parse()
            .unwrap();
        assert!(ts > 1.6e9, "{ts}");
        assert!(t.ends_with("# EOF\n"));
    }

    #[test]
    fn network_programming_has_kube_proxys_82_buckets() {
        let m = ProxyMetrics::new("iptables");
        m.observe_network_programming(Duration::from_secs(61));
        let t = m.encode();
        let buckets = t
            .lines()
            .filter(|l| l.starts_with("kubeproxy_network_programming_duration_seconds_bucket"))
            .count();
        assert_eq!(buckets, 2 + 59 + 12 + 7 + 1); // + the +Inf bucket
        assert!(t.contains("le=\"300.0\""), "{t}");
        assert!(t.contains("kubeproxy_sync_proxy_rules_iptables_restore_failures_total 0"));
        assert!(!t.contains("nftables_sync_failures"));
    }

    #[test]
    fn no_local_endpoints_counts_local_policy_ports_with_remote_endpoints_only() {
        use weir_model::{IpFamily, Protocol, ServicePortKey, ServicePortPlan, TopologyMode};
        let sp = |internal, external, any| ServicePortPlan {
            port: 80,
            frontends: vec![],
            cluster_endpoints: vec![],
            local_endpoints: vec![],
            affinity_timeout: None,
            internal_policy_local: internal,
            external_policy_local: external,
            health_check_node_port: None,
            topology: TopologyMode::None,
            has_any_endpoints: any,
        };
        let key = |n: &str| ServicePortKey {
            namespace: "d".into(),
            name: n.into(),
            port_name: "".into(),
            protocol: Protocol::Tcp,
            family: IpFamily::V4,
        };
        let plan = Plan {
            services: [
                (key("a"), sp(true, false, true)),
                (key("b"), sp(false, true, true)),
                (key("c"), sp(true, true, true)),
                (key("d"), sp(true, true, false)),
            ]
            .into_iter()
            .map(|(k, v)| (k, v.into()))
            .collect(),
            ..Default::default()
        };
        let m = ProxyMetrics::new("nftables");
        m.record_plan(&plan);
        let t = m.encode();
        assert!(t.contains(
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy=\"internal\"} 2"
        ));
        assert!(t.contains(
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy=\"external\"} 2"
        ));
    }

    #[test]
    fn source_and_process_metrics() {
        let m = ProxyMetrics::new("nftables");
        m.source_scanned(Duration::from_millis(3), false);
        m.source_scanned(Duration::from_millis(1), true);
        m.source_errors_changed(2);
        m.source_errors_changed(-1);
        let t = m.encode();
        assert_eq!(value(&t, "weir_source_scan_failures_total"), "1");
        assert_eq!(value(&t, "weir_source_scan_duration_seconds_count"), "2");
        assert_eq!(value(&t, "weir_source_manifest_errors"), "1");
        let ts: f64 = value(&t, "weir_source_last_successful_scan_timestamp_seconds")
            .parse()
            .unwrap();
        assert!((now_seconds() - ts).abs() < 60.0, "{ts}");
        for name in [
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_start_time_seconds",
            "process_cpu_seconds_total",
        ] {
            let v: f64 = value(&t, name).parse().unwrap();
            assert!(v > 0.0 || name.starts_with("process_cpu"), "{name} {v}");
        }
    }
}
