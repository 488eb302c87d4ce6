//! Pure endpoint choice: round robin over the ready endpoints, ClientIP affinity, and the
//! dial schedule of kube-proxy's old userspace proxier.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// kube-proxy's `EndpointDialTimeouts` (pkg/proxy/userspace, until 1.26): a failed dial moves
/// on to the next endpoint with a longer timeout, so a dead backend costs a client at most
/// these waits while another endpoint is alive.
pub const DIAL_TIMEOUTS: [Duration; 4] = [
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
];

/// The endpoints of one listener and the state of its balancing.
#[derive(Debug, Default)]
pub struct Pool {
    endpoints: Vec<SocketAddr>,
    next: usize,
    /// sessionAffinity ClientIP timeout; `None`: no affinity.
    affinity: Option<Duration>,
    sticky: HashMap<IpAddr, (SocketAddr, Instant)>,
}

impl Pool {
    pub fn new(endpoints: Vec<SocketAddr>, affinity: Option<Duration>) -> Self {
        Pool {
            endpoints,
            affinity,
            ..Pool::default()
        }
    }

    /// Replaces the endpoints (a sync); affinity entries to endpoints that are gone lapse.
    pub fn update(&mut self, endpoints: Vec<SocketAddr>, affinity: Option<Duration>) {
        self.sticky.retain(|_, (ep, _)| endpoints.contains(ep));
        if affinity.is_none() {
            self.sticky.clear();
        }
        self.endpoints = endpoints;
        self.affinity = affinity;
    }

    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    /// The endpoint for a new connection from `client`: its affinity entry if it has a live
    /// one (and `fresh` is false), else the next in turn (recorded for affinity).
    pub fn pick(&mut self, client: IpAddr, now: Instant, fresh: bool) -> Option<SocketAddr> {
        if self.endpoints.is_empty() {
            return None;
        }
        if let (Some(ttl), false) = (self.affinity, fresh) {
            if let Some((ep, seen)) = self.sticky.get_mut(&client) {
                if now.duration_since(*seen) < ttl {
                    *seen = now;
                    return Some(*ep);
                }
            }
        }
        let ep = self.endpoints[self.next % self.endpoints.len()];
        self.next = (self.next + 1) % self.endpoints.len();
        if self.affinity.is_some() {
            self.sticky.insert(client, (ep, now));
        }
        Some(ep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eps(n: u8) -> Vec<SocketAddr> {
        (1..=n)
            .map(|i| SocketAddr::from(([10, 0, 0, i], 80)))
            .collect()
    }

    #[test]
    fn round_robin_visits_every_endpoint_in_turn() {
        let mut p = Pool::new(eps(3), None);
        let now = Instant::now();
        let c: IpAddr = [1, 1, 1, 1].into();
        let got: Vec<_> = (0..6).map(|_| p.pick(c, now, false).unwrap()).collect();
        assert_eq!(got, [eps(3), eps(3)].concat());
    }

    #[test]
    fn client_ip_affinity_sticks_until_it_lapses_or_a_dial_fails() {
        let mut p = Pool::new(eps(3), Some(Duration::from_secs(10)));
        let t0 = Instant::now();
        let (a, b): (IpAddr, IpAddr) = ([1, 1, 1, 1].into(), [2, 2, 2, 2].into());
        let first = p.pick(a, t0, false).unwrap();
        assert_eq!(p.pick(a, t0 + Duration::from_secs(5), false), Some(first));
        assert_ne!(p.pick(b, t0, false), Some(first));
        // A failed dial asks for a fresh endpoint: the next one, which then sticks.
        let retry = p.pick(a, t0, true).unwrap();
        assert_ne!(retry, first);
        assert_eq!(p.pick(a, t0, false), Some(retry));
        // Idle past the timeout: round robin again.
        let later = t0 + Duration::from_secs(30);
        assert_ne!(p.pick(a, later, false), Some(retry));
    }

    #[test]
    fn an_update_forgets_affinity_to_removed_endpoints() {
        let mut p = Pool::new(eps(2), Some(Duration::from_secs(10)));
        let now = Instant::now();
        let c: IpAddr = [1, 1, 1, 1].into();
        let first = p.pick(c, now, false).unwrap();
        let rest: Vec<_> = eps(2).into_iter().filter(|e| *e != first).collect();
        p.update(rest.clone(), Some(Duration::from_secs(10)));
        assert_eq!(p.pick(c, now, false), Some(rest[0]));
        p.update(vec![], None);
        assert_eq!(p.pick(c, now, false), None);
    }
}
