//! `weir agent`: the one node agent. The service proxy, node routes and the NetworkPolicy
//! enforcer run in one process over one store fed by one set of watches (or one manifest
//! directory): each kind is listed and watched once per node, whatever parts are enabled.
//!
//! Each part keeps its own loop on its own thread, its own health state and its own
//! metrics namespace (kube-proxy's `kubeproxy_*`, `weir_routes_*`, `weir_policy_*`). A part
//! whose loop fails is reported unhealthy by name on `/healthz`; the others go on. The flags
//! are `weir proxy`'s (kube-proxy's, with `--config`) and `weir routes`'s; one `--sync-period`
//! (the proxy's, default 30 s, also taken from kube-proxy's flags and file) is every part's
//! periodic resync, and the policy part also takes `--min-sync-period`. `weir routes`'s
//! former `--resync-period`, still taken, sets the routes part's period alone.

use std::process::ExitCode;
use std::sync::{mpsc, Arc};

use clap::{Args, ValueEnum};
use tracing::{error, info, warn};
use weir_policy::agent::LoopSettings as PolicyLoopSettings;

use crate::policy_cmd::{self, Health as PolicyHealth, PolicyMetrics, PolicyPart};
use crate::proxy_cmd::{self, Problem, ProxyFlags, ProxyPart, ProxyReports, Settings};
use crate::routes_cmd::{self, RoutesHealth, RoutesMetrics, RoutesOptions, RoutesPart};
use crate::runtime::parts::{self, Parts};
use crate::runtime::source::{wait_ready, RunningSource, SourceHealth, Wanted};
use crate::runtime::views::{View, POLICY_KINDS, PROXY_KINDS, ROUTES_KINDS};

/// A part of the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum Part {
    /// The service proxy (kube-proxy's job).
    Proxy,
    /// Routes to the other nodes' pods (flanneld's job).
    Routes,
    /// NetworkPolicy for this node's pods.
    Policy,
}

impl Part {
    fn name(self) -> &'static str {
        match self {
            Part::Proxy => "proxy",
            Part::Routes => "routes",
            Part::Policy => "policy",
        }
    }
}

#[derive(Debug, Args)]
#[command(
    // pflag's rule, as `weir proxy`: a flag given twice takes the last value.
    args_override_self = true,
    after_help = "The proxy's flags are kube-proxy's (docs/proxy.md); the routes flags are \
                  `weir routes`'s. --sync-period (default 30s) is every part's periodic resync; \
                  the policy part also takes --min-sync-period."
)]
pub struct AgentArgs {
    /// The parts to run, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "proxy,routes,policy"
    )]
    parts: Vec<Part>,
    /// Read the flags and --config as `weir proxy --validate` does, print the parts and the
    /// settings the agent would run with, and exit without touching anything.
    #[arg(long)]
    validate: bool,
    #[command(flatten)]
    proxy: ProxyFlags,
    #[command(flatten, next_help_heading = "Node routes (weir routes's flags)")]
    routes: RoutesOptions,
    /// The routes part's period alone, overriding --sync-period (`weir routes`'s former name).
    #[arg(long, hide = true, value_name = "DURATION", value_parser = proxy_cmd::parse_duration)]
    resync_period: Option<std::time::Duration>,
}

