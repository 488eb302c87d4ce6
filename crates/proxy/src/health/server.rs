//! `/healthz`, `/livez` (the healthz address) and `/metrics` (the metrics address).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use super::state::{go_time, ProxyHealth};
use crate::metrics::{self, ProxyMetrics};
use weir_http::{bind, respond, serve, Body, Handler, HttpRuntime, Response, Served};

/// Each other part's name and state (`Err`: why it is unhealthy).
pub type PartStates = Vec<(&'static str, Result<(), String>)>;

/// The node agent's other parts (node routes, NetworkPolicy), answered beside the proxy's
/// own state: `/healthz` fails when any of them is unhealthy and names it, `/metrics` carries
/// their metrics after the proxy's.
#[derive(Clone, Default)]
pub struct OtherParts {
    /// Each part's name and state (`Err`: why it is unhealthy).
    pub health: Option<Arc<dyn Fn() -> PartStates + Send + Sync>>,
    /// The parts' metrics, each an OpenMetrics text (its `# EOF` is dropped here).
    pub metrics: Option<Arc<dyn Fn() -> Vec<String> + Send + Sync>>,
}

/// The proxy's own HTTP endpoints. Dropping it closes them.
pub struct ProxyServers {
    healthz: Option<Served>,
    metrics: Option<Served>,
}

impl ProxyServers {
    /// Binds `healthz` (serving `/healthz`, `/livez`) and `metrics` (serving `/metrics`) in the
    /// calling thread's network namespace; `None` disables one. The same address for both
    /// serves all three paths on one listener. Port 0 picks a free port each (see the `*_addr`
    /// methods).
    pub fn start(
        rt: &HttpRuntime,
        healthz: Option<SocketAddr>,
        metrics: Option<SocketAddr>,
        health: Arc<ProxyHealth>,
        proxy_metrics: Arc<ProxyMetrics>,
    ) -> io::Result<Self> {
        Self::start_with(
            rt,
            healthz,
            metrics,
            health,
            proxy_metrics,
            OtherParts::default(),
        )
    }

    /// [`ProxyServers::start`], answering for the agent's `others` too.
    pub fn start_with(
        rt: &HttpRuntime,
        healthz: Option<SocketAddr>,
        metrics: Option<SocketAddr>,
        health: Arc<ProxyHealth>,
        proxy_metrics: Arc<ProxyMetrics>,
        others: OtherParts,
    ) -> io::Result<Self> {
        let handler = |health_paths: bool, metrics_path: bool| -> Handler {
            let (h, m, o) = (health.clone(), proxy_metrics.clone(), others.clone());
            Arc::new(move |req| route(req.uri().path(), health_paths, metrics_path, &h, &m, &o))
        };
        // Port 0 twice means two free ports, not one.
        let shared = healthz.is_some_and(|a| a.port() != 0) && healthz == metrics;
        let healthz = match healthz {
            Some(a) => Some(serve(rt, bind(a)?, handler(true, shared))?),
            None => None,
        };
        let metrics = match metrics {
            Some(a) if !shared => Some(serve(rt, bind(a)?, handler(false, true))?),
            _ => None,
        };
        Ok(Self { healthz, metrics })
    }

    /// Where `/healthz` is served (the bound address, with the real port).
    pub fn healthz_addr(&self) -> Option<SocketAddr> {
        self.healthz.as_ref().map(Served::addr)
    }

    /// Where `/metrics` is served.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics
            .as_ref()
            .or(self.healthz.as_ref())
            .map(Served::addr)
    }
}

fn json_headers() -> Vec<(&'static str, String)> {
    vec![
        ("Content-Type", "application/json".into()),
        ("X-Content-Type-Options", "nosniff".into()),
    ]
}

