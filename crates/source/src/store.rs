use std::collections::BTreeMap;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use weir_model::{Kind, Object, ObjectKey, Snapshot};

/// A change from any source. The manifest watcher sends `Resync`; a Kubernetes API watcher
/// (kube-rs `watcher::Event`: Apply/Delete/Init…InitDone) maps onto the same three.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Applied(Object),
    Deleted(ObjectKey),
    /// The complete set of objects: everything else is deleted.
    Resync(Vec<Object>),
    /// The complete set of objects of one kind (an API watcher's initial list or re-list):
    /// every other object of that kind is deleted, other kinds are untouched.
    Listed(Kind, Vec<Object>),
}

/// Where sources push events.
pub trait EventSink: Send + Sync {
    /// Returns false when the receiving side is gone (the source should stop).
    fn send(&self, ev: Event) -> bool;
}

impl EventSink for mpsc::Sender<Event> {
    fn send(&self, ev: Event) -> bool {
        mpsc::Sender::send(self, ev).is_ok()
    }
}

impl EventSink for mpsc::SyncSender<Event> {
    fn send(&self, ev: Event) -> bool {
        mpsc::SyncSender::send(self, ev).is_ok()
    }
}

/// Objects keyed by kind/namespace/name. `generation` increases only on real changes.
#[derive(Debug, Default, Clone)]
pub struct Store {
    objects: BTreeMap<ObjectKey, Object>,
    generation: u64,
}

impl Store {
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies an event; returns whether the content changed.
    pub fn apply(&mut self, ev: Event) -> bool {
        let changed = match ev {
            Event::Applied(o) => {
                let k = o.key();
                if self.objects.get(&k) == Some(&o) {
                    false
                } else {
                    self.objects.insert(k, o);
                    true
                }
            }
            Event::Deleted(k) => self.objects.remove(&k).is_some(),
            Event::Listed(kind, list) => self.replace_kind(kind, list),
            Event::Resync(list) => {
                let new: BTreeMap<ObjectKey, Object> =
                    list.into_iter().map(|o| (o.key(), o)).collect();
                if new == self.objects {
                    false
                } else {
                    self.objects = new;
                    true
                }
            }
        };
        if changed {
            self.generation += 1;
        }
        changed
    }

    /// Makes `list` the objects of `kind`; returns whether anything changed.
    fn replace_kind(&mut self, kind: Kind, list: Vec<Object>) -> bool {
        let new: BTreeMap<ObjectKey, Object> = list
            .into_iter()
            .filter(|o| o.kind() == kind)
            .map(|o| (o.key(), o))
            .collect();
        let before = self.objects.len();
        self.objects
            .retain(|k, _| k.kind != kind || new.contains_key(k));
        let mut changed = self.objects.len() != before;
        for (k, o) in new {
            if self.objects.get(&k) != Some(&o) {
                self.objects.insert(k, o);
                changed = true;
            }
        }
        changed
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn get(&self, key: &ObjectKey) -> Option<&Object> {
        self.objects.get(key)
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot::from_objects(self.objects.values())
    }
}

/// A [`Store`] shared between sources (as an [`EventSink`]) and a consumer that waits for
/// changes ([`SharedStore::wait_newer`]).
#[derive(Debug, Clone, Default)]
pub struct SharedStore {
    inner: Arc<(Mutex<Store>, Condvar)>,
}

impl SharedStore {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn apply(&self, ev: Event) -> bool {
        let (m, cv) = &*self.inner;
        let changed = m.lock().unwrap_or_else(|e| e.into_inner()).apply(ev);
        if changed {
            cv.notify_all();
        }
        changed
    }

    /// (generation, snapshot) now.
    pub fn snapshot(&self) -> (u64, Snapshot) {
        let s = self.inner.0.lock().unwrap_or_else(|e| e.into_inner());
        (s.generation(), s.snapshot())
    }

    /// Waits until the generation exceeds `seen` (or `timeout` passes) and returns the new one.
    pub fn wait_newer(&self, seen: u64, timeout: Duration) -> Option<(u64, Snapshot)> {
        let (m, cv) = &*self.inner;
        let deadline = Instant::now() + timeout;
        let mut s = m.lock().unwrap_or_else(|e| e.into_inner());
        while s.generation() <= seen {
            let left = deadline.checked_duration_since(Instant::now())?;
            s = cv
                .wait_timeout(s, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Some((s.generation(), s.snapshot()))
    }
}

impl EventSink for SharedStore {
    fn send(&self, ev: Event) -> bool {
        self.apply(ev);
        true
    }
}
