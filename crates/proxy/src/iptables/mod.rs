//! iptables mode: kube-proxy's iptables layout (same chain names and hashes, so an
//! `iptables-save` of a weir node reads like a kube-proxy node's), applied with
//! `iptables-restore --noflush` / `ip6tables-restore --noflush`.
//!
//! * [`names`]: kube-proxy's chain-name hashes.
//! * [`render_full`] / [`render_update`] / [`render_diff`]: pure, plan (or the plan the kernel
//!   holds and a diff) → restore input for one family.
//! * [`IptablesBackend`]: the [`Backend`](crate::Backend) that applies them, ensures the
//!   jump rules in the built-in chains, and cleans up.

mod apply;
pub mod detect;
mod jumps;
pub mod names;
mod render;
pub(crate) mod restore;
pub(crate) mod tools;

pub use apply::IptablesBackend;
pub use detect::BackendChoice;
pub use jumps::{jumps, Jump};
pub use render::{
    chains_in, diff_to_plan, family_diff, family_view, is_weir_chain, nft_chains_per_commit,
    probability, render_diff, render_full, render_full_replacing, render_update,
    service_chain_names, IptablesOptions, KUBE_FIREWALL, KUBE_PROXY_FIREWALL,
    NFT_CHAINS_PER_COMMIT, STATIC_CHAINS,
};
pub use restore::Table;
pub use tools::{chains_in_save, Flavor, Tool};
