//! The routing decision: policy rules in priority order, then the table they lead to.

use std::net::{IpAddr, Ipv4Addr};

use crate::iproute::PolicyRule;

use super::{Dropped, Fact, Walker};

/// The output that settles a lookup the dump's routes cannot answer.
pub(super) const ROUTES_SETTLE: &str =
    "`ip route show table all` (ip-route.txt; `weir trace collect` saves it)";

/// The result of a routing decision.
#[derive(Debug, Clone)]
pub(super) struct RouteResult {
    pub(super) local: bool,
    pub(super) oif: String,
}

impl Walker<'_> {
    /// Policy routing: rules in priority order, the first whose table has a route decides.
    pub(super) fn route(
        &mut self,
        stage: &str,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        mark: u32,
        iif: &str,
    ) -> Result<RouteResult, Dropped> {
        let found = self.lookup(src, dst, mark, Some(iif));
        match found {
            Some((rule, route)) => {
                let local = route.kind == "local";
                if route.kind == "unknown" {
                    self.unknown_outcome = true;
                    self.hop(stage, "rules", Some(rule.clone()), route.text.clone());
                    return Err((
                        format!("{stage}: `{rule}` sends {dst} to a table the dump does not hold: where it goes is unknown"),
                        vec![],
                    ));
                }
                match route.kind.as_str() {
                    "blackhole" | "unreachable" | "prohibit" => {
                        self.hop(
                            stage,
                            format!("table {}", route.table),
                            Some(route.text.clone()),
                            format!("{dst}: {}", route.kind),
                        );
                        return Err((
                            format!(
                                "{stage}: route to {dst} is {} (`{}`)",
                                route.kind, route.text
                            ),
                            vec![],
                        ));
                    }
                    _ => {}
                }
                self.hop(
                    stage,
                    format!("table {}", route.table),
                    Some(format!("{} → {}", rule, route.text)),
                    if local {
                        format!("{dst} is local")
                    } else {
                        format!(
                            "from {src} to {dst} (mark {mark:#x}): out {}",
                            route.dev.clone().unwrap_or_default()
                        )
                    },
                );
                self.via_router = route.gateway.is_some();
                Ok(RouteResult {
                    local,
                    oif: route.dev.unwrap_or_default(),
                })
            }
            None => {
                if let Some(why) = self.routes_missing() {
                    // Nothing in the dump says there is no route: the routes were not pasted.
                    self.unknown_outcome = true;
                    self.hop(
                        stage,
                        "rules",
                        None,
                        format!("from {src} to {dst}: {why}: where it goes is unknown"),
                    );
                    return Err((
                        format!(
                            "{stage}: cannot tell where {dst} goes: {why}; settle it with {ROUTES_SETTLE}"
                        ),
                        vec![],
                    ));
                }
                self.hop(
                    stage,
                    "rules",
                    None,
                    format!("no route from {src} to {dst}"),
                );
                Err((format!("{stage}: no route to {dst}"), vec![]))
            }
        }
    }

    /// Why a lookup that found no route cannot conclude there is none: the dump holds no
    /// routes (no `ip route` output), or none of table main (only `ip route show table local`
    /// was pasted; every node with an address has routes in main). None when the dump holds
    /// table main, so that a missing route is a real "no route".
    pub(super) fn routes_missing(&self) -> Option<String> {
        match &self.st.routes {
            None => Some("the dump has no `ip route` output".into()),
            Some(rs) if !rs.iter().any(|r| r.table == "main" || r.table == "254") => {
                Some("the dump's routes hold no table main (only other tables were pasted)".into())
            }
            Some(_) => None,
        }
    }

    /// The policy rules (or the default ones) and the route they lead to.
    pub(super) fn lookup(
        &mut self,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        mark: u32,
        iif: Option<&str>,
    ) -> Option<(String, crate::iproute::Route)> {
        let rules: Vec<PolicyRule> = match &self.st.rules {
            Some(r) => r.clone(),
            None => crate::iproute::parse_rules("0: from all lookup local\n32766: from all lookup main\n32767: from all lookup default\n").value,
        };
        for r in &rules {
            let mut hit = r.src.is_none_or(|n| n.contains(&IpAddr::V4(src)))
                && r.dst.is_none_or(|n| n.contains(&IpAddr::V4(dst)))
                && r.fwmark.is_none_or(|(m, k)| mark & k == m)
                && r.iif.as_deref().is_none_or(|i| Some(i) == iif)
                && r.oif.is_none();
            if r.not {
                hit = !hit;
            }
            if !hit {
                continue;
            }
            match r.action.as_str() {
                "lookup" => {
                    let table = match r.table.as_deref() {
                        Some("254") | None => "main",
                        Some("255") => "local",
                        Some("253") => "default",
                        Some(t) => t,
                    };
                    if let Some(route) = self.st.lookup(table, IpAddr::V4(dst)) {
                        return Some((r.text.replace('\t', " "), route.clone()));
                    }
                    // Table local is not in the dump (`ip route list`): a destination known to
                    // be local otherwise (ip addr, an IPVS virtual server) has its local route.
                    if table == "local" && !self.st.has_table_local() && self.is_local(dst) {
                        let route = crate::iproute::Route {
                            table: "local".into(),
                            kind: "local".into(),
                            dst: ipnet::IpNet::from(IpAddr::V4(dst)),
                            gateway: None,
                            dev: None,
                            prefsrc: None,
                            scope: Some("host".into()),
                            metric: 0,
                            onlink: false,
                            proto: None,
                            text: format!("local {dst} table local (not in the dump: {dst} is a local address)"),
                        };
                        return Some((r.text.replace('\t', " "), route));
                    }
                    // A table the dump does not show at all (`ip route list` is main only):
                    // empty, or holding routes nobody can see.
                    let absent = !matches!(table, "main" | "local" | "default")
                        && !self.st.routes.iter().flatten().any(|x| x.table == table);
                    if absent && self.fact(Fact::Table(table.to_string())) == 1 {
                        let text = format!(
                            "table {table} is not in the dump: if it holds a route for {dst}, that route decides"
                        );
                        let route = crate::iproute::Route {
                            table: table.to_string(),
                            kind: "unknown".into(),
                            dst: ipnet::IpNet::from(IpAddr::V4(dst)),
                            gateway: None,
                            dev: None,
                            prefsrc: None,
                            scope: None,
                            metric: 0,
                            onlink: false,
                            proto: None,
                            text,
                        };
                        return Some((r.text.replace('\t', " "), route));
                    }
                }
                "blackhole" | "unreachable" | "prohibit" => {
                    let route = crate::iproute::Route {
                        table: "rule".into(),
                        kind: r.action.clone(),
                        dst: ipnet::IpNet::from(IpAddr::V4(dst)),
                        gateway: None,
                        dev: None,
                        prefsrc: None,
                        scope: None,
                        metric: 0,
                        onlink: false,
                        proto: None,
                        text: r.text.replace('\t', " "),
                    };
                    return Some((r.text.replace('\t', " "), route));
                }
                _ => {}
            }
        }
        None
    }
}
