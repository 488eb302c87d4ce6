//! What `weir doctor` and `weir trace` read when not looking at a live node: a directory of
//! saved outputs, one file holding one output or many (a ticket body), or `-` (standard input).

use std::io::Read;
use std::path::Path;

use anyhow::Context;
use weir_netdiag::state::NodeState;

/// The node state of `input`, and the notes about files of which nothing was recognised.
pub fn read(input: &Path) -> anyhow::Result<(NodeState, Vec<String>)> {
    let (st, ignored) = if input == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("cannot read standard input")?;
        (
            NodeState::from_sources([("-".to_string(), text)]),
            Vec::new(),
        )
    } else {
        NodeState::from_path(input).with_context(|| format!("cannot read {}", input.display()))?
    };
    let mut notes = Vec::new();
    if !ignored.is_empty() {
        notes.push(format!("nothing recognised in: {}", ignored.join(", ")));
    }
    Ok((st, notes))
}
