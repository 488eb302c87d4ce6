//! What the agent's parts report together: each part's health (with why not) and metrics,
//! for the proxy's `/healthz` and `/metrics` or, without the proxy, the agent's own.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use tracing::info;
use weir_http::{HttpRuntime, PathResponse, PathServer};
use weir_proxy::health::OtherParts;

type Check = Box<dyn Fn() -> Result<(), String> + Send + Sync>;
type Encode = Box<dyn Fn() -> String + Send + Sync>;

/// The listeners a command with `--healthz-bind-address` and `--metrics-bind-address` opens:
/// (address, serves health, serves metrics); one listener for both when the two name the same
/// address (port 0 twice means two free ports, not one).
pub fn listeners(
    healthz: Option<SocketAddr>,
    metrics: Option<SocketAddr>,
) -> Vec<(SocketAddr, bool, bool)> {
    let shared = healthz.is_some_and(|a| a.port() != 0) && healthz == metrics;
    let mut wanted = Vec::new();
    if let Some(a) = healthz {
        wanted.push((a, true, shared));
    }
    if let Some(a) = metrics.filter(|_| !shared) {
        wanted.push((a, false, true));
    }
    wanted
}

/// The flag that named `addr`, for a listener that cannot be bound.
pub fn listen_flag(health: bool, addr: SocketAddr) -> String {
    let flag = match health {
        true => "--healthz-bind-address",
        false => "--metrics-bind-address",
    };
    format!("{flag} {addr} (another address, or \"\" to turn it off)")
}

/// The parts other than the proxy, as registered at start, and the ones that stopped.
#[derive(Default)]
pub struct Parts {
    parts: Vec<(&'static str, Check, Encode)>,
    stopped: Mutex<BTreeMap<&'static str, String>>,
}

impl Parts {
    /// Adds a part: its state (`Err`: why it is unhealthy) and its metrics text.
    pub fn add(
        &mut self,
        name: &'static str,
        check: impl Fn() -> Result<(), String> + Send + Sync + 'static,
        encode: impl Fn() -> String + Send + Sync + 'static,
    ) {
        self.parts.push((name, Box::new(check), Box::new(encode)));
    }

    /// `name`'s loop ended with `error`: it is reported unhealthy from now on.
    pub fn stopped(&self, name: &'static str, error: String) {
        self.stopped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name, error);
    }

    /// Each part's state now.
    pub fn states(&self) -> Vec<(&'static str, Result<(), String>)> {
        let stopped = self.stopped.lock().unwrap_or_else(|e| e.into_inner());
        self.parts
            .iter()
            .map(|(name, check, _)| {
                let state = match stopped.get(name) {
                    Some(e) => Err(format!("stopped: {e}")),
                    None => check(),
                };
                (*name, state)
            })
            .collect()
    }

    pub fn metrics(&self) -> Vec<String> {
        self.parts.iter().map(|(_, _, encode)| encode()).collect()
    }

    /// The hooks the proxy's servers answer with.
    pub fn for_proxy(self: &Arc<Self>) -> OtherParts {
        let (h, m) = (self.clone(), self.clone());
        OtherParts {
            health: Some(Arc::new(move || h.states())),
            metrics: Some(Arc::new(move || m.metrics())),
        }
    }
}

/// `/healthz`: 200 "ok" when every part is, else 503 naming each part that is not.
fn health_answer(states: &[(&'static str, Result<(), String>)]) -> (u16, String) {
    let bad: Vec<String> = states
        .iter()
        .filter_map(|(name, s)| s.as_ref().err().map(|why| format!("{name}: {why}")))
        .collect();
    if bad.is_empty() {
        (200, "ok\n".into())
    } else {
        (503, bad.join("\n") + "\n")
    }
}

/// The parts' metrics as one OpenMetrics text (one `# EOF`).
fn joined(texts: Vec<String>) -> String {
    const EOF: &str = "# EOF\n";
    let mut out = String::new();
    for t in texts {
        out.push_str(t.strip_suffix(EOF).unwrap_or(&t));
    }
    out + EOF
}

/// The agent's own listeners when it runs no proxy (which would serve these itself).
pub struct Served {
    _servers: Vec<PathServer>,
    _runtime: HttpRuntime,
}

/// Serves `/healthz` and `/livez` at `healthz` and `/metrics` at `metrics` (one listener
/// when they are the same address).
pub fn serve(
    parts: &Arc<Parts>,
    healthz: Option<SocketAddr>,
    metrics: Option<SocketAddr>,
) -> anyhow::Result<Served> {
    let runtime = HttpRuntime::new().context("HTTP runtime")?;
    let mut servers = Vec::new();
    for (addr, with_health, with_metrics) in listeners(healthz, metrics) {
        let parts = parts.clone();
        let server = PathServer::start(&runtime, addr, move |path| -> Option<PathResponse> {
            const TEXT: &str = "text/plain; charset=utf-8";
            match path {
                "/healthz" if with_health => {
                    let (code, body) = health_answer(&parts.states());
                    Some((code, TEXT, body))
                }
                "/livez" if with_health => Some((200, TEXT, "ok\n".into())),
                "/metrics" if with_metrics => Some((
                    200,
                    weir_proxy::metrics::CONTENT_TYPE,
                    joined(parts.metrics()),
                )),
                _ => None,
            }
        })?;
        info!(addr = %server.addr(), "serving the agent's /healthz, /livez, /metrics");
        servers.push(server);
    }
    Ok(Served {
        _servers: servers,
        _runtime: runtime,
    })
}

#[cfg(test)]
mod listener_tests {
    use super::listeners;

    #[test]
    fn one_listener_for_one_address_and_two_for_port_zero() {
        let a = "127.0.0.1:9000".parse().ok();
        let b = "127.0.0.1:9001".parse().ok();
        let zero = "127.0.0.1:0".parse().ok();
        assert_eq!(listeners(a, a), vec![(a.unwrap(), true, true)]);
        assert_eq!(
            listeners(a, b),
            vec![(a.unwrap(), true, false), (b.unwrap(), false, true)]
        );
        assert_eq!(listeners(zero, zero).len(), 2);
        assert_eq!(listeners(None, b), vec![(b.unwrap(), false, true)]);
        assert!(listeners(None, None).is_empty());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// /healthz names every unhealthy part, a stopped one with its error; metrics keep one
    /// `# EOF`.
    #[test]
    fn health_names_the_unhealthy_parts_and_metrics_join() {
        let mut parts = Parts::default();
        parts.add("routes", || Ok(()), || "a 1\n# EOF\n".into());
        parts.add(
            "policy",
            || Err("no rules written yet".into()),
            || "b 2\n# EOF\n".into(),
        );
        let parts = Arc::new(parts);
        assert_eq!(
            health_answer(&parts.states()),
            (503, "policy: no rules written yet\n".into())
        );
        parts.stopped("routes", "open rtnetlink: denied".into());
        let (code, body) = health_answer(&parts.states());
        assert_eq!(code, 503);
        assert!(
            body.starts_with("routes: stopped: open rtnetlink: denied\n"),
            "{body}"
        );
        assert_eq!(joined(parts.metrics()), "a 1\nb 2\n# EOF\n");
        let mut fine = Parts::default();
        fine.add("routes", || Ok(()), String::new);
        assert_eq!(health_answer(&fine.states()), (200, "ok\n".into()));
    }
}
