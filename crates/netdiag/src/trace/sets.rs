//! `-m set --match-set NAME FLAGS`: membership in the ipsets of `ipset list` or `ipset save`.

use crate::ipset::Fields;
use crate::iptables::Rule as IptRule;

use super::packet::Pkt;
use super::walker::Walker;

impl Walker<'_> {
    /// Parses the state's ipset and IPVS outputs once; what they skipped is an assumption.
    pub(super) fn parse_sets_and_ipvs(&mut self) {
        if let Some(text) = &self.st.ipset {
            let parsed = crate::ipset::parse(text);
            for s in &parsed.skipped {
                self.assume(format!(
                    "ipset line {} not read ({}): `{}`",
                    s.line, s.reason, s.text
                ));
            }
            self.sets = Some(parsed.value);
        }
        if let Some(text) = &self.st.ipvs {
            let parsed = crate::ipvs::parse(text);
            for s in &parsed.skipped {
                self.assume(format!(
                    "ipvsadm line {} not read ({}): `{}`",
                    s.line, s.reason, s.text
                ));
            }
            if !parsed.value.is_empty() && !self.st.addresses_complete() {
                self.assume("IPVS virtual servers' addresses are taken as local (kube-proxy's ipvs mode binds them to kube-ipvs0): neither table local nor a whole ip addr is in the dump to say so");
            }
            self.ipvs = Some(parsed.value);
        }
    }

    /// Whether the packet is in the set a rule names; `None` (the rule counts as not
    /// matching) when the set or the ipset output is missing.
    pub(super) fn set_match(&mut self, r: &IptRule, values: &[String], p: &Pkt) -> Option<bool> {
        let name = values.first()?;
        let flags = values.get(1).map(String::as_str).unwrap_or("dst");
        let Some(sets) = &self.sets else {
            self.assume(format!(
                "no ipset output: rules matching set {name} count as not matching (`{}`)",
                r.text
            ));
            return None;
        };
        let Some(set) = sets.iter().find(|s| &s.name == name) else {
            self.assume(format!(
                "set {name} is not in the ipset output: treated as empty"
            ));
            return Some(false);
        };
        let fields = Fields {
            src: p.src,
            dst: p.dst,
            proto: p.proto.name(),
            sport: p.sport,
            dport: p.dport,
        };
        let hit = set.contains(flags, &fields);
        if hit.is_none() && set.cut {
            self.assume(format!(
                "set {name} was cut with grep and the packet is not among the members shown: rules using it count as not matching (`{}`)",
                r.text
            ));
        } else if hit.is_none() {
            self.assume(format!(
                "ipset type {} (set {name}) not modelled: rules using it count as not matching",
                set.kind
            ));
        }
        hit
    }
}
