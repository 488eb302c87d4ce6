//! The proxy's own health, as kube-proxy defines it (pkg/proxy/healthcheck/proxier_health.go).

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Health of the sync loop, shared between the loop and the HTTP servers.
///
/// Healthy means: a first sync was applied, and no change has been waiting for a sync longer
/// than the timeout (kube-proxy uses 2 × the sync period). Unlike kube-proxy, weir is not
/// healthy before its first sync: `/healthz` then tells load balancers and probes that the
/// node does not forward service traffic yet.
pub struct ProxyHealth {
    timeout: Duration,
    state: Mutex<State>,
    source: Mutex<Option<SourceCheck>>,
}

/// Asked on every health request: `Err(why)` while the object source is not current (no
/// complete view yet, unreadable, stuck or stale). Evaluated at request time, so a source
/// that hangs is noticed although it reports nothing.
pub type SourceCheck = Box<dyn Fn() -> Result<(), String> + Send + Sync>;

impl std::fmt::Debug for ProxyHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyHealth")
            .field("timeout", &self.timeout)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct State {
    last_updated: Option<SystemTime>,
    oldest_pending: Option<Instant>,
    node_eligible: bool,
}

/// One reading of [`ProxyHealth`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthStatus {
    /// The sync loop is healthy and its source current (node eligibility not considered).
    pub healthy: bool,
    /// The sync loop itself is working (`/livez`): nothing is late, and either a sync was
    /// applied or the loop is deliberately waiting for its source (keeping the kernel's rules).
    pub alive: bool,
    /// Why the object source is not current, if it is not.
    pub source_error: Option<String>,
    pub last_updated: Option<SystemTime>,
    pub now: SystemTime,
    pub node_eligible: bool,
}

impl ProxyHealth {
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            state: Mutex::new(State {
                last_updated: None,
                oldest_pending: None,
                // Eligible until a Node event says otherwise (as kube-proxy).
                node_eligible: true,
            }),
            source: Mutex::new(None),
        }
    }

    /// Makes health depend on the object source too (see [`SourceCheck`]).
    pub fn set_source_check(&self, check: SourceCheck) {
        *self.source.lock().unwrap_or_else(|p| p.into_inner()) = Some(check);
    }

    fn source_error(&self) -> Option<String> {
        let check = self.source.lock().unwrap_or_else(|p| p.into_inner());
        check.as_ref().and_then(|c| c().err())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state stays consistent under a panic elsewhere: every update is one assignment.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A change arrived that needs a sync. Only the oldest pending change counts.
    pub fn queued_update(&self) {
        self.lock().oldest_pending.get_or_insert_with(Instant::now);
    }

    /// A sync succeeded: the rules reflect every change queued before it started.
    pub fn updated(&self) {
        let mut s = self.lock();
        s.oldest_pending = None;
        s.last_updated = Some(SystemTime::now());
    }

    /// False while the node is being deleted (deletion timestamp, or the cluster
    /// autoscaler's `ToBeDeletedByClusterAutoscaler` taint): `/healthz` then fails so load
    /// balancers drain the node, while `/livez` keeps passing.
    pub fn set_node_eligible(&self, eligible: bool) {
        self.lock().node_eligible = eligible;
    }

    pub fn status(&self) -> HealthStatus {
        let source_error = self.source_error();
        let s = self.lock();
        let late = s
            .oldest_pending
            .is_some_and(|t| t.elapsed() >= self.timeout);
        HealthStatus {
            healthy: s.last_updated.is_some() && !late && source_error.is_none(),
            alive: !late && (s.last_updated.is_some() || source_error.is_some()),
            source_error,
            last_updated: s.last_updated,
            now: SystemTime::now(),
            node_eligible: s.node_eligible,
        }
    }

    pub fn is_healthy(&self) -> bool {
        self.status().healthy
    }
}

/// A time as Go's `time.Time.String()` prints it in UTC (what kube-proxy's JSON carries):
/// `2006-01-02 15:04:05.999999999 +0000 UTC`, trailing zeros of the fraction dropped.
/// `None` is Go's zero time.
pub fn go_time(t: Option<SystemTime>) -> String {
    let Some(d) = t.and_then(|t| t.duration_since(UNIX_EPOCH).ok()) else {
        return "0001-01-01 00:00:00 +0000 UTC".into();
    };
    let secs = d.as_secs();
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let (y, m, day) = civil_from_days(days);
    let mut frac = format!("{:09}", d.subsec_nanos());
    while frac.ends_with('0') {
        frac.pop();
    }
    let frac = if frac.is_empty() {
        String::new()
    } else {
        format!(".{frac}")
    };
    format!(
        "{y:04}-{m:02}-{day:02} {:02}:{:02}:{:02}{frac} +0000 UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthy_only_after_a_sync_and_while_nothing_is_late() {
        let h = ProxyHealth::new(Duration::from_secs(3600));
        assert!(!h.is_healthy(), "no sync yet");
        h.updated();
        assert!(h.is_healthy());
        h.queued_update();
        assert!(h.is_healthy(), "pending, not late");
        h.set_node_eligible(false);
        let s = h.status();
        assert!(
            s.healthy && !s.node_eligible,
            "eligibility is reported apart"
        );

        let late = ProxyHealth::new(Duration::ZERO);
        late.updated();
        late.queued_update();
        assert!(!late.is_healthy());
        late.updated();
        assert!(late.is_healthy());
    }

    #[test]
    fn a_failing_source_fails_health_but_not_liveness() {
        let h = ProxyHealth::new(Duration::from_secs(3600));
        let failing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let f = failing.clone();
        h.set_source_check(Box::new(move || {
            if f.load(std::sync::atomic::Ordering::SeqCst) {
                Err("manifest source failing: /m: cannot read".into())
            } else {
                Ok(())
            }
        }));
        // Before any sync, waiting for the source: not ready, but alive (no restart wanted).
        let s = h.status();
        assert!(!s.healthy && s.alive);
        assert!(s.source_error.unwrap().contains("/m"));
        h.updated();
        assert!(!h.is_healthy(), "synced, but the source is failing");
        failing.store(false, std::sync::atomic::Ordering::SeqCst);
        let s = h.status();
        assert!(s.healthy && s.alive && s.source_error.is_none());
    }

    #[test]
    fn go_time_format() {
        assert_eq!(go_time(None), "0001-01-01 00:00:00 +0000 UTC");
        let t = UNIX_EPOCH + Duration::new(1_700_000_000, 120_000_000);
        assert_eq!(go_time(Some(t)), "2023-11-14 22:13:20.12 +0000 UTC");
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400); // leap day
        assert_eq!(go_time(Some(t)), "2000-02-29 00:00:00 +0000 UTC");
    }
}
