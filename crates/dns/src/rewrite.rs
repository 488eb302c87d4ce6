//! Name rewrites (CoreDNS's `rewrite name exact|suffix FROM TO` with the answer names
//! rewritten back): the question is answered as if it had asked for the new name, and the
//! client sees its own name in the question and in the answers. Pure.

use hickory_proto::op::Message;
use hickory_proto::rr::Name;

/// Which names a rule takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameMatch {
    /// This name only.
    Exact(Name),
    /// This name and every name under it: the suffix is replaced (`a.old.` → `a.new.`).
    Suffix(Name),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewrite {
    pub from: NameMatch,
    pub to: Name,
}

impl Rewrite {
    /// `name` rewritten by this rule, if it applies.
    pub fn apply(&self, name: &Name) -> Option<Name> {
        match &self.from {
            NameMatch::Exact(from) => (from == name).then(|| self.to.clone()),
            NameMatch::Suffix(from) if from.zone_of(name) => {
                let keep = usize::from(name.num_labels() - from.num_labels());
                let head = Name::from_labels(name.iter().take(keep)).ok()?;
                head.append_domain(&self.to).ok()
            }
            NameMatch::Suffix(_) => None,
        }
    }

    /// Whether this rule can take a name at or under `zone` (the zone's precomputed answers
    /// must then not be served before the rule is applied).
    pub fn touches(&self, zone: &Name) -> bool {
        match &self.from {
            NameMatch::Exact(from) => zone.zone_of(from),
            NameMatch::Suffix(from) => zone.zone_of(from) || from.zone_of(zone),
        }
    }
}

/// The first rule's rewrite of `name` (rules are tried in order, the first that applies
/// wins, as CoreDNS's default `stop`).
pub fn rewrite(rules: &[Rewrite], name: &Name) -> Option<Name> {
    rules.iter().find_map(|r| r.apply(name))
}

/// The reply to a rewritten question, as the client asked it: the question back to
/// `original`, and answer records owned by `rewritten` owned by `original` again.
pub fn restore(msg: &mut Message, original: &Name, rewritten: &Name) {
    for q in &mut msg.queries {
        if q.name() == rewritten {
            q.set_name(original.clone());
        }
    }
    for r in &mut msg.answers {
        if r.name == *rewritten {
            r.name = original.clone();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> Name {
        Name::from_ascii(s).unwrap()
    }

    #[test]
    fn exact_and_suffix_rules_in_order() {
        let rules = [
            Rewrite {
                from: NameMatch::Exact(n("db.corp.")),
                to: n("pg.data.svc.cluster.local."),
            },
            Rewrite {
                from: NameMatch::Suffix(n("corp.")),
                to: n("default.svc.cluster.local."),
            },
        ];
        assert_eq!(
            rewrite(&rules, &n("DB.corp.")),
            Some(n("pg.data.svc.cluster.local."))
        );
        assert_eq!(
            rewrite(&rules, &n("web.corp.")),
            Some(n("web.default.svc.cluster.local."))
        );
        assert_eq!(
            rewrite(&rules, &n("corp.")),
            Some(n("default.svc.cluster.local."))
        );
        assert_eq!(rewrite(&rules, &n("web.notcorp.")), None);
        let zone = n("cluster.local.");
        assert!(!rules[0].touches(&zone));
        let inside = Rewrite {
            from: NameMatch::Exact(n("old.default.svc.cluster.local.")),
            to: n("new.default.svc.cluster.local."),
        };
        assert!(inside.touches(&zone));
        let above = Rewrite {
            from: NameMatch::Suffix(n("local.")),
            to: n("x."),
        };
        assert!(above.touches(&zone));
    }
}
