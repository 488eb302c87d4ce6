//! `/healthz`, `/livez`, `/metrics` and the healthCheckNodePort servers, with kube-proxy's
//! semantics, bodies and headers.
//!
//! HTTP runs on a dedicated tokio runtime ([`HttpRuntime`], from the `weir-http` crate, which
//! the node routes and DNS agents serve with too); the synchronous agent loop only
//! calls methods. Listeners are bound on the calling thread, so they open in that thread's
//! network namespace. Wiring in the agent loop:
//! ```ignore
//! let health = Arc::new(ProxyHealth::new(2 * sync_period));
//! let metrics = Arc::new(ProxyMetrics::new(backend.mode()));
//! let rt = HttpRuntime::new()?;
//! let _servers = ProxyServers::start(&rt, Some(healthz_addr), Some(metrics_addr),
//!                                    health.clone(), metrics.clone())?;
//! let mut hc = ServiceHealthServers::new(&rt, node_port_ips, health.clone());
//! // on every change seen:          health.queued_update(); metrics.sync_queued();
//! // after a successful sync(plan): health.updated();
//! //                                for e in hc.sync(&health_check_services(&plan)) { log e }
//! // on Node events:                health.set_node_eligible(!deleting);
//! ```

mod server;
mod service;
mod state;

pub use server::{OtherParts, ProxyServers};
pub use service::{health_check_services, OpenError, ServiceHealthServers, ServiceName};
pub use state::{go_time, HealthStatus, ProxyHealth, SourceCheck};
pub use weir_http::{HttpRuntime, MetricsServer, PathResponse, PathServer};
