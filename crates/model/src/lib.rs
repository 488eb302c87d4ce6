//! weir-model
