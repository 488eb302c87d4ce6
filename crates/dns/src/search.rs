//! Search-path amplification, answered server-side: the pure part (the server's `autopath`
//! option, [`crate::server::Handler::with_autopath`], drives it).
//!
//! A pod's resolv.conf says `search <ns>.svc.<zone> svc.<zone> <zone> [host domains]` and
//! `options ndots:5`, so glibc turns one lookup of `example.com` (fewer than 5 dots) into
//! `example.com.<ns>.svc.<zone>`, `example.com.svc.<zone>`, `example.com.<zone>`, … and
//! finally `example.com.` — per address family. The first of those queries already names
//! the client's namespace (`<ns>`), so the server can walk the rest of the list itself and
//! answer the first query with `CNAME <the name that resolved>` plus its records: one
//! round trip instead of up to five, and no pod watch (CoreDNS's autopath needs `pods
//! verified` for the namespace).
//!
//! [`expansion`] recognises such a first query; [`SearchExpansion::candidates`] lists what
//! the client would ask next, in order. A candidate that answers NXDOMAIN or NODATA makes
//! glibc move on, so the server does too; when every candidate is negative the server must
//! answer the original query NXDOMAIN (the client then walks its list itself, as without
//! this feature — never a wrong answer, at worst no saving).

use hickory_proto::rr::Name;

/// A query that looks like the first expansion of a pod's search list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchExpansion {
    /// What the client was looking up (`example.com`), as a relative name.
    pub short: Name,
    /// The client's namespace (the label before `svc.<zone>`).
    pub namespace: String,
}

/// `qname` = `<short>.<ns>.svc.<zone>` with a non-empty `<short>` and `<ns>` a namespace the
/// zone knows (`known_namespace`): the first search-path expansion of `<short>` by a pod in
/// `<ns>`. Only meaningful when `qname` itself is NXDOMAIN in the zone (the caller checks
/// first), since a real service or endpoint name has the same shape. The namespace check
/// matters: the *second* expansion `example.com.svc.<zone>` has the same shape as `example`
/// in a namespace `com`, and must not be rewritten unless such a namespace exists.
pub fn expansion(
    qname: &Name,
    origin: &Name,
    known_namespace: impl Fn(&str) -> bool,
) -> Option<SearchExpansion> {
    let svc = Name::from_ascii("svc").ok()?.append_domain(origin).ok()?;
    let mut fqdn = qname.clone();
    fqdn.set_fqdn(true);
    // <short> (≥1 label) + <ns> (1 label) + svc.<zone>
    let extra = usize::from(fqdn.num_labels()).checked_sub(usize::from(svc.num_labels()))?;
    if extra < 2 || !svc.zone_of(&fqdn) {
        return None;
    }
    let labels: Vec<&[u8]> = fqdn.iter().collect();
    let namespace = String::from_utf8_lossy(labels[extra - 1]).to_ascii_lowercase();
    if !known_namespace(&namespace) {
        return None;
    }
    let mut short = Name::from_labels(labels[..extra - 1].iter().copied()).ok()?;
    short.set_fqdn(false);
    Some(SearchExpansion { short, namespace })
}

impl SearchExpansion {
    /// The names the client would ask after the first expansion, in its order:
    /// `<short>.svc.<zone>`, `<short>.<zone>`, `<short>.<d>` for each host search domain
    /// `d`, then `<short>.` itself. Names that would be too long are left out.
    pub fn candidates(&self, origin: &Name, host_search: &[Name]) -> Vec<Name> {
        let svc = Name::from_ascii("svc")
            .and_then(|n| n.append_domain(origin))
            .ok();
        let domains = svc
            .into_iter()
            .chain(std::iter::once(origin.clone()))
            .chain(host_search.iter().cloned())
            .chain(std::iter::once(Name::root()));
        domains
            .filter_map(|d| self.short.clone().append_domain(&d).ok())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(ns: &str) -> bool {
        ["shop", "other"].contains(&ns)
    }

    fn n(s: &str) -> Name {
        Name::from_ascii(s).unwrap()
    }

    #[test]
    fn first_expansions_are_recognised() {
        let z = n("cluster.local.");
        let cases: &[(&str, Option<(&str, &str)>)] = &[
            (
                "example.com.shop.svc.cluster.local.",
                Some(("example.com", "shop")),
            ),
            (
                "WWW.Example.COM.Shop.svc.cluster.local.",
                Some(("WWW.Example.COM", "shop")),
            ),
            (
                "web.shop.other.svc.cluster.local.",
                Some(("web.shop", "other")),
            ),
            ("api.shop.svc.cluster.local", Some(("api", "shop"))),
            // Not a first expansion: the second and third search domains (the second has
            // the shape of `example` in namespace `com`, which does not exist), the zone's
            // own names, other zones.
            ("example.com.svc.cluster.local.", None),
            ("shop.svc.cluster.local.", None),
            ("example.com.cluster.local.", None),
            ("example.com.", None),
            ("a.shop.svc.other.local.", None),
        ];
        for (q, want) in cases {
            let got = expansion(&n(q), &z, known);
            let want = want.map(|(short, ns)| SearchExpansion {
                short: n(short),
                namespace: ns.to_string(),
            });
            assert_eq!(got, want, "{q}");
        }
    }

    #[test]
    fn candidates_follow_the_kubelet_search_list_then_the_name_itself() {
        let z = n("cluster.local.");
        let e = expansion(&n("example.com.shop.svc.cluster.local."), &z, known).unwrap();
        let got: Vec<String> = e
            .candidates(&z, &[n("corp.internal.")])
            .iter()
            .map(|c| c.to_ascii())
            .collect();
        assert_eq!(
            got,
            vec![
                "example.com.svc.cluster.local.",
                "example.com.cluster.local.",
                "example.com.corp.internal.",
                "example.com.",
            ]
        );
        // `svc.ns` from another namespace: the second candidate is the real service.
        let e = expansion(&n("web.shop.other.svc.cluster.local."), &z, known).unwrap();
        assert_eq!(
            e.candidates(&z, &[])[0].to_ascii(),
            "web.shop.svc.cluster.local."
        );
    }
}
