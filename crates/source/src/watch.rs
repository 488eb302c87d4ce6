//! The polling watcher of a [`ManifestDir`], and [`SourceStatus`], what it tells health
//! checks and metrics about itself.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use crate::dir::{ManifestDir, ScanReport};
use crate::manifest::ManifestError;
use crate::store::{Event, EventSink};

/// A running poll watcher; dropping it (or [`PollWatcher::stop`]) stops the thread.
#[derive(Debug)]
pub struct PollWatcher {
    stop: Arc<AtomicBool>,
    status: SourceStatus,
    handle: Option<JoinHandle<()>>,
}

impl PollWatcher {
    pub fn stop(mut self) {
        self.shutdown();
    }

    /// The watcher's health, shared with it.
    pub fn status(&self) -> SourceStatus {
        self.status.clone()
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            h.thread().unpark();
            if let Err(e) = h.join() {
                tracing::error!("manifest watcher panicked: {e:?}");
            }
        }
    }
}

impl Drop for PollWatcher {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// What the watcher reports besides objects (each standing error once, not every poll).
#[derive(Debug, Clone, Copy)]
pub enum WatchEvent<'a> {
    /// An error that the previous scan did not have.
    Error(&'a ManifestError),
    /// An error of the previous scan that is gone.
    Resolved(&'a ManifestError),
    /// A scan finished.
    Scanned {
        duration: Duration,
        /// The root directory could not be read (the previous view stands).
        failed: bool,
    },
}

#[derive(Debug, Default)]
struct StatusInner {
    /// Sent a complete view at least once (consumers may sync).
    ready: bool,
    /// When the last scan that could read the root finished.
    last_success: Option<(Instant, SystemTime)>,
    /// Why the last scan failed, while it does.
    failure: Option<String>,
    /// When the scan now running started.
    scanning_since: Option<Instant>,
    started: Option<Instant>,
}

/// The manifest source's health: shared by the watcher thread (writer) and health checks,
/// which evaluate it when asked — so a watcher that is stuck inside a scan is noticed
/// although it reports nothing.
#[derive(Debug, Clone, Default)]
pub struct SourceStatus {
    inner: Arc<Mutex<StatusInner>>,
}

impl SourceStatus {
    fn lock(&self) -> std::sync::MutexGuard<'_, StatusInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A complete view was sent at least once.
    pub fn ready(&self) -> bool {
        self.lock().ready
    }

    /// Wall-clock time of the last scan that could read the directory.
    pub fn last_success(&self) -> Option<SystemTime> {
        self.lock().last_success.map(|(_, t)| t)
    }

    /// `Ok` while the source is current; otherwise why not: no complete view yet, the
    /// directory cannot be read, or no scan has completed within `stale_after`.
    pub fn check(&self, stale_after: Duration) -> Result<(), String> {
        self.check_at(Instant::now(), stale_after)
    }

    fn check_at(&self, now: Instant, stale_after: Duration) -> Result<(), String> {
        let s = self.lock();
        if let Some(why) = &s.failure {
            let view = if s.ready {
                "serving the last complete view"
            } else {
                "no complete view yet"
            };
            return Err(format!("manifest source failing ({view}): {why}"));
        }
        if let Some(since) = s.scanning_since {
            let running = now.saturating_duration_since(since);
            if running > stale_after {
                return Err(format!(
                    "manifest source stuck: a scan has been running for {:.1}s",
                    running.as_secs_f64()
                ));
            }
        }
        let last = s.last_success.map(|(t, _)| t).or(s.started);
        if let Some(last) = last {
            let age = now.saturating_duration_since(last);
            if age > stale_after {
                return Err(format!(
                    "manifest source stale: no scan completed for {:.1}s",
                    age.as_secs_f64()
                ));
            }
        }
        if !s.ready {
            return Err("manifest source has not produced a complete view yet".into());
        }
        Ok(())
    }
}

/// Standing errors of the previous scan, to report each distinct error once.
#[derive(Debug, Default)]
struct Reported(BTreeMap<String, ManifestError>);

impl Reported {
    fn update(&mut self, now: Vec<ManifestError>, on_event: &mut impl FnMut(WatchEvent<'_>)) {
        let now: BTreeMap<String, ManifestError> =
            now.into_iter().map(|e| (e.to_string(), e)).collect();
        for (k, e) in &now {
            if !self.0.contains_key(k) {
                on_event(WatchEvent::Error(e));
            }
        }
        for (k, e) in &self.0 {
            if !now.contains_key(k) {
                on_event(WatchEvent::Resolved(e));
            }
        }
        self.0 = now;
    }
}

/// Polls `dir` every `interval`. Sends `Event::Resync(all objects)` once the first scan
/// produced a complete view (the root readable and no changed file still settling), then
/// after every scan that changed the object set; never while the root cannot be read.
/// `on_event` gets each standing error once, its resolution, and every scan's outcome.
/// Stops when the sink reports it is closed.
pub fn watch_dir(
    mut dir: ManifestDir,
    interval: Duration,
    sink: impl EventSink + 'static,
    mut on_event: impl FnMut(WatchEvent<'_>) + Send + 'static,
) -> PollWatcher {
    let stop = Arc::new(AtomicBool::new(false));
    let status = SourceStatus::default();
    status.lock().started = Some(Instant::now());
    let (stop2, status2) = (stop.clone(), status.clone());
    let handle = std::thread::Builder::new()
        .name("weir-manifest-watch".into())
        .spawn(move || {
            let mut reported = Reported::default();
            while !stop2.load(Ordering::SeqCst) {
                let began = Instant::now();
                status2.lock().scanning_since = Some(began);
                let report: ScanReport = dir.scan();
                let duration = began.elapsed();
                let first_view = !status2.ready() && report.complete();
                {
                    let mut s = status2.lock();
                    s.scanning_since = None;
                    s.failure = report.failed.as_ref().map(ToString::to_string);
                    if report.failed.is_none() {
                        s.last_success = Some((Instant::now(), SystemTime::now()));
                    }
                }
                reported.update(dir.errors(), &mut on_event);
                on_event(WatchEvent::Scanned {
                    duration,
                    failed: report.failed.is_some(),
                });
                let send = first_view || (status2.ready() && report.changed);
                if send {
                    if !sink.send(Event::Resync(dir.objects())) {
                        return;
                    }
                    status2.lock().ready = true;
                }
                // Parked until the next scan; stop() unparks it. (Sleeping in short steps
                // instead woke the thread 50 times a second, on the CPU `weir dns` answers
                // from.)
                let next = Instant::now() + interval;
                while !stop2.load(Ordering::SeqCst) {
                    let left = next.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    std::thread::park_timeout(left);
                }
            }
        })
        .expect("spawn watcher thread");
    PollWatcher {
        stop,
        status,
        handle: Some(handle),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_reports_not_ready_failing_stuck_and_stale() {
        let s = SourceStatus::default();
        let t0 = Instant::now();
        let stale = Duration::from_secs(5);
        s.lock().started = Some(t0);
        let e = s.check_at(t0, stale).unwrap_err();
        assert!(e.contains("not produced a complete view"), "{e}");

        s.lock().failure = Some("/m: directory: cannot read: No such file".into());
        let e = s.check_at(t0, stale).unwrap_err();
        assert!(
            e.contains("no complete view yet") && e.contains("/m"),
            "{e}"
        );

        {
            let mut l = s.lock();
            l.failure = None;
            l.ready = true;
            l.last_success = Some((t0, SystemTime::now()));
        }
        assert_eq!(s.check_at(t0 + Duration::from_secs(1), stale), Ok(()));
        // A scan that never returns (a blocked read) is noticed by the reader of the status.
        s.lock().scanning_since = Some(t0);
        let e = s.check_at(t0 + Duration::from_secs(6), stale).unwrap_err();
        assert!(e.contains("stuck"), "{e}");
        s.lock().scanning_since = None;
        let e = s.check_at(t0 + Duration::from_secs(6), stale).unwrap_err();
        assert!(e.contains("stale"), "{e}");
    }
}
