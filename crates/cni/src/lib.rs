//! weir-cni
