//! healthCheckNodePort servers (kube-proxy: pkg/proxy/healthcheck/service_health.go).
//!
//! A LoadBalancer service with externalTrafficPolicy Local gets a health check port; the
//! cloud load balancer probes it on every node and sends traffic only to nodes answering 200,
//! i.e. nodes with a ready local endpoint.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use weir_model::Plan;

use super::state::ProxyHealth;
use weir_http::{bind, respond, serve, Body, Handler, HttpRuntime, Response, Served};

/// `(namespace, name)` of a service.
pub type ServiceName = (String, String);

/// What [`ServiceHealthServers::sync`] wants for `plan`: each service with a
/// healthCheckNodePort, with its number of ready local endpoints (distinct IPs over all its
/// ports and families; serving-but-terminating ones do not count, so a draining node fails
/// the check, as with kube-proxy).
pub fn health_check_services(plan: &Plan) -> BTreeMap<ServiceName, (u16, usize)> {
    let mut ips: BTreeMap<ServiceName, (u16, BTreeSet<IpAddr>)> = BTreeMap::new();
    for (key, sp) in &plan.services {
        let Some(port) = sp.health_check_node_port else {
            continue;
        };
        let e = ips
            .entry((key.namespace.to_string(), key.name.to_string()))
            .or_insert_with(|| (port, BTreeSet::new()));
        let ready = sp.local_endpoints.iter().filter(|e| e.is_local && e.ready);
        e.1.extend(ready.map(|e| e.ip));
    }
    ips.into_iter()
        .map(|(k, (port, set))| (k, (port, set.len())))
        .collect()
}

struct Instance {
    port: u16,
    local_endpoints: Arc<AtomicUsize>,
    /// Dropped to close.
    listeners: Vec<Served>,
}

/// One HTTP listener per healthCheckNodePort, opened and closed by [`Self::sync`].
pub struct ServiceHealthServers {
    rt: HttpRuntime,
    health: Arc<ProxyHealth>,
    bind_ips: Vec<IpAddr>,
    services: BTreeMap<ServiceName, Instance>,
}

/// A health check port that could not be opened (retried at the next sync).
#[derive(Debug)]
pub struct OpenError {
    pub service: ServiceName,
    pub port: u16,
    pub error: io::Error,
}

impl ServiceHealthServers {
    /// Listeners go on each of `bind_ips` (the node's node-port addresses); empty means every
    /// address, IPv4 and IPv6 (`[::]`, or `0.0.0.0` where IPv6 is off). `health` adds the
    /// sync loop's health to each answer.
    pub fn new(rt: &HttpRuntime, bind_ips: Vec<IpAddr>, health: Arc<ProxyHealth>) -> Self {
        Self {
            rt: rt.clone(),
            health,
            bind_ips,
            services: BTreeMap::new(),
        }
    }

    /// Makes the open ports exactly `want` (service → (port, local endpoint count)): closes
    /// listeners of services gone or moved to another port, opens new ones — in the calling
    /// thread's network namespace — and updates the counts. Returns the ports that failed
    /// to open; those are tried again at the next call.
    pub fn sync(&mut self, want: &BTreeMap<ServiceName, (u16, usize)>) -> Vec<OpenError> {
        // Close first, so a port moving between services is free to reopen.
        self.services
            .retain(|name, inst| want.get(name).is_some_and(|(p, _)| *p == inst.port));
        let mut errors = Vec::new();
        for (name, &(port, count)) in want {
            if let Some(inst) = self.services.get(name) {
                inst.local_endpoints.store(count, Ordering::Relaxed);
                continue;
            }
            match self.open(name, port, count) {
                Ok(inst) => {
                    self.services.insert(name.clone(), inst);
                }
                Err(error) => errors.push(OpenError {
                    service: name.clone(),
                    port,
                    error,
                }),
            }
        }
        errors
    }

    /// The addresses each service's health check is served on.
    pub fn listening(&self) -> BTreeMap<ServiceName, Vec<SocketAddr>> {
        self.services
            .iter()
            .map(|(k, i)| (k.clone(), i.listeners.iter().map(Served::addr).collect()))
            .collect()
    }

