//! Conditions said when they appear, change and clear: now `weir_model::conditions`, shared
//! with the agent loops in the library crates.

pub use weir_model::conditions::Conditions;
