//! weir-proxy: renderers from the service plan to dataplane rules.
