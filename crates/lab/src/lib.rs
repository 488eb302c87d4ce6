//! weir-lab
