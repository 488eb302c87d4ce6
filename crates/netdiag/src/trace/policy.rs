//! weir's NetworkPolicy table read back as policy (`table inet weir-policy`, written by
//! weir-policy's renderer: docs/policy.md "The nftables table"). The walk evaluates its rules
//! like any other nft table; this module says what a rule it met means: which policy allowed
//! the packet, or that the pod is isolated and no policy allows it, naming the policies that
//! isolate it. The rule comments are the source (`weir_policy::nft::RuleComment`, the
//! renderer's own reader): chain names may be hashed, comments always name pod and policy.

use std::net::IpAddr;

use serde_json::Value;
use weir_policy::nft::RuleComment;

use crate::nft::{Rule, Ruleset};

use super::packet::{Pkt, PolicyDecision, PolicyVerdict};
use super::walker::{Dropped, Walker};

/// weir-policy's table: `inet`, named as the renderer names it.
pub(super) fn is_policy_table(family: &str, table: &str) -> bool {
    family == "inet" && table == weir_policy::nft::TABLE
}

/// `ingress` or `egress` from a verdict map's name (`@ingress4`, `@egress6`).
fn map_direction(data: &Value) -> Option<&'static str> {
    let name = data.as_str()?.strip_prefix('@')?;
    if name.starts_with("ingress") {
        Some("ingress")
    } else if name.starts_with("egress") {
        Some("egress")
    } else {
        None
    }
}

/// The address a direction's map looks up: the destination pod's for ingress, the source
/// pod's for egress.
fn policed_address(direction: &str, p: &Pkt) -> IpAddr {
    if direction == "ingress" {
        p.dst
    } else {
        p.src
    }
}

/// "shop/a, shop/b and 3 more".
fn policy_list(names: &[String], more: usize) -> String {
    let mut text = names.join(", ");
    if more > 0 {
        if text.is_empty() {
            text = format!("{more} policies");
        } else {
            text.push_str(&format!(" and {more} more"));
        }
    }
    text
}

impl PolicyDecision {
    /// "no policy allows ingress to shop/db-2 (isolated by shop/default-deny, shop/db-deny)",
    /// "allowed by shop/web-from-lb", …: the decision as people read it.
    pub fn describe(&self) -> String {
        let pod = self.pod.as_deref().unwrap_or("the pod");
        let to = if self.direction == "ingress" {
            "to"
        } else {
            "from"
        };
        match self.verdict {
            PolicyVerdict::Allowed => format!(
                "{} {to} {pod} allowed by {}",
                self.direction,
                self.allowed_by.as_deref().unwrap_or("a policy")
            ),
            PolicyVerdict::Itself => format!(
                "{} {to} {pod} allowed: its own address (a pod cannot block itself)",
                self.direction
            ),
            PolicyVerdict::Dropped => {
                let list = policy_list(&self.isolated_by, self.isolated_by_more);
                let isolated = if list.is_empty() {
                    String::new()
                } else {
                    format!(" (isolated by {list})")
                };
                format!("no policy allows {} {to} {pod}{isolated}", self.direction)
            }
            PolicyVerdict::NotIsolated => format!(
                "{} {to} {}: not isolated (no pod on this node isolated for {} has this address)",
                self.direction, self.address, self.direction
            ),
        }
    }
}