fn route(
    path: &str,
    health_paths: bool,
    metrics_path: bool,
    health: &ProxyHealth,
    m: &ProxyMetrics,
    others: &OtherParts,
) -> Response<Body> {
    match path {
        "/healthz" if health_paths => healthz(health, m, others),
        "/livez" if health_paths => livez(health, m),
        "/metrics" if metrics_path => respond(
            200,
            &[("Content-Type", metrics::CONTENT_TYPE.into())],
            all_metrics(m, others),
        ),
        _ => respond(404, &[], "404 page not found\n".into()),
    }
}

/// Fails also while the node is being deleted, so load balancers drain it, and while the
/// object source is not current. The body is kube-proxy's, byte for byte in shape; when the
/// source is at fault a `reason` field says why. When healthy, `lastUpdated` is the current
/// time (a kube-proxy compatibility quirk: it used to be the last loop run). In the node
/// agent, a `parts` field gives each part's state, and any unhealthy part fails it.
fn healthz(health: &ProxyHealth, m: &ProxyMetrics, others: &OtherParts) -> Response<Body> {
    let s = health.status();
    let parts = others.health.as_ref().map(|h| h()).unwrap_or_default();
    let ok = s.healthy && s.node_eligible && parts.iter().all(|(_, p)| p.is_ok());
    let code = if ok { 200 } else { 503 };
    m.healthz_response(code);
    let last = if ok { Some(s.now) } else { s.last_updated };
    let reason = s
        .source_error
        .as_ref()
        .map(|r| format!(", \"reason\": {}", serde_json::Value::from(r.as_str())))
        .unwrap_or_default();
    let parts = parts_field(s.healthy, s.source_error.as_deref(), &parts);
    let body = format!(
        r#"{{"lastUpdated": "{}","currentTime": "{}", "nodeEligible": {}{reason}{parts}}}"#,
        go_time(last),
        go_time(Some(s.now)),
        s.node_eligible
    );
    respond(code, &json_headers(), body)
}

/// `, "parts": {"proxy": "ok", "policy": "<why not>"}` when the agent runs other parts.
fn parts_field(
    proxy_healthy: bool,
    proxy_reason: Option<&str>,
    others: &[(&'static str, Result<(), String>)],
) -> String {
    if others.is_empty() {
        return String::new();
    }
    let mut map = serde_json::Map::new();
    let proxy = match (proxy_healthy, proxy_reason) {
        (true, _) => "ok".to_string(),
        (false, Some(r)) => r.to_string(),
        (false, None) => "rules not synced within twice the sync period".to_string(),
    };
    map.insert("proxy".into(), proxy.into());
    for (name, state) in others {
        let text = match state {
            Ok(()) => "ok".to_string(),
            Err(why) => why.clone(),
        };
        map.insert((*name).into(), text.into());
    }
    format!(", \"parts\": {}", serde_json::Value::Object(map))
}

/// The proxy's metrics, then the other parts', as one OpenMetrics text (one `# EOF`).
fn all_metrics(m: &ProxyMetrics, others: &OtherParts) -> String {
    let mut text = m.encode();
    let Some(more) = others.metrics.as_ref() else {
        return text;
    };
    const EOF: &str = "# EOF\n";
    text.truncate(text.strip_suffix(EOF).map_or(text.len(), str::len));
    for part in more() {
        text.push_str(part.strip_suffix(EOF).unwrap_or(&part));
    }
    text.push_str(EOF);
    text
}

/// Liveness of the sync loop only: a node being drained is still alive, and so is a loop
/// that waits for its object source while keeping the rules in the kernel.
fn livez(health: &ProxyHealth, m: &ProxyMetrics) -> Response<Body> {
    let s = health.status();
    let code = if s.alive { 200 } else { 503 };
    m.livez_response(code);
    let last = if s.alive { Some(s.now) } else { s.last_updated };
    let body = format!(
        r#"{{"lastUpdated": "{}","currentTime": "{}"}}"#,
        go_time(last),
        go_time(Some(s.now))
    );
    respond(code, &json_headers(), body)
}
