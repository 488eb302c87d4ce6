//! weir-source: where cluster objects come from.
//!
//! * [`parse_manifest`] / [`ManifestDir`]: Services, EndpointSlices and Nodes from a directory of
//!   ordinary (multi-document, `kind: List`) Kubernetes YAML manifests, with per-file/per-object
//!   error isolation: a broken file or object never makes good objects disappear.
//! * [`Store`] / [`SharedStore`]: objects keyed by kind/namespace/name, fed by [`Event`]s through
//!   the [`EventSink`] trait — the same interface a Kubernetes API watcher will use.
//! * [`watch_dir`]: a polling watcher (mtime, ctime, size, inode) that sends a full
//!   [`Event::Resync`] only when something changed.

mod manifest;
mod store;
mod watch;

pub use manifest::{parse_manifest, ManifestDir, ManifestError, Parsed, ScanReport};
pub use store::{Event, EventSink, SharedStore, Store};
pub use watch::{watch_dir, PollWatcher};
pub use weir_model::{Kind, Object, ObjectKey, Snapshot};
