use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::manifest::{ManifestDir, ManifestError};
use crate::store::{Event, EventSink};

/// A running poll watcher; dropping it (or [`PollWatcher::stop`]) stops the thread.
#[derive(Debug)]
pub struct PollWatcher {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl PollWatcher {
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
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

/// Polls `dir` every `interval`; sends `Event::Resync(all objects)` after the first scan and
/// then after every scan that changed the object set. Errors of re-parsed files go to
/// `on_error`. Stops when the sink reports it is closed.
pub fn watch_dir(
    mut dir: ManifestDir,
    interval: Duration,
    sink: impl EventSink + 'static,
    on_error: impl Fn(&ManifestError) + Send + 'static,
) -> PollWatcher {
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let handle = std::thread::Builder::new()
        .name("weir-manifest-watch".into())
        .spawn(move || {
            let mut first = true;
            while !stop2.load(Ordering::SeqCst) {
                let report = dir.scan();
                for e in &report.errors {
                    on_error(e);
                }
                if (first || report.changed) && !sink.send(Event::Resync(dir.objects())) {
                    return;
                }
                first = false;
                // Sleep in small steps so stop() is prompt.
                let mut left = interval;
                while !left.is_zero() && !stop2.load(Ordering::SeqCst) {
                    let step = left.min(Duration::from_millis(20));
                    std::thread::sleep(step);
                    left -= step;
                }
            }
        })
        .expect("spawn watcher thread");
    PollWatcher {
        stop,
        handle: Some(handle),
    }
}
