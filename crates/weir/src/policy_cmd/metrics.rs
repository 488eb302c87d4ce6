//! `weir policy`'s `/metrics`: what is enforced (local pods, isolated pods per direction,
//! chains and rules in the table), how long syncs take and how long a change takes to reach
//! the kernel, sync failures, and the conversion warnings the current objects carry.

use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::{text, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use weir_policy::agent::Synced;
use weir_policy::backend::SyncKind;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabel {
    direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

pub struct PolicyMetrics {
    registry: Registry,
    local_pods: Gauge,
    isolated: Family<DirectionLabel, Gauge>,
    chains: Gauge,
    rules: Gauge,
    syncs: Family<KindLabel, Counter>,
    sync_errors: Counter,
    sync_duration: Histogram,
    programming: Histogram,
    warnings: Gauge,
    last_sync: Gauge<f64, AtomicU64>,
}

/// 1 ms to 16 s.
fn latency_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

impl PolicyMetrics {
    pub fn new() -> Self {
        let m = PolicyMetrics {
            registry: Registry::default(),
            local_pods: Gauge::default(),
            isolated: Family::default(),
            chains: Gauge::default(),
            rules: Gauge::default(),
            syncs: Family::default(),
            sync_errors: Counter::default(),
            sync_duration: latency_buckets(),
            programming: latency_buckets(),
            warnings: Gauge::default(),
            last_sync: Gauge::default(),
        };
        let mut r = Registry::default();
        r.register(
            "weir_policy_local_pods",
            "Live pods on this node in their own network namespace (the pods policy can apply to)",
            m.local_pods.clone(),
        );
        r.register(
            "weir_policy_pods_isolated",
            "Local pods a NetworkPolicy isolates, per direction (their traffic in that direction is allow-listed)",
            m.isolated.clone(),
        );
        r.register(
            "weir_policy_chains",
            "Per-pod chains in table inet weir-policy",
            m.chains.clone(),
        );
        r.register(
            "weir_policy_rules",
            "nftables rules in table inet weir-policy",
            m.rules.clone(),
        );
        r.register(
            "weir_policy_syncs",
            "Successful syncs, by kind (full: the whole table; diff: what changed; noop)",
            m.syncs.clone(),
        );
        r.register(
            "weir_policy_sync_errors",
            "Syncs that failed (the rules before them stayed; the next writes the whole table)",
            m.sync_errors.clone(),
        );
        r.register(
            "weir_policy_sync_duration_seconds",
            "Planning and writing one sync",
            m.sync_duration.clone(),
        );
        r.register(
            "weir_policy_network_programming_duration_seconds",
            "From a change reaching the agent to the rules being in the kernel",
            m.programming.clone(),
        );
        r.register(
            "weir_policy_conversion_warnings",
            "Problems in the current Pods and NetworkPolicies that weir enforces in a safe reading instead (see the log)",
            m.warnings.clone(),
        );
        r.register(
            "weir_policy_last_sync_timestamp_seconds",
            "When the last sync succeeded (Unix time)",
            m.last_sync.clone(),
        );
        PolicyMetrics { registry: r, ..m }
    }

    pub fn synced(&self, s: &Synced<'_>) {
        let plan = s.plan;
        let count = |f: &dyn Fn(&weir_policy::PodProgram) -> bool| {
            plan.pods.values().filter(|p| f(p)).count() as i64
        };
        self.local_pods.set(plan.pods.len() as i64);
        for (direction, n) in [
            ("ingress", count(&|p| p.ingress.is_some())),
            ("egress", count(&|p| p.egress.is_some())),
        ] {
            self.isolated
                .get_or_create(&DirectionLabel { direction })
                .set(n);
        }
        self.chains.set(s.report.chains as i64);
        self.rules.set(s.report.rules as i64);
        let kind = match s.report.kind {
            SyncKind::Full => "full",
            SyncKind::Diff => "diff",
            SyncKind::Noop => "noop",
        };
        self.syncs.get_or_create(&KindLabel { kind }).inc();
        self.sync_duration.observe(s.duration.as_secs_f64());
        if let Some(d) = s.change_to_rules {
            self.programming.observe(d.as_secs_f64());
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        self.last_sync.set(now.as_secs_f64());
    }

    pub fn failed(&self) {
        self.sync_errors.inc();
    }

    pub fn warnings(&self, total: usize) {
        self.warnings.set(total as i64);
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_policy::backend::SyncReport;
    use weir_policy::{ObjectKey, PodProgram, PolicyPlan, Program};

    #[test]
    fn what_is_enforced_and_how_syncs_went() {
        let m = PolicyMetrics::new();
        let mut plan = PolicyPlan {
            node: "n1".into(),
            ..Default::default()
        };
        for (name, ingress, egress) in [("a", true, false), ("b", true, true), ("c", false, false)]
        {
            plan.pods.insert(
                ObjectKey::new("shop", name),
                std::sync::Arc::new(PodProgram {
                    ips: vec![],
                    ingress: ingress.then(Program::default),
                    egress: egress.then(Program::default),
                }),
            );
        }
        let report = SyncReport {
            kind: SyncKind::Full,
            elapsed: Duration::from_millis(3),
            chains: 3,
            rules: 14,
            chains_written: 3,
            script_bytes: 1000,
        };
        m.synced(&Synced {
            plan: &plan,
            report: &report,
            duration: Duration::from_millis(5),
            change_to_rules: Some(Duration::from_millis(700)),
        });
        m.failed();
        m.warnings(2);
        let text = m.encode();
        for line in [
            "weir_policy_local_pods 3\n",
            "weir_policy_pods_isolated{direction=\"ingress\"} 2\n",
            "weir_policy_pods_isolated{direction=\"egress\"} 1\n",
            "weir_policy_chains 3\n",
            "weir_policy_rules 14\n",
            "weir_policy_syncs_total{kind=\"full\"} 1\n",
            "weir_policy_sync_errors_total 1\n",
            "weir_policy_sync_duration_seconds_count 1\n",
            "weir_policy_network_programming_duration_seconds_count 1\n",
            "weir_policy_conversion_warnings 2\n",
        ] {
            assert!(text.contains(line), "{line} not in {text}");
        }
    }
}
