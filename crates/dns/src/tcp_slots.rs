//! Which TCP connections are idle, so a new client can take the slot of the one idle longest
//! when every slot is held (RFC 7766 6.2.3 lets a server close idle connections under
//! pressure; Knot and Unbound do). Without this, idle clients holding every slot made a new
//! client wait up to the idle timeout (10 s) for one to close.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::Notify;

/// The connections holding slots, each with when it went idle (waiting for its next query),
/// if it is.
#[derive(Debug, Default)]
pub struct Slots {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    next_id: u64,
    held: HashMap<u64, Held>,
}

#[derive(Debug)]
struct Held {
    idle_since: Option<Instant>,
    close: Arc<Notify>,
}

/// One connection's entry; removed when dropped.
#[derive(Debug)]
pub struct Slot {
    slots: Arc<Slots>,
    id: u64,
    /// Notified when the connection is asked to close (another client takes its slot).
    pub close: Arc<Notify>,
}

impl Slots {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a connection that now holds a slot (busy until it says it is idle).
    pub fn enter(self: &Arc<Self>) -> Slot {
        let close = Arc::new(Notify::new());
        let mut s = self.lock();
        let id = s.next_id;
        s.next_id += 1;
        s.held.insert(
            id,
            Held {
                idle_since: None,
                close: close.clone(),
            },
        );
        Slot {
            slots: self.clone(),
            id,
            close,
        }
    }

    /// Asks the connection idle longest to close; whether there was one. It is marked busy
    /// at once, so two new clients never pick the same one.
    pub fn close_oldest_idle(&self) -> bool {
        let mut s = self.lock();
        let oldest = s
            .held
            .iter_mut()
            .filter_map(|(id, h)| h.idle_since.map(|t| (t, *id)))
            .min();
        let Some((_, id)) = oldest else {
            return false;
        };
        let h = s.held.get_mut(&id).expect("found above");
        h.idle_since = None;
        h.close.notify_one();
        true
    }
}

impl Slot {
    /// Waiting for the next query (`true`) or working on one (`false`).
    pub fn set_idle(&self, idle: bool) {
        if let Some(h) = self.slots.lock().held.get_mut(&self.id) {
            h.idle_since = idle.then(Instant::now);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.lock().held.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_idle_longest_is_asked_to_close_and_busy_ones_never() {
        let slots = Arc::new(Slots::default());
        let (a, b, c) = (slots.enter(), slots.enter(), slots.enter());
        assert!(!slots.close_oldest_idle(), "nobody idle: nobody closed");
        b.set_idle(true);
        std::thread::sleep(std::time::Duration::from_millis(2));
        c.set_idle(true);
        a.set_idle(false);
        assert!(slots.close_oldest_idle());
        // b was notified (a permit is stored for its next notified().await).
        let notified = b.close.notified();
        tokio_test_block_on(notified);
        // c is next; b is no longer a candidate.
        assert!(slots.close_oldest_idle());
        tokio_test_block_on(c.close.notified());
        assert!(!slots.close_oldest_idle());
        drop(b);
        assert_eq!(slots.lock().held.len(), 2);
    }

    fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(async { tokio::time::timeout(std::time::Duration::from_secs(1), f).await })
            .expect("notified")
    }
}