/// A part's loop ended: its name and why.
type Ended = (&'static str, String);

/// What runs a part on its thread (reporting its end itself).
type PartStart = Box<dyn FnOnce() + Send>;

/// `--validate`: the proxy's report (settings, notices, every problem), the parts and the
/// routes' options; exit code 2 on any problem, as `weir proxy --validate`.
fn validate(args: &AgentArgs) -> anyhow::Result<ExitCode> {
    let mut report = proxy_cmd::validate_report(&args.proxy);
    if let Some(s) = report
        .settings
        .as_ref()
        .filter(|_| args.parts.contains(&Part::Routes))
    {
        if let Err(e) = routes_cmd::check(&s.node_name, &args.routes) {
            report.problems.push(Problem::msg(format!("routes: {e:#}")));
        }
    }
    let mut parts = args.parts.clone();
    parts.sort();
    parts.dedup();
    let names: Vec<&str> = parts.iter().map(|p| p.name()).collect();
    outln!("parts: {}", names.join(","));
    if args.parts.contains(&Part::Routes) {
        outln!("routes: {:?}", args.routes);
        if let Some(s) = &report.settings {
            let period = args.resync_period.unwrap_or(s.sync_period);
            outln!("routes sync_period: {}", proxy_cmd::go_duration(period));
        }
    }
    out!("{}", report.render(proxy_cmd::ValidateOutput::Text));
    Ok(ExitCode::from(if report.valid() { 0 } else { 2 }))
}

pub fn run(args: AgentArgs) -> anyhow::Result<ExitCode> {
    proxy_cmd::use_one_malloc_arena();
    if args.validate {
        return validate(&args);
    }
    let mut notices = Vec::new();
    let settings = match args.proxy.settings(&mut |n| notices.push(n)) {
        Ok(s) => s,
        Err(e) => return proxy_cmd::refused_exit(e, "weir agent"),
    };
    let mut enabled = args.parts.clone();
    enabled.sort();
    enabled.dedup();
    anyhow::ensure!(!enabled.is_empty(), "--parts names no part");
    let names: Vec<&str> = enabled.iter().map(|p| p.name()).collect();
    if enabled.contains(&Part::Routes) {
        routes_cmd::check(&settings.node_name, &args.routes)?;
    }
    crate::init_logging_with(settings.log.format, settings.log.filter());
    for n in notices {
        warn!("{n}");
    }

    let mut wanted = Wanted::default();
    for part in &enabled {
        wanted.add(match part {
            Part::Proxy => proxy_cmd::wanted(&settings),
            Part::Routes => routes_cmd::wanted(),
            Part::Policy => policy_cmd::wanted(),
        });
    }
    let origin = proxy_cmd::origin(&settings);
    let reports = Arc::new(ProxyReports::default());
    let source = RunningSource::start(&origin, &wanted, reports.clone())?;
    info!(parts = names.join(","), node = %settings.node_name, "node agent starting");

    let (ended_tx, ended) = mpsc::channel::<Ended>();
    let mut parts = Parts::default();
    let mut starts: Vec<(&'static str, PartStart)> = Vec::new();
    if enabled.contains(&Part::Routes) {
        starts.push((
            "routes",
            routes_part(
                &settings,
                (
                    &args.routes,
                    args.resync_period.unwrap_or(settings.sync_period),
                ),
                &origin,
                &source,
                &mut parts,
                &ended_tx,
            ),
        ));
    }
    if enabled.contains(&Part::Policy) {
        let start = policy_part(&settings, &source, &mut parts, &ended_tx);
        starts.push(("policy", start));
    }
    let parts = Arc::new(parts);
    // Without the proxy, whose servers answer for every part, the agent serves its own.
    let _served = if enabled.contains(&Part::Proxy) {
        let part = ProxyPart::new(settings.clone())?;
        let view = View::new(source.store(), &PROXY_KINDS, source.health());
        let (others, tx) = (parts.for_proxy(), ended_tx.clone());
        starts.push((
            "proxy",
            Box::new(move || {
                let result = part.run(view, &reports, others);
                let _ = tx.send(("proxy", why_ended(result.map(|never| match never {}))));
            }),
        ));
        None
    } else {
        let (healthz, metrics) = (settings.healthz_bind_address, settings.metrics_bind_address);
        Some(parts::serve(&parts, healthz, metrics)?)
    };
    let threads: Vec<_> = starts
        .into_iter()
        .map(|(name, start)| {
            let tx = ended_tx.clone();
            std::thread::Builder::new()
                .name(format!("weir-{name}"))
                .spawn(move || {
                    // A panic ends this part only: it is reported like any other end.
                    let run = std::panic::AssertUnwindSafe(start);
                    if let Err(panic) = std::panic::catch_unwind(run) {
                        let _ = tx.send((name, format!("panicked: {}", panic_text(&*panic))));
                    }
                })
        })
        .collect::<Result<_, _>>()?;
    drop(ended_tx);
    watch_parts(&parts, &ended, enabled.len());
    drop(threads);
    anyhow::bail!("every part of the agent stopped")
}

/// Waits for parts to end: each is logged and reported unhealthy while the others go on.
/// Returns when every part has ended.
fn watch_parts(parts: &Parts, ended: &mpsc::Receiver<Ended>, running: usize) {
    for (n, (name, why)) in ended.iter().enumerate() {
        error!(part = name, "stopped: {why}; the other parts go on");
        parts.stopped(name, why);
        if n + 1 == running {
            return;
        }
    }
}

/// A panic's message, when it has one.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(s), _) => s.to_string(),
        (_, Some(s)) => s.clone(),
        _ => "(no message)".into(),
    }
}

/// A part's loop result as the reason it ended.
fn why_ended(result: anyhow::Result<()>) -> String {
    match result {
        Ok(()) => "its loop returned".into(),
        Err(e) => format!("{e:#}"),
    }
}

/// The routes part: registered with the agent's health and metrics, started on its thread
/// once the source holds a complete view (an empty world would remove every route).
fn routes_part(
    settings: &Settings,
    (options, sync_period): (&RoutesOptions, std::time::Duration),
    origin: &crate::runtime::source::Origin,
    source: &RunningSource,
    parts: &mut Parts,
    ended_tx: &mpsc::Sender<Ended>,
) -> PartStart {
    let (metrics, health) = (
        Arc::new(RoutesMetrics::new()),
        Arc::new(RoutesHealth::default()),
    );
    let (h, s, m) = (health.clone(), source.health(), metrics.clone());
    parts.add(
        "routes",
        move || h.state().and(s.check()),
        move || m.encode(),
    );
    let part = RoutesPart {
        node_name: settings.node_name.clone(),
        options: options.clone(),
        sync_period,
        api: origin.api_options(),
        metrics,
        health,
    };
    let view = View::new(source.store(), &ROUTES_KINDS, source.health());
    let (source_health, tx) = (source.health(), ended_tx.clone());
    Box::new(move || {
        wait_ready(&source_health);
        let result = part.run(view).map(|never| match never {});
        let _ = tx.send(("routes", why_ended(result)));
    })
}

/// The NetworkPolicy part: registered with the agent's health and metrics, started on its
/// thread (its loop waits for the complete first view itself).
fn policy_part(
    settings: &Settings,
    source: &RunningSource,
    parts: &mut Parts,
    ended_tx: &mpsc::Sender<Ended>,
) -> PartStart {
    let (metrics, health) = (
        Arc::new(PolicyMetrics::new()),
        Arc::new(PolicyHealth::default()),
    );
    let (h, s, m): (_, SourceHealth, _) = (health.clone(), source.health(), metrics.clone());
    parts.add(
        "policy",
        move || policy_cmd::health_state(&h, &s),
        move || m.encode(),
    );
    let part = PolicyPart {
        settings: PolicyLoopSettings {
            node_name: settings.node_name.clone(),
            sync_period: settings.sync_period,
            min_sync_period: settings.min_sync_period,
        },
        metrics,
        health,
    };
    let view = View::new(source.store(), &POLICY_KINDS, source.health());
    let tx = ended_tx.clone();
    Box::new(move || {
        let result = part.run(view).map(|_| ());
        let _ = tx.send(("policy", why_ended(result)));
    })
}
