//! What a mode of the plugin is: the five verbs that touch the node, behind one trait, as
//! netavark's network drivers are. `bridge` and `eni` each implement [`Mode`]; `plugin` picks one
//! from the configuration and does, once for both, what the spec asks before a verb reaches a
//! mode (see [`Mode`]). Also the error mappings both modes share.

use std::path::Path;

use serde_json::Value;
use weir_kernel::NetNs;

use crate::config::Attachment;
use crate::spec::{CniError, CniResult, ErrorCode, Outcome};

/// One CNI mode: ADD, DEL, CHECK, GC and STATUS for the network its configuration describes.
///
/// By the time a method is called, `plugin` has done what the spec asks of every plugin, so no
/// mode repeats it: the environment is validated; CHECK has cniVersion 0.4.0 or later and a
/// parsed prevResult; GC and STATUS have 1.1.0 or later; GC has `cni.dev/valid-attachments`;
/// and `disableCheck`/`disableGC` have answered without calling the mode. Errors carry the
/// spec's codes, the same in every mode.
pub trait Mode {
    /// The keys of this mode's configuration that `plugin` acts on itself.
    fn common(&self) -> CommonConf<'_>;

    /// Allocates the attachment's addresses and builds it in the pod's namespace `netns`; on any
    /// failure, undoes what this ADD made. The result is in the 1.x shape (`plugin` renders it in
    /// the configuration's version).
    fn add(&self, attachment: AttachmentId<'_>, netns: &Path) -> CniResult<Outcome>;

    /// Removes the attachment and releases its addresses. Idempotent, and needs nothing but the
    /// configuration and the store: not the pod's namespace.
    fn del(&self, attachment: AttachmentId<'_>) -> CniResult<()>;

    /// Verifies that what ADD made, as `prev` (the parsed prevResult) describes, is in place.
    fn check(&self, attachment: AttachmentId<'_>, netns: &Path, prev: &Outcome) -> CniResult<()>;

    /// Tears down every attachment of this network not in `valid` (container ID, ifname) and
    /// removes this network's leftovers; never touches another network's state.
    fn gc(&self, valid: &[(String, String)]) -> CniResult<()>;

    /// Answers whether the plugin can serve ADDs now (code 50 when it cannot).
    fn status(&self) -> CniResult<()>;
}

/// The keys every mode's configuration has and `plugin` reads for the protocol itself.
pub struct CommonConf<'a> {
    pub cni_version: &'a str,
    pub prev_result: Option<&'a Value>,
    pub valid_attachments: Option<&'a [Attachment]>,
    /// libcni's `disableCheck`: CHECK answers success without asking the mode.
    pub disable_check: bool,
    /// libcni's `disableGC`: GC answers success without asking the mode.
    pub disable_gc: bool,
}

/// The attachment an ADD, DEL or CHECK is about: `CNI_CONTAINERID` and `CNI_IFNAME`, validated.
#[derive(Debug, Clone, Copy)]
pub struct AttachmentId<'a> {
    pub container_id: &'a str,
    pub ifname: &'a str,
}

/// Opens the pod's namespace; a missing one is "container unknown" (code 3).
pub fn open_netns(path: &Path) -> CniResult<NetNs> {
    NetNs::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => CniError::new(
            ErrorCode::UnknownContainer,
            format!("network namespace {} does not exist", path.display()),
        ),
        // a FIFO, a plain file, another kind of namespace: the runtime passed a wrong CNI_NETNS
        std::io::ErrorKind::InvalidInput => CniError::new(
            ErrorCode::InvalidEnvironment,
            format!("CNI_NETNS {} is not a network namespace", path.display()),
        ),
        _ => CniError::new(
            ErrorCode::Io,
            format!("open network namespace {}: {e}", path.display()),
        ),
    })
}

/// An IPAM store error as the CNI error code its kind calls for.
pub fn ipam_err(e: crate::ipam::IpamError) -> CniError {
    use crate::ipam::IpamError;
    let code = match &e {
        IpamError::Exhausted { .. } => ErrorCode::RangeExhausted,
        IpamError::Io { .. } => ErrorCode::Io,
        IpamError::Config(_) | IpamError::Requested(_) => ErrorCode::InvalidConfig,
        IpamError::Taken(_) => ErrorCode::AddressInUse,
    };
    CniError::new(code, e.to_string())
}
