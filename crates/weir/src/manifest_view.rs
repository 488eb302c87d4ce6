//! What every `weir` agent that reads a manifest directory does first and on each watch event
//! (the proxy has its own, health-aware version in `proxy_cmd::agent`).

use std::time::Duration;

use tracing::{info, warn};
use weir_source::{ManifestDir, WatchEvent};

/// Scans `dir` until it has given one complete view: nothing is served or programmed from a
/// missing directory or a file still being written (an empty or partial world). With `once`, a
/// directory that cannot be read is an error instead of a wait.
pub fn wait_for_complete_view(
    dir: &mut ManifestDir,
    poll: Duration,
    once: bool,
) -> anyhow::Result<()> {
    let mut said_failed = false;
    loop {
        let report = dir.scan();
        for e in &report.errors {
            warn!("{e}");
        }
        if report.complete() {
            return Ok(());
        }
        if let Some(e) = &report.failed {
            if once {
                anyhow::bail!("{e}");
            }
            if !said_failed {
                warn!("{e}; waiting for it before using any object");
                said_failed = true;
            }
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
