//! nftables mode (the default): [`render`] turns a plan into ruleset text (pure),
//! [`NftBackend`] applies it.

mod apply;
pub mod element;
mod render;

pub use apply::NftBackend;
pub use render::{render_full, render_update, NftOptions};
