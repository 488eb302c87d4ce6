//! weir-source
