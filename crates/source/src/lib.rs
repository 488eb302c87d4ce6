//! weir-source: where cluster objects come from.
//!
//! * [`parse_manifest`] / [`ManifestDir`]: Services, EndpointSlices, Nodes and Pods (and, when
//!   asked, [`ParseOptions::policy`], Namespaces and NetworkPolicies) from a directory of
//!   ordinary (multi-document, `kind: List`) Kubernetes YAML manifests, with per-file/per-object
//!   error isolation: a broken file or object never makes good objects disappear.
//! * [`Store`] / [`SharedStore`]: objects keyed by kind/namespace/name, fed by [`Event`]s through
//!   the [`EventSink`] trait — the interface the manifest watcher and the API watchers share — recording
//!   which keys changed ([`Changes`]) for a consumer that works per change (the proxy).
//! * [`watch_dir`]: a polling watcher (mtime, ctime, size, inode) that sends a full
//!   [`Event::Resync`] only when something changed, never before it has a complete view and
//!   never because the directory vanished; its [`SourceStatus`] says when it is stale.
//! * [`api`] (cargo feature `kube`): the same objects from the Kubernetes API with kube-rs
//!   watchers (initial list, watch with bookmarks, resume, re-list on 410 Gone, backoff).
//! * Bounded reading ([`Limits`]): regular files only, sizes, directory depth and YAML
//!   nesting capped, never a blocking open; optional last-known-good copies on disk.

#[cfg(feature = "kube")]
pub mod api;
mod dir;
mod last_good;
mod manifest;
mod nesting;
#[cfg(feature = "kube")]
pub mod served;
mod store;
mod watch;
pub mod yaml;

pub use dir::{Limits, ManifestDir, ScanReport};
pub use manifest::{
    parse_manifest, parse_manifest_limited, parse_manifest_with, ManifestError, ParseOptions,
    Parsed, DEFAULT_MAX_NESTING,
};
pub use store::{Changes, Event, EventSink, FeedId, SharedStore, Store};
pub use watch::{watch_dir, PollWatcher, SourceStatus, WatchEvent};
pub use weir_model::{Kind, Object, ObjectKey, Snapshot};
