//! weir-netdiag: what `weir doctor` and `weir trace` know about a node.
//!
//! Parsers for the outputs operators already paste into tickets (`iptables-save`, `nft -j list
//! ruleset`, `ip -j rule|route|link|addr` and their plain-text forms, `sysctl -a` lines), the
//! node state they add up to, and pure checks over that state. Nothing here touches the system
//! except the [`live`] module, which runs the tools (optionally inside a network namespace) and
//! hands their text to the same parsers, so every check is testable on captured outputs.
//!
//! Every parser is lenient by contract: a line or element it cannot read is reported in
//! [`Skipped`] and the rest of the file still counts, because operators paste partial,
//! grep-cut and old-version outputs.

pub mod check;
pub mod conntrack;
pub mod doctor;
pub mod doctor_policy;
pub mod hairpin;
pub mod intake;
pub mod iproute;
pub mod ipset;
pub mod iptables;
pub mod iptables_listing;
pub mod ipvs;
pub mod kernel_log;
pub mod live;
pub mod nft;
pub mod nft_text;
pub mod objects;
pub mod output;
pub mod paste;
pub mod route_get;
pub mod state;
pub mod sysctl;
pub mod tcpdump;
pub mod trace;

use serde::Serialize;

/// Something a parser could not read and left out. `line` is 1-based for text inputs and the
/// element's index for JSON arrays.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skipped {
    pub line: usize,
    pub text: String,
    pub reason: String,
    /// `file:line` of the input, when read from a paste of several outputs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
}

impl Skipped {
    pub fn new(line: usize, text: impl Into<String>, reason: impl Into<String>) -> Self {
        let mut text = text.into();
        if text.len() > 200 {
            let mut cut = 200;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push('…');
        }
        Skipped {
            line,
            text,
            reason: reason.into(),
            origin: None,
        }
    }
}

/// A parsed value and what was skipped on the way.
#[derive(Debug, Clone, Serialize)]
pub struct Parsed<T> {
    pub value: T,
    pub skipped: Vec<Skipped>,
}
