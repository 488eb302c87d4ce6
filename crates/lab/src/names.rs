//! Namespace names of a lab: everything is `wl-<lab>-…`.

pub fn prefix(lab: &str) -> String {
    format!("wl-{lab}-")
}
pub fn switch(lab: &str) -> String {
    format!("wl-{lab}-sw")
}
pub fn outside(lab: &str) -> String {
    format!("wl-{lab}-out")
}
pub fn node(lab: &str, node: &str) -> String {
    format!("wl-{lab}-{node}")
}
pub fn pod(lab: &str, node: &str, pod: &str) -> String {
    format!("wl-{lab}-{node}-{pod}")
}

/// What a namespace of `lab` stands for, recovered from its name alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NsRole {
    Switch,
    Outside,
    Node(String),
    Pod { node: String, pod: String },
}

pub fn parse(lab: &str, ns: &str) -> Option<NsRole> {
    let rest = ns.strip_prefix(&prefix(lab))?;
    let parts: Vec<&str> = rest.split('-').collect();
    match parts.as_slice() {
        ["sw"] => Some(NsRole::Switch),
        ["out"] => Some(NsRole::Outside),
        [node] if !node.is_empty() => Some(NsRole::Node(node.to_string())),
        [node, pod] if !node.is_empty() && !pod.is_empty() => Some(NsRole::Pod {
            node: node.to_string(),
            pod: pod.to_string(),
        }),
        _ => None,
    }
}
