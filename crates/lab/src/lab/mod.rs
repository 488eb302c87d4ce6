//! Bringing a lab up and down, and reporting on it.
//!
//! One job a module: `up` builds a lab step by step from its topology ([`up()`]); `nodes` makes
//! nodes and pods and lets nodes join and leave a running lab; `agents` launches the per-node
//! `weir routes` and `weir proxy`; `down` removes a lab; `status` reports on one; `context`
//! holds what they are all given. The wires they lay are [`crate::links`].

mod agents;
mod context;
mod down;
mod nodes;
mod status;
mod up;

pub use agents::{proxy_launch, restart_proxy, routes_launch, Restart};
pub use context::{Binaries, Progress};
pub use down::{down, DownReport};
pub use nodes::{add_node, remove_node};
pub use status::{load_state, render_services, render_status, status, target_netns, StatusRow};
pub use up::up;
