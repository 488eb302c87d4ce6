//! The routing decision: policy rules in priority order, then the table they lead to.

use std::net::IpAddr;

use crate::iproute::PolicyRule;

use super::packet::Fact;
use super::walker::{Dropped, Walker};

/// The output that settles a lookup the dump's routes cannot answer.
pub(super) fn routes_settle(v6: bool) -> &'static str {
    if v6 {
        "`ip -6 route show table all` (ip6-route.json; `weir trace collect` saves it)"
    } else {
        "`ip route show table all` (ip-route.txt; `weir trace collect` saves it)"
    }
}

/// The output interface of a packet forwarded when no routes were pasted.
pub(super) const UNKNOWN_OIF: &str = "?";

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
        src: IpAddr,
        dst: IpAddr,
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
                if self.routes_missing_for(dst.is_ipv6()).is_some() {
                    if let Some(done) = self.route_from_route_get(stage, src, dst, mark, iif) {
                        return done;
                    }
                }
                if let Some(why) = self.routes_missing_for(dst.is_ipv6()) {
                    // Nothing in the dump says there is no route: the routes were not pasted.
                    // Where the rest of the paste decides either way, walk both ways.
                    if let Some(result) = self.route_either_way(stage, src, dst, &why) {
                        return Ok(result);
                    }
                    self.unknown_outcome = true;
                    self.hop(
                        stage,
                        "rules",
                        None,
                        format!("from {src} to {dst}: {why}: where it goes is unknown"),
                    );
                    return Err((
                        format!(
                            "{stage}: cannot tell where {dst} goes: {why}; settle it with {}",
                            routes_settle(dst.is_ipv6())
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

    /// Without routes, a packet is either for this node or forwarded out some interface: the
    /// walk takes one of the two ([`Fact::Route`]) and goes on, so rules that decide either
    /// way (a FORWARD policy DROP, an INPUT drop) still settle the verdict. A destination that
    /// is one of the node's addresses is local; with the whole `ip addr`, any other is
    /// forwarded. `None` for every other lookup (the reply's, the node's own output routing).
    fn route_either_way(
        &mut self,
        stage: &str,
        src: IpAddr,
        dst: IpAddr,
        why: &str,
    ) -> Option<RouteResult> {
        if self.st.is_local_address(dst) {
            self.hop(
                stage,
                "addresses",
                None,
                format!("{dst} is local (one of the node's addresses; {why})"),
            );
            return Some(RouteResult {
                local: true,
                oif: "lo".into(),
            });
        }
        // Only the request's input routing: the reply's way back is what asymmetric routing
        // gets wrong, and the node's own packets take their source from the route; neither
        // is taken for granted.
        if src.is_unspecified() || stage != "routing" {
            return None;
        }
        let forwarded = self.fact(Fact::Route(dst.to_string())) == 1;
        if !forwarded {
            self.local_by_guess = true;
            self.hop(
                stage,
                "rules",
                None,
                format!("{dst} taken to be local ({why})"),
            );
            return Some(RouteResult {
                local: true,
                oif: "lo".into(),
            });
        }
        self.assume(format!(
            "no routes pasted: {dst} leaves by an interface the paste does not name; rules matching an output interface were taken as not matching"
        ));
        self.hop(
            stage,
            "rules",
            None,
            format!(
                "{dst} taken to be forwarded, out an interface the paste does not name ({why})"
            ),
        );
        Some(RouteResult {
            local: false,
            oif: UNKNOWN_OIF.into(),
        })
    }

    /// A pasted `ip route get` that made this very lookup (same destination and mark; for a
    /// packet arriving on an interface, an input lookup `from SRC iif IIF`; for one the node
    /// sends, an output lookup without `iif`), for a dump without the routes themselves.
    pub(super) fn route_get_for(
        &self,
        src: IpAddr,
        dst: IpAddr,
        mark: u32,
        iif: &str,
    ) -> Option<&'_ crate::route_get::RouteGet> {
        let output = iif == "lo";
        self.st.route_gets.iter().flatten().find(|g| {
            g.dst == dst
                && g.mark.unwrap_or(0) == mark
                && if output {
                    g.iif.is_none()
                        && (g.from.is_none() || src.is_unspecified() || g.from == Some(src))
                } else {
                    g.iif.as_deref() == Some(iif) && g.from == Some(src)
                }
        })
    }

    /// The route a pasted `ip route get` gave for this lookup: its answer, or the kernel's
    /// refusal (`Invalid cross-device link` on an input lookup is the reverse-path check).
    fn route_from_route_get(
        &mut self,
        stage: &str,
        src: IpAddr,
        dst: IpAddr,
        mark: u32,
        iif: &str,
    ) -> Option<Result<RouteResult, Dropped>> {
        let g = self.route_get_for(src, dst, mark, iif)?.clone();
        let asked = g
            .command
            .clone()
            .unwrap_or_else(|| format!("ip route get {dst}"));
        match &g.answer {
            Ok(a) => {
                let local = a.kind == "local";
                match a.kind.as_str() {
                    "local" | "unicast" => {}
                    kind => {
                        self.hop(
                            stage,
                            "ip route get",
                            Some(a.text.clone()),
                            format!("{dst}: {kind}"),
                        );
                        return Some(Err((
                            format!(
                                "{stage}: route to {dst} is {kind} (`{asked}` answered `{}`)",
                                a.text
                            ),
                            vec![],
                        )));
                    }
                }
                self.assume(format!(
                    "no routes in the dump: the route to {dst} is the pasted `{asked}`'s answer"
                ));
                self.hop(
                    stage,
                    "ip route get",
                    Some(a.text.clone()),
                    if local {
                        format!("{dst} is local")
                    } else {
                        format!(
                            "from {src} to {dst} (mark {mark:#x}): out {}",
                            a.dev.clone().unwrap_or_default()
                        )
                    },
                );
                self.via_router = a.via.is_some();
                Some(Ok(RouteResult {
                    local,
                    oif: a.dev.clone().unwrap_or_default(),
                }))
            }
            Err(e) if g.iif.is_some() && e.contains("Invalid cross-device link") => {
                self.hop(
                    stage,
                    "rp_filter",
                    Some(format!("{asked}: {e}")),
                    format!("the kernel refuses {src} → {dst} arriving on {iif}: reverse path (martian source)"),
                );
                Some(Err((
                    format!(
                        "{stage}: reverse-path filter (rp_filter) on {iif} drops {src} → {dst}: the kernel's own `{asked}` answered `{e}` (fib_validate_source: the route back to {src} does not leave by {iif})"
                    ),
                    vec![format!(
                        "route the reply back through {iif} (a policy rule for the connection's mark, with src_valid_mark), or loose reverse-path filtering: sysctl -w net.ipv4.conf.{iif}.rp_filter=2"
                    )],
                )))
            }
            // Recent kernels answer a martian source (the reverse-path check among the
            // causes) with EINVAL: a drop, its cause less certain.
            Err(e) if g.iif.is_some() && e.contains("Invalid argument") => {
                self.hop(
                    stage,
                    "rp_filter",
                    Some(format!("{asked}: {e}")),
                    format!("the kernel refuses {src} → {dst} arriving on {iif}: a martian"),
                );
                Some(Err((
                    format!(
                        "{stage}: the kernel refuses {src} → {dst} arriving on {iif}: its own `{asked}` answered `{e}` (a martian source or destination; on recent kernels also the reverse-path filter's (rp_filter) answer)"
                    ),
                    vec![],
                )))
            }
            Err(e) if e.contains("Network is unreachable") || e.contains("No route to host") => {
                self.hop(
                    stage,
                    "ip route get",
                    Some(format!("{asked}: {e}")),
                    format!("no route to {dst}"),
                );
                Some(Err((
                    format!("{stage}: no route to {dst} (`{asked}` answered `{e}`)"),
                    vec![],
                )))
            }
            // Another refusal: the lookup failed, for a reason not modelled here.
            Err(_) => None,
        }
    }

    /// Why a lookup that found no route cannot conclude there is none: the dump holds no
    /// routes (no `ip route` output), or none of table main (only `ip route show table local`
    /// was pasted; every node with an address has routes in main). None when the dump holds
    /// table main, so that a missing route is a real "no route".
    /// IPv6's routes are `ip -6 route`'s.
    pub(super) fn routes_missing_for(&self, v6: bool) -> Option<String> {
        let cmd = if v6 { "ip -6 route" } else { "ip route" };
        match self.st.routes_of(v6) {
            None => Some(format!("the dump has no `{cmd}` output")),
            Some(rs) if !rs.iter().any(|r| r.table == "main" || r.table == "254") => Some(format!(
                "the dump's `{cmd}` routes hold no table main (only other tables were pasted)"
            )),
            Some(_) => None,
        }
    }

    /// The policy rules (or the default ones) and the route they lead to.
    pub(super) fn lookup(
        &mut self,
        src: IpAddr,
        dst: IpAddr,
        mark: u32,
        iif: Option<&str>,
    ) -> Option<(String, crate::iproute::Route)> {
        // IPv6 has rules of its own (`ip -6 rule`), with the same defaults.
        let rules: Vec<PolicyRule> = match self.st.rules_of(dst.is_ipv6()) {
            Some(r) => r.clone(),
            None => crate::iproute::parse_rules("0: from all lookup local\n32766: from all lookup main\n32767: from all lookup default\n").value,
        };
        for r in &rules {
            let mut hit = r.src.is_none_or(|n| n.contains(&src))
                && r.dst.is_none_or(|n| n.contains(&dst))
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
                    if let Some(route) = self.st.lookup(table, dst) {
                        return Some((r.text.replace('\t', " "), route.clone()));
                    }
                    // Table local is not in the dump (`ip route list`): a destination known to
                    // be local otherwise (ip addr, an IPVS virtual server) has its local route.
                    if table == "local" && !self.st.has_table_local() && self.is_local(dst) {
                        let route = crate::iproute::Route {
                            table: "local".into(),
                            kind: "local".into(),
                            dst: ipnet::IpNet::from(dst),
                            gateway: None,
                            dev: None,
                            // The kernel's own local route for an address has it as its src.
                            prefsrc: Some(dst),
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
                        && !self
                            .st
                            .routes_of(dst.is_ipv6())
                            .iter()
                            .flatten()
                            .any(|x| x.table == table);
                    if absent && self.fact(Fact::Table(table.to_string())) == 1 {
                        let text = format!(
                            "table {table} is not in the dump: if it holds a route for {dst}, that route decides"
                        );
                        let route = crate::iproute::Route {
                            table: table.to_string(),
                            kind: "unknown".into(),
                            dst: ipnet::IpNet::from(dst),
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
                        dst: ipnet::IpNet::from(dst),
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
