//! Pure: what must change to bring the kernel's virtual servers (as dumped) to the desired
//! ones, touching only what differs, with kube-proxy's graceful termination for real
//! servers that leave.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use weir_model::Protocol;

use super::netlink::{RealServer, RealServerState, Request, ServiceKey, ServiceSpec};
use super::render::VirtualServer;

/// A virtual server as the kernel holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedService {
    pub spec: ServiceSpec,
    pub real_servers: Vec<RealServerState>,
}

/// A real server being drained: which, and since when.
pub type Draining = BTreeMap<(ServiceKey, IpAddr, u16), Instant>;

/// The requests that turn `observed` into `desired`, in a safe order (services before
/// their real servers, deletions of real servers before those of services).
///
/// * `observed` must hold every virtual server `desired` names that the kernel has;
///   observed services missing from `desired` are deleted only when `owned` says they are
///   weir's (their address is a service or node address weir manages).
/// * A real server that is no longer desired is drained: set to weight 0 (no new
///   connections), then deleted once it has no connections or `timeout` has passed since
///   the drain began; UDP and SCTP ones are deleted at once (`expire_nodest_conn` ends
///   their flows). `draining` remembers drain start times across syncs.
pub fn requests(
    desired: &BTreeMap<ServiceKey, VirtualServer>,
    observed: &BTreeMap<ServiceKey, ObservedService>,
    owned: impl Fn(&ServiceKey) -> bool,
    draining: &mut Draining,
    now: Instant,
    timeout: Duration,
) -> Vec<Request> {
    let mut out = Vec::new();
    let mut deletes = Vec::new();
    for (key, vs) in desired {
        let Some(obs) = observed.get(key) else {
            out.push(Request::NewService(*key, vs.spec.clone()));
            out.extend(vs.real_servers.iter().map(|rs| Request::NewDest(*key, *rs)));
            draining.retain(|(k, _, _), _| k != key);
            continue;
        };
        if obs.spec != vs.spec {
            out.push(Request::SetService(*key, vs.spec.clone()));
        }
        let held: BTreeMap<(IpAddr, u16), &RealServerState> = obs
            .real_servers
            .iter()
            .map(|r| ((r.server.addr, r.server.port), r))
            .collect();
        for rs in &vs.real_servers {
            draining.remove(&(*key, rs.addr, rs.port));
            match held.get(&(rs.addr, rs.port)) {
                None => out.push(Request::NewDest(*key, *rs)),
                Some(h) if h.server.weight != rs.weight => out.push(Request::SetDest(*key, *rs)),
                Some(_) => {}
            }
        }
        let wanted: BTreeSet<(IpAddr, u16)> =
            vs.real_servers.iter().map(|r| (r.addr, r.port)).collect();
        for (id, h) in held.iter().filter(|(id, _)| !wanted.contains(id)) {
            let since = *draining.entry((*key, id.0, id.1)).or_insert(now);
            let graceful = key.protocol == Protocol::Tcp;
            let busy = h.active + h.inactive > 0;
            if graceful && busy && now.duration_since(since) < timeout {
                if h.server.weight != 0 {
                    out.push(Request::SetDest(
                        *key,
                        RealServer {
                            weight: 0,
                            ..h.server
                        },
                    ));
                }
            } else {
                deletes.push(Request::DelDest(*key, h.server));
                draining.remove(&(*key, id.0, id.1));
            }
        }
    }
    out.extend(deletes);
    for key in observed
        .keys()
        .filter(|k| !desired.contains_key(k) && owned(k))
    {
        out.push(Request::DelService(*key));
        draining.retain(|(k, _, _), _| k != key);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(port: u16) -> ServiceKey {
        ServiceKey {
            protocol: Protocol::Tcp,
            addr: "10.96.0.10".parse().unwrap(),
            port,
        }
    }
    fn rs(last: u8, weight: u32) -> RealServer {
        RealServer {
            addr: format!("10.244.0.{last}").parse().unwrap(),
            port: 8080,
            weight,
        }
    }
    fn spec() -> ServiceSpec {
        ServiceSpec {
            scheduler: "rr".into(),
            persistence: None,
        }
    }
    fn vs(rss: &[RealServer]) -> VirtualServer {
        VirtualServer {
            spec: spec(),
            real_servers: rss.iter().copied().collect(),
        }
    }
    fn obs(rss: &[(RealServer, u32)]) -> ObservedService {
        ObservedService {
            spec: spec(),
            real_servers: rss
                .iter()
                .map(|(s, c)| RealServerState {
                    server: *s,
                    active: *c,
                    inactive: 0,
                })
                .collect(),
        }
    }
    const T: Duration = Duration::from_secs(60);

    #[test]
    fn unchanged_state_needs_nothing_and_new_ones_are_added() {
        let desired = BTreeMap::from([(key(80), vs(&[rs(1, 1)])), (key(81), vs(&[rs(2, 1)]))]);
        let observed = BTreeMap::from([(key(80), obs(&[(rs(1, 1), 3)]))]);
        let mut d = Draining::new();
        let r = requests(&desired, &observed, |_| true, &mut d, Instant::now(), T);
        assert_eq!(
            r,
            vec![
                Request::NewService(key(81), spec()),
                Request::NewDest(key(81), rs(2, 1))
            ]
        );
    }

    #[test]
    fn a_leaving_busy_tcp_real_server_drains_then_goes() {
        let desired = BTreeMap::from([(key(80), vs(&[rs(1, 1)]))]);
        let mut d = Draining::new();
        let t0 = Instant::now();
        let busy = BTreeMap::from([(key(80), obs(&[(rs(1, 1), 0), (rs(2, 1), 2)]))]);
        let r = requests(&desired, &busy, |_| true, &mut d, t0, T);
        assert_eq!(r, vec![Request::SetDest(key(80), rs(2, 0))]);
        // Drained to weight 0, still busy: nothing more to do.
        let zero = BTreeMap::from([(key(80), obs(&[(rs(1, 1), 0), (rs(2, 0), 2)]))]);
        assert!(requests(&desired, &zero, |_| true, &mut d, t0, T).is_empty());
        // Its connections are gone: deleted.
        let idle = BTreeMap::from([(key(80), obs(&[(rs(1, 1), 0), (rs(2, 0), 0)]))]);
        let r = requests(&desired, &idle, |_| true, &mut d, t0, T);
        assert_eq!(r, vec![Request::DelDest(key(80), rs(2, 0))]);
        assert!(d.is_empty());
        // Still busy but past the timeout: deleted anyway.
        requests(&desired, &busy, |_| true, &mut d, t0, T);
        let r = requests(&desired, &zero, |_| true, &mut d, t0 + T, T);
        assert_eq!(r, vec![Request::DelDest(key(80), rs(2, 0))]);
    }

    #[test]
    fn udp_real_servers_go_at_once_and_a_returning_one_is_restored() {
        let mut k = key(53);
        k.protocol = Protocol::Udp;
        let desired = BTreeMap::from([(k, vs(&[rs(1, 1)]))]);
        let observed = BTreeMap::from([(k, obs(&[(rs(1, 0), 0), (rs(2, 1), 5)]))]);
        let mut d = Draining::new();
        let r = requests(&desired, &observed, |_| true, &mut d, Instant::now(), T);
        // rs 1 was draining (weight 0) and is wanted again: weight back to 1.
        assert_eq!(
            r,
            vec![Request::SetDest(k, rs(1, 1)), Request::DelDest(k, rs(2, 1))]
        );
    }

    #[test]
    fn only_owned_strangers_are_deleted() {
        let desired = BTreeMap::new();
        let observed = BTreeMap::from([(key(80), obs(&[])), (key(81), obs(&[]))]);
        let mut d = Draining::new();
        let r = requests(
            &desired,
            &observed,
            |k| k.port == 80,
            &mut d,
            Instant::now(),
            T,
        );
        assert_eq!(r, vec![Request::DelService(key(80))]);
    }
}
