//! weir-proxy: renderers from the service [`weir_model::Plan`] to dataplane rules.
//!
//! So far: [`nft`], the nftables renderer (pure: plan → `nft -f` script text).

pub mod nft;
