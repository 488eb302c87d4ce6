use std::collections::{BTreeMap, BTreeSet};
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

/// What changed since the consumer last asked ([`Store::take_changes`]): each object key at
/// most once, with the object now (`None`: deleted). A key changed and changed back may be
/// listed although nothing differs; consumers treat a listed key as "look again".
#[derive(Debug, Clone, Default)]
pub struct Changes {
    /// The store's generation these changes bring the consumer to.
    pub generation: u64,
    pub objects: Vec<(ObjectKey, Option<Object>)>,
    /// When the oldest of these changes reached the store (the start of event-to-rules
    /// latency); `None` when there are none.
    pub since: Option<Instant>,
}

/// Objects keyed by kind/namespace/name. `generation` increases only on real changes.
///
/// Consumers that work on what changed instead of on the whole set (the proxy's planner, the
/// policy planner) each open a change feed ([`Store::feed`]) for the kinds they read: the
/// store remembers, per feed, which keys of those kinds changed until the feed takes them
/// ([`Store::take`]). One store (one set of watches) thus serves several consumers, and a
/// consumer is woken only by its own kinds ([`SharedStore::wait_feed`]). A whole-set
/// [`Event::Resync`] is compared object by object (by pointer, then value) and records only
/// what differs.
#[derive(Debug, Default, Clone)]
pub struct Store {
    /// Shared with the snapshots handed out ([`Store::shared_snapshot`]): a reader holds the
    /// maps as they were, and the first change after that copies them (copy on write).
    objects: Arc<Snapshot>,
    generation: u64,
    feeds: Vec<Feed>,
    /// The feed of every kind behind [`Store::track_changes`] / [`Store::take_changes`].
    default_feed: Option<FeedId>,
}

/// A consumer's change feed ([`Store::feed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeedId(usize);

/// What one consumer has not taken yet.
#[derive(Debug, Clone)]
struct Feed {
    kinds: Vec<Kind>,
    keys: BTreeSet<ObjectKey>,
    since: Option<Instant>,
    /// The store's generation at this feed's last change: what its consumer waits past.
    generation: u64,
}

/// A list that changed this many objects rebuilds the maps densely ([`Snapshot::compact`]):
/// a first list inserted in key order leaves the B-tree nodes half empty.
const COMPACT_AFTER: usize = 1024;

fn same(a: Option<&Object>, b: &Object) -> bool {
    a.is_some_and(|a| a == b)
}

impl Store {
    pub fn new() -> Self {
        Self::default()
    }

    /// Opens a change feed for `kinds`: every object of those kinds present now counts as
    /// changed, so the feed's first take is the whole set of them.
    pub fn feed(&mut self, kinds: &[Kind]) -> FeedId {
        let keys = self
            .objects
            .objects()
            .map(|o| o.key())
            .filter(|k| kinds.contains(&k.kind))
            .collect::<BTreeSet<_>>();
        self.feeds.push(Feed {
            kinds: kinds.to_vec(),
            since: (!keys.is_empty()).then(Instant::now),
            keys,
            generation: self.generation,
        });
        FeedId(self.feeds.len() - 1)
    }

    /// Starts recording changed keys of every kind for [`Store::take_changes`] (every object
    /// present now counts as changed, so the first take is the whole set).
    pub fn track_changes(&mut self) {
        if self.default_feed.is_none() {
            self.default_feed = Some(self.feed(&Kind::ALL));
        }
    }

    fn note(&mut self, key: ObjectKey) {
        // `note` runs only for a change, and a change ends by raising the generation by one.
        let after = self.generation + 1;
        for feed in self
            .feeds
            .iter_mut()
            .filter(|f| f.kinds.contains(&key.kind))
        {
            feed.keys.insert(key.clone());
            feed.since.get_or_insert_with(Instant::now);
            feed.generation = after;
        }
    }

