//! weir-cni: the CNI plugin (spec 1.1). `spec` is the protocol, `config` the network configuration
//! (with `requests`, what the runtime asks for one attachment, and `resolv`), `ipam` the address
//! store, `mode` the trait every mode implements (ADD, DEL, CHECK, GC, STATUS), `result` the ADD
//! result both modes build, `bridge` bridge mode (with `masq`, its masquerade table), `eni` the
//! whole of eni-shared mode, and `plugin` ties one invocation together.

pub mod bridge;
pub mod config;
pub mod eni;
pub mod ipam;
pub mod masq;
pub mod mode;
pub mod plugin;
pub mod requests;
mod resolv;
pub mod result;
pub mod spec;
