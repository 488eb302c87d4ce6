//! Reverse-path checks written as rules, the only kind IPv6 has (the `rp_filter` sysctls are
//! IPv4's): iptables/ip6tables `-m rpfilter` (`ipt_rpfilter`, `ip6t_rpfilter`) and nft's
//! `fib saddr . iif oif missing` (`nft_fib4`, `nft_fib6`). Both look up the route back to the
//! packet's source, from its destination, as [`super::reply`]'s `rp_check` does for the sysctl.

use serde_json::Value;

use crate::iproute::Route;
use crate::iptables::Rule as IptRule;

use super::nft_walk::NVal;
use super::packet::Pkt;
use super::walker::Walker;

impl Walker<'_> {
    /// The route back to `p`'s source (from its destination, `iif lo`, with `mark`): `Ok(None)`
    /// when there is none, `Err` with why when the dump cannot tell.
    fn route_back(&mut self, p: &Pkt, mark: u32) -> Result<Option<Route>, String> {
        match self.lookup(p.dst, p.src, mark, Some("lo")) {
            Some((rule, r)) if r.kind == "unknown" => Err(format!(
                "the route back to {} is in a table the dump lacks (`{rule}`)",
                p.src
            )),
            Some((_, r)) => Ok(Some(r)),
            None => match self.routes_missing_for(p.v6()) {
                Some(why) => Err(why),
                None => Ok(None),
            },
        }
    }

    /// `-m rpfilter [--loose] [--validmark] [--accept-local] [--invert]`: whether the rule's
    /// rpfilter match holds (after `--invert`); `None` when the dump cannot tell.
    pub(super) fn ipt_rpfilter(&mut self, r: &IptRule, p: &Pkt) -> Option<bool> {
        let has = |name: &str| r.module_arg("rpfilter", name).is_some();
        let invert = has("--invert");
        let loose = has("--loose");
        let accept_local = has("--accept-local");
        let mark = if has("--validmark") { p.mark } else { 0 };
        // The node's own packets, and IPv6's unspecified source (duplicate address
        // detection), pass without a lookup.
        let passes = if p.iif == "lo" || p.src.is_unspecified() {
            true
        } else {
            let back = match self.route_back(p, mark) {
                Ok(b) => b,
                Err(why) => {
                    self.assume(format!(
                        "-m rpfilter: cannot tell the route back to {}: {why}; the rule counts as not matching (`{}`)",
                        p.src, r.text
                    ));
                    return None;
                }
            };
            let (passes, how) = judge(back.as_ref(), &p.iif, loose, accept_local);
            self.hop(
                "reverse path",
                "rpfilter",
                back.as_ref().map(|b| b.text.clone()),
                format!("-m rpfilter: route back to {} {how}", p.src),
            );
            passes
        };
        Some(passes != invert)
    }

    /// nft `fib saddr [. iif] [. mark] oif`: the interface of the route back to the source
    /// (with `iif`: only when it is the input interface), empty when missing. `None` for a
    /// fib lookup not of this kind, or when the dump cannot tell.
    pub(super) fn fib_oif(&mut self, f: &Value, p: &Pkt) -> Option<NVal> {
        let flags: Vec<&str> = f["flags"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .or_else(|| f["flags"].as_str().map(|s| vec![s]))?;
        if !flags.contains(&"saddr") || flags.contains(&"daddr") {
            self.assume("nft `fib daddr … oif` not modelled: rules using it count as not matching");
            return None;
        }
        let mark = if flags.contains(&"mark") { p.mark } else { 0 };
        let strict = flags.contains(&"iif");
        let back = match self.route_back(p, mark) {
            Ok(b) => b,
            Err(why) => {
                self.assume(format!(
                    "nft fib saddr: cannot tell the route back to {}: {why}; the rule counts as not matching",
                    p.src
                ));
                return None;
            }
        };
        let usable = back.as_ref().filter(|b| {
            !matches!(
                b.kind.as_str(),
                "local" | "blackhole" | "unreachable" | "prohibit"
            )
        });
        let oif = match usable {
            Some(b) if !strict || b.dev.as_deref() == Some(p.iif.as_str()) => {
                b.dev.clone().unwrap_or_default()
            }
            _ => String::new(),
        };
        let (_, how) = judge(back.as_ref(), &p.iif, !strict, false);
        self.hop(
            "reverse path",
            "fib",
            back.as_ref().map(|b| b.text.clone()),
            format!(
                "fib saddr{} oif is {}: the route back to {} {how}",
                if strict { " . iif" } else { "" },
                if oif.is_empty() { "missing" } else { &oif },
                p.src,
            ),
        );
        Some(NVal::Str(oif))
    }
}

/// Whether a route back passes a reverse-path check on `iif`, and how, in words.
fn judge(back: Option<&Route>, iif: &str, loose: bool, accept_local: bool) -> (bool, String) {
    let Some(b) = back else {
        return (false, "does not exist".into());
    };
    let dev = b.dev.clone().unwrap_or_default();
    match b.kind.as_str() {
        "local" => (
            accept_local,
            format!(
                "is local ({})",
                if accept_local { "accepted" } else { "fails" }
            ),
        ),
        "blackhole" | "unreachable" | "prohibit" => (false, format!("is {}", b.kind)),
        _ if dev == iif => (
            true,
            format!("leaves by {dev}, the input interface: passes"),
        ),
        _ if loose => (true, format!("leaves by {dev} (loose: passes)")),
        _ => (false, format!("leaves by {dev}, not {iif}: fails")),
    }
}