    /// Applies an event; returns whether the content changed.
    pub fn apply(&mut self, ev: Event) -> bool {
        let changed = match ev {
            Event::Applied(o) => {
                let k = o.key();
                if same(self.objects.get(&k).as_ref(), &o) {
                    false
                } else {
                    Arc::make_mut(&mut self.objects).insert(o);
                    self.note(k);
                    true
                }
            }
            Event::Deleted(k) => {
                let gone =
                    self.objects.get(&k).is_some() && Arc::make_mut(&mut self.objects).remove(&k);
                if gone {
                    self.note(k);
                }
                gone
            }
            Event::Listed(kind, list) => self.replace_kind(kind, list),
            Event::Resync(list) => {
                let mut new = Snapshot::from_objects(&list);
                drop(list);
                new.compact();
                let mut keys = Vec::new();
                for o in new.objects() {
                    let k = o.key();
                    if !same(self.objects.get(&k).as_ref(), &o) {
                        keys.push(k);
                    }
                }
                for o in self.objects.objects() {
                    let k = o.key();
                    if new.get(&k).is_none() {
                        keys.push(k);
                    }
                }
                if keys.is_empty() {
                    false
                } else {
                    self.objects = Arc::new(new);
                    for k in keys {
                        self.note(k);
                    }
                    true
                }
            }
        };
        if changed {
            self.generation += 1;
        }
        changed
    }