    fn open(&self, name: &ServiceName, port: u16, count: usize) -> io::Result<Instance> {
        let local_endpoints = Arc::new(AtomicUsize::new(count));
        let handler: Handler = {
            let (name, n, health) = (name.clone(), local_endpoints.clone(), self.health.clone());
            Arc::new(move |_req| answer(&name, n.load(Ordering::Relaxed), health.is_healthy()))
        };
        let mut listeners = Vec::new();
        for l in self.bind(port)? {
            // On error the listeners opened so far are dropped, i.e. closed.
            listeners.push(serve(&self.rt, l, handler.clone())?);
        }
        Ok(Instance {
            port,
            local_endpoints,
            listeners,
        })
    }

    fn bind(&self, port: u16) -> io::Result<Vec<std::net::TcpListener>> {
        if self.bind_ips.is_empty() {
            // `[::]` is dual-stack on Linux unless net.ipv6.bindv6only is set.
            return match bind(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port))) {
                Ok(l) => Ok(vec![l]),
                Err(e) if e.kind() != io::ErrorKind::AddrInUse => {
                    Ok(vec![bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))?])
                }
                Err(e) => Err(e),
            };
        }
        self.bind_ips
            .iter()
            .map(|ip| bind(SocketAddr::new(*ip, port)))
            .collect()
    }
}

/// 200 when the node has a ready local endpoint and the proxy is healthy, else 503; the body
/// and headers are kube-proxy's. The weight header carries the endpoint count, for load
/// balancers that weigh nodes by it.
fn answer(name: &ServiceName, count: usize, proxy_healthy: bool) -> Response<Body> {
    let code = if count > 0 && proxy_healthy { 200 } else { 503 };
    let q = |s: &str| serde_json::to_string(s).expect("a string always serializes");
    let body = format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {},\n\t\t\"name\": {}\n\t}},\n\t\"localEndpoints\": {count},\n\t\"serviceProxyHealthy\": {proxy_healthy}\n}}",
        q(&name.0),
        q(&name.1)
    );
    let headers = [
        ("Content-Type", "application/json".to_string()),
        ("X-Content-Type-Options", "nosniff".to_string()),
        ("X-Load-Balancing-Endpoint-Weight", count.to_string()),
    ];
    respond(code, &headers, body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_model::{Endpoint, IpFamily, Protocol, ServicePortKey, ServicePortPlan, TopologyMode};

    fn ep(ip: &str, ready: bool) -> Endpoint {
        Endpoint {
            ip: ip.parse().unwrap(),
            port: 8080,
            is_local: true,
            ready,
            serving: true,
            terminating: !ready,
        }
    }

    fn port(
        name: &str,
        port_name: &str,
        hc: Option<u16>,
        local: Vec<Endpoint>,
    ) -> (ServicePortKey, ServicePortPlan) {
        (
            ServicePortKey {
                namespace: "web".into(),
                name: name.into(),
                port_name: port_name.into(),
                protocol: Protocol::Tcp,
                family: IpFamily::V4,
            },
            ServicePortPlan {
                port: 80,
                frontends: vec![],
                cluster_endpoints: vec![],
                local_endpoints: local,
                affinity_timeout: None,
                internal_policy_local: false,
                external_policy_local: hc.is_some(),
                health_check_node_port: hc,
                topology: TopologyMode::None,
                has_any_endpoints: true,
            },
        )
    }

    #[test]
    fn counts_distinct_ready_local_endpoints_per_service() {
        let plan = Plan {
            services: [
                port(
                    "lb",
                    "http",
                    Some(32000),
                    vec![ep("10.244.0.5", true), ep("10.244.0.6", false)],
                ),
                port(
                    "lb",
                    "https",
                    Some(32000),
                    vec![ep("10.244.0.5", true), ep("10.244.0.7", true)],
                ),
                port("draining", "", Some(32001), vec![ep("10.244.0.8", false)]),
                port("plain", "", None, vec![ep("10.244.0.9", true)]),
            ]
            .into_iter()
            .map(|(k, v)| (k, v.into()))
            .collect(),
            ..Default::default()
        };
        let want = health_check_services(&plan);
        assert_eq!(
            want.into_iter().collect::<Vec<_>>(),
            vec![
                (("web".into(), "draining".into()), (32001, 0)),
                (("web".into(), "lb".into()), (32000, 2)),
            ]
        );
    }

    #[test]
    fn body_is_kube_proxys() {
        let r = answer(&("ns".into(), "svc".into()), 2, true);
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["X-Load-Balancing-Endpoint-Weight"], "2");
        assert_eq!(answer(&("ns".into(), "svc".into()), 2, false).status(), 503);
        assert_eq!(answer(&("ns".into(), "svc".into()), 0, true).status(), 503);
    }
}
