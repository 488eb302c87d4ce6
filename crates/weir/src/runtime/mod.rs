//! The node agent's runtime: one object source and one store ([`source`]), each part's
//! window on it ([`views`]), and the parts' shared health and metrics ([`parts`]). `weir
//! agent` runs several parts over it; `weir proxy`, `weir routes` and `weir policy` run one.

pub mod flags;
pub mod parts;
pub mod source;
pub mod views;