    /// Makes `list` the objects of `kind` (other kinds stay); returns whether anything
    /// changed, noting each changed key.
    fn replace_kind(&mut self, kind: Kind, list: Vec<Object>) -> bool {
        let new: BTreeMap<ObjectKey, Object> = list
            .into_iter()
            .filter(|o| o.kind() == kind)
            .map(|o| (o.key(), o))
            .collect();
        let gone: Vec<ObjectKey> = self
            .objects
            .objects()
            .map(|o| o.key())
            .filter(|k| k.kind == kind && !new.contains_key(k))
            .collect();
        let mut keys = Vec::new();
        for k in gone {
            Arc::make_mut(&mut self.objects).remove(&k);
            keys.push(k);
        }
        if self.objects.kind_is_empty(kind) {
            // A first list: every object is new; the kind's map is built in one go.
            keys.extend(new.keys().cloned());
            Arc::make_mut(&mut self.objects).extend_sorted(new.into_values());
        } else {
            for (k, o) in new {
                if !same(self.objects.get(&k).as_ref(), &o) {
                    Arc::make_mut(&mut self.objects).insert(o);
                    keys.push(k);
                }
            }
        }
        let changed = !keys.is_empty();
        if keys.len() >= COMPACT_AFTER {
            Arc::make_mut(&mut self.objects).compact();
        }
        for k in keys {
            self.note(k);
        }
        changed
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn get(&self, key: &ObjectKey) -> Option<Object> {
        self.objects.get(key)
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// Every object (a copy of the maps; the objects themselves are shared).
    pub fn snapshot(&self) -> Snapshot {
        Snapshot::clone(&self.objects)
    }

    /// Every object, without copying the maps: the store's own, kept as they are while the
    /// caller holds them (a change meanwhile copies them once).
    pub fn shared_snapshot(&self) -> Arc<Snapshot> {
        self.objects.clone()
    }

    /// The changes recorded since the last call (empty unless [`Store::track_changes`]).
    pub fn take_changes(&mut self) -> Changes {
        match self.default_feed {
            Some(id) => self.take(id),
            None => Changes {
                generation: self.generation,
                ..Changes::default()
            },
        }
    }

    /// The generation of `feed`'s last change.
    pub fn feed_generation(&self, feed: FeedId) -> u64 {
        self.feeds[feed.0].generation
    }

    /// What changed for `feed` since it last took; `generation` is the feed's.
    pub fn take(&mut self, feed: FeedId) -> Changes {
        let f = &mut self.feeds[feed.0];
        let (keys, since, generation) = (std::mem::take(&mut f.keys), f.since.take(), f.generation);
        let objects = if keys.len() >= COMPACT_AFTER {
            // Many (a first sync: all): one ordered walk beside the map instead of a lookup
            // per key (a B-tree descent comparing names at every level, 200,000 of them at
            // 100,000 services). Both are in (kind, namespace, name) order.
            let mut present = self.objects.objects().map(|o| (o.key(), o)).peekable();
            keys.into_iter()
                .map(|k| {
                    while present.next_if(|(p, _)| *p < k).is_some() {}
                    let o = present.next_if(|(p, _)| *p == k).map(|(_, o)| o);
                    (k, o)
                })
                .collect()
        } else {
            keys.into_iter()
                .map(|k| {
                    let o = self.objects.get(&k);
                    (k, o)
                })
                .collect()
        };
        Changes {
            generation,
            objects,
            since,
        }
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

    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.inner.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// See [`Store::track_changes`].
    pub fn track_changes(&self) {
        self.lock().track_changes()
    }

    /// See [`Store::take_changes`].
    pub fn take_changes(&self) -> Changes {
        self.lock().take_changes()
    }

    /// See [`Store::feed`].
    pub fn feed(&self, kinds: &[Kind]) -> FeedId {
        self.lock().feed(kinds)
    }

    /// See [`Store::take`].
    pub fn take(&self, feed: FeedId) -> Changes {
        self.lock().take(feed)
    }

    /// Waits until `feed`'s generation exceeds `seen` (a change of its kinds) or `timeout`
    /// passes; returns the feed's generation. Other kinds' changes do not wake it.
    pub fn wait_feed(&self, feed: FeedId, seen: u64, timeout: Duration) -> u64 {
        let (m, cv) = &*self.inner;
        let deadline = Instant::now() + timeout;
        let mut s = m.lock().unwrap_or_else(|e| e.into_inner());
        while s.feed_generation(feed) <= seen {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                break;
            };
            s = cv
                .wait_timeout(s, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        s.feed_generation(feed)
    }

    /// (the feed's generation, every object) now, without copying the maps: for a consumer
    /// that reads the whole set but is woken only by its feed's kinds.
    pub fn feed_snapshot(&self, feed: FeedId) -> (u64, Arc<Snapshot>) {
        let s = self.lock();
        (s.feed_generation(feed), s.shared_snapshot())
    }

    /// The current version of one object.
    pub fn get(&self, key: &ObjectKey) -> Option<Object> {
        self.lock().get(key)
    }

    /// The generation now.
    pub fn generation(&self) -> u64 {
        self.lock().generation()
    }

    /// Waits until the generation exceeds `seen` or `timeout` passes; returns the generation.
    pub fn wait_newer_generation(&self, seen: u64, timeout: Duration) -> u64 {
        let (m, cv) = &*self.inner;
        let deadline = Instant::now() + timeout;
        let mut s = m.lock().unwrap_or_else(|e| e.into_inner());
        while s.generation() <= seen {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                break;
            };
            s = cv
                .wait_timeout(s, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        s.generation()
    }

    /// (generation, snapshot) now.
    pub fn snapshot(&self) -> (u64, Snapshot) {
        let s = self.inner.0.lock().unwrap_or_else(|e| e.into_inner());
        (s.generation(), s.snapshot())
    }

    /// (generation, the store's objects) now, without copying the maps
    /// ([`Store::shared_snapshot`]).
    pub fn shared_snapshot(&self) -> (u64, Arc<Snapshot>) {
        let s = self.lock();
        (s.generation(), s.shared_snapshot())
    }

    /// [`SharedStore::wait_newer`], without copying the maps ([`Store::shared_snapshot`]).
    pub fn wait_newer_shared(&self, seen: u64, timeout: Duration) -> Option<(u64, Arc<Snapshot>)> {
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
        Some((s.generation(), s.shared_snapshot()))
    }

    /// Waits until the generation exceeds `seen` (or `timeout` passes) and returns the new one.
    pub fn wait_newer(&self, seen: u64, timeout: Duration) -> Option<(u64, Snapshot)> {
        let (generation, shared) = self.wait_newer_shared(seen, timeout)?;
        Some((generation, Snapshot::clone(&shared)))
    }
}

impl EventSink for SharedStore {
    fn send(&self, ev: Event) -> bool {
        self.apply(ev);
        true
    }
}
