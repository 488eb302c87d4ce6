//! nftables mode (the default): [`render`] turns a plan into ruleset text (pure),
//! [`NftBackend`] applies it.

mod apply;
pub(crate) use apply::nft_script;
pub mod element;
pub mod netlink;
mod render;

pub use apply::{NftBackend, COLD_START_CHUNK};
pub use render::{
    render_full, render_structure, render_update, render_update_parts, ruleset, ruleset_encoded,
    update, EncodedSets, EndpointRefs, NftOptions, Ruleset, Update,
};