impl Walker<'_> {
    /// A verdict rule (`accept`, `return`, `drop`) of weir's policy table met in `chain`:
    /// records the hop in policy's words and the decision. False when the rule is not one
    /// the table's renderer writes in a pod chain (the caller records its plain hop).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn policy_verdict(
        &mut self,
        rs: &Ruleset,
        chain: &str,
        rule: &Rule,
        verdict: &str,
        p: &Pkt,
        stage: &str,
        place: &str,
    ) -> bool {
        let Some(comment) = rule.comment.as_deref().and_then(RuleComment::parse) else {
            if verdict == "accept" && rule.text.contains("ct state") {
                self.hop(
                    stage,
                    place,
                    Some(rule.text.clone()),
                    "accepted: part of a connection already allowed (NetworkPolicy judges a connection's first packet)",
                );
                return true;
            }
            return false;
        };
        // The chain's own drop comment names the pod, the direction and what isolates it.
        let Some(RuleComment::Drop {
            pod,
            direction,
            isolated_by,
            more,
            ..
        }) = chain_drop(rs, chain)
        else {
            return false;
        };
        let mut d = PolicyDecision {
            address: policed_address(&direction, p),
            direction,
            pod: Some(pod),
            verdict: PolicyVerdict::Allowed,
            allowed_by: None,
            isolated_by,
            isolated_by_more: more,
            rule: Some(rule.text.clone()),
        };
        let note = match (&comment, verdict) {
            (RuleComment::Allow { policy }, "accept" | "return") => {
                d.allowed_by = Some(policy.clone());
                d.describe()
            }
            (RuleComment::Itself { .. }, "accept" | "return") => {
                d.verdict = PolicyVerdict::Itself;
                d.describe()
            }
            (RuleComment::Drop { .. }, "drop") => {
                d.verdict = PolicyVerdict::Dropped;
                format!("DROPPED by NetworkPolicy: {}", d.describe())
            }
            _ => return false,
        };
        self.hop(stage, place, Some(rule.text.clone()), note);
        self.policy.push(d);
        true
    }

    /// A lookup in one of the table's verdict maps that found no element: the address is not
    /// an isolated pod's in that direction, so this table lets it pass.
    pub(super) fn policy_miss(
        &mut self,
        data: &Value,
        p: &Pkt,
        stage: &str,
        place: &str,
        text: &str,
    ) {
        let Some(direction) = map_direction(data) else {
            return;
        };
        let d = PolicyDecision {
            direction: direction.into(),
            address: policed_address(direction, p),
            pod: None,
            verdict: PolicyVerdict::NotIsolated,
            allowed_by: None,
            isolated_by: Vec::new(),
            isolated_by_more: 0,
            rule: Some(text.into()),
        };
        self.hop(stage, place, Some(text.into()), d.describe());
        self.policy.push(d);
    }

    /// The cause and fixes of a drop by the policy table's rule `rule`, when the walk's last
    /// policy decision is that drop.
    pub(super) fn policy_drop_cause(&self, stage: &str, rule: &str, p: &Pkt) -> Option<Dropped> {
        let d = self.policy.last()?;
        if d.verdict != PolicyVerdict::Dropped || d.rule.as_deref() != Some(rule) {
            return None;
        }
        Some((
            format!("{stage}: NetworkPolicy: {}", d.describe()),
            policy_fixes(d, p),
        ))
    }
}

/// The final drop's comment of a pod chain (its last rule).
fn chain_drop(rs: &Ruleset, chain: &str) -> Option<RuleComment> {
    rs.rules
        .iter()
        .filter(|r| is_policy_table(&r.family, &r.table) && r.chain == chain)
        .filter_map(|r| r.comment.as_deref().and_then(RuleComment::parse))
        .rfind(|c| matches!(c, RuleComment::Drop { .. }))
}

/// What would let the packet through: a rule allowing exactly this peer and port in some
/// policy selecting the pod (policies add up), and where to read the isolating ones.
fn policy_fixes(d: &PolicyDecision, p: &Pkt) -> Vec<String> {
    let pod = d.pod.as_deref().unwrap_or("the pod");
    let (peer, field, side) = if d.direction == "ingress" {
        (p.src, "from", "ingress")
    } else {
        (p.dst, "to", "egress")
    };
    let cidr = if peer.is_ipv6() { 128 } else { 32 };
    // NetworkPolicy ports name TCP, UDP or SCTP: ICMP passes only a rule without ports.
    let ports = if p.proto.has_ports() {
        format!(
            "with `ports: [{{protocol: {}, port: {}}}]`",
            p.proto.name().to_ascii_uppercase(),
            p.dport
        )
    } else {
        "and no `ports` (a rule listing ports allows no ICMP)".to_string()
    };
    let mut fixes = vec![format!(
        "allow it in a NetworkPolicy selecting {pod} (one more policy is enough: allows add up): an {side} rule `{field}: [{{ipBlock: {{cidr: {peer}/{cidr}}}}}]` (or a podSelector/namespaceSelector matching that peer) {ports}"
    )];
    let (namespace, _) = pod.split_once('/').unwrap_or((pod, ""));
    let names: Vec<&str> = d
        .isolated_by
        .iter()
        .map(|k| k.split_once('/').map_or(k.as_str(), |(_, n)| n))
        .collect();
    if !names.is_empty() {
        fixes.push(format!(
            "read what isolates it: kubectl -n {namespace} get networkpolicy {} -o yaml",
            names.join(" ")
        ));
    }
    fixes
}
