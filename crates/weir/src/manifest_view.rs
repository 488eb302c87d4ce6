//! How every `weir` agent logs its manifest watcher's events and its Kubernetes API watchers,
//! and `weir routes --once`'s one complete read of a manifest directory.

use std::time::Duration;

use tracing::{info, warn};
use weir_source::api::ApiReport;
use weir_source::{ManifestDir, WatchEvent};

use crate::conditions::Conditions;

/// Scans `dir` until it has given one complete view: nothing is served or programmed from a
/// missing directory or a file still being written (an empty or partial world). With `once`, a
/// directory that cannot be read is an error instead of a wait, and the files' errors are said
/// here; without it they are left to the watcher started next ([`weir_source::watch_dir`]).
pub fn wait_for_complete_view(
    dir: &mut ManifestDir,
    poll: Duration,
    once: bool,
) -> anyhow::Result<()> {
    // The directory's own failure (missing, unreadable) comes back on every scan: said when
    // it appears or changes, and when it clears. The files' errors are the watcher's to say
    // (its first scan reports every current one); without a watcher (`once`) they are said
    // here, each once.
    let mut failure = Conditions::default();
    let mut said = std::collections::BTreeSet::new();
    loop {
        let report = dir.scan();
        let failed = report.failed.as_ref().map(|e| e.to_string());
        for e in report.errors.iter().map(|e| e.to_string()) {
            if once && Some(&e) != failed.as_ref() && said.insert(e.clone()) {
                warn!("{e}");
            }
        }
        if let (Some(e), true) = (&failed, once) {
            anyhow::bail!("{e}");
        }
        let changes = failure.update(failed);
        for e in changes.cleared {
            info!("resolved: {e}");
        }
        for e in changes.appeared {
            warn!("{e}; waiting for it before using any object");
        }
        if report.complete() {
            return Ok(());
        }
        std::thread::sleep(poll);
    }
}

/// Logs a watcher's event: each distinct error once, and when it is resolved.
pub fn log_watch_event(ev: WatchEvent<'_>) {
    match ev {
        WatchEvent::Error(e) => warn!("{e}"),
        WatchEvent::Resolved(e) => info!("resolved: {e}"),
        WatchEvent::Scanned { .. } => {}
    }
}

/// Logs an API watcher's report: each distinct error once per kind, its repetitions
/// (retries) at debug level.
pub fn log_api_report(r: &ApiReport) {
    match r {
        ApiReport::Listed { kind, objects } => info!(kind = kind.as_str(), objects, "listed"),
        ApiReport::Failed {
            kind,
            error,
            retry_in,
            first: true,
        } => warn!(
            kind = kind.as_str(),
            retry_in_ms = retry_in.as_millis() as u64,
            "API watch failed (the last objects are kept): {error}"
        ),
        ApiReport::Failed {
            kind,
            error,
            retry_in,
            first: false,
        } => tracing::debug!(
            kind = kind.as_str(),
            retry_in_ms = retry_in.as_millis() as u64,
            "API watch still failing: {error}"
        ),
        ApiReport::Recovered { kind } => info!(kind = kind.as_str(), "API watch recovered"),
        ApiReport::Compat { kind, note } => warn!(kind = kind.as_str(), "older API server: {note}"),
        ApiReport::Objects { .. } => {}
    }
}
