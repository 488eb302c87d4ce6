//! nft's destination NAT statements: `dnat to` a literal or through a map (weir's
//! `dnat to ip daddr . meta l4proto . th dport . numgen random mod N map @ep4tcp`), `redirect`,
//! and the endpoints a random choice may pick.

use std::net::IpAddr;

use serde_json::Value;

use crate::nft::Ruleset;

use super::nat::endpoint;
use super::nft_walk::nval_matches;
use super::packet::Pkt;
use super::walker::Walker;

impl Walker<'_> {
    /// Applies a `dnat` or `redirect` statement to `p`; false when it does not apply (a map
    /// lookup that finds nothing ends the rule in the kernel too, NFT_BREAK).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn nft_dnat(
        &mut self,
        rs: &Ruleset,
        family: &str,
        table: &str,
        kind: &str,
        v: &Value,
        p: &mut Pkt,
        text: &str,
    ) -> bool {
        let port = v.get("port").and_then(Value::as_u64).map(|x| x as u16);
        let target = if kind == "redirect" {
            // To the primary address of the interface it came in on (127.0.0.1 for the node's
            // own packets), nf_nat_redirect_ipv4.
            let addr = self.redirect_target(p);
            match addr {
                Some(a) => Some((a, port)),
                None => {
                    self.assume(format!(
                        "redirect on {}, which has no {} address known: the kernel drops it (`{text}`)",
                        p.iif,
                        if p.v6() { "IPv6" } else { "IPv4" }
                    ));
                    None
                }
            }
        } else {
            // `dnat ip to …` / `dnat ip6 to …` (an inet table's) applies to its family only.
            let fam = v.get("family").and_then(Value::as_str);
            if fam.is_some_and(|f| (f == "ip6") != p.v6()) {
                return false;
            }
            match &v["addr"] {
                Value::String(s) => s
                    .parse::<IpAddr>()
                    .ok()
                    .filter(|a| a.is_ipv6() == p.v6())
                    .map(|a| (a, port)),
                Value::Object(o) if o.contains_key("map") => {
                    // Every candidate for the endpoint set; the followed one and the listed
                    // choice come from `dnat_map`.
                    let all = self.nft_map_targets(rs, family, table, &o["map"], p);
                    self.note_endpoints(
                        all.iter()
                            .map(|(a, pt)| endpoint(*a, pt.or(port)))
                            .collect(),
                    );
                    self.dnat_map(rs, family, table, &o["map"], p)
                        .map(|(a, pt)| (a, Some(pt)))
                }
                _ => None,
            }
        };
        let Some((addr, port)) = target else {
            if kind != "redirect" {
                self.assume(format!(
                    "nft dnat target not modelled or not found: `{text}`"
                ));
            }
            return false;
        };
        p.dst = addr;
        if let Some(port) = port {
            p.dport = port;
        }
        p.dnat = true;
        p.nat_bound = true;
        self.note_endpoints(vec![endpoint(p.dst, Some(p.dport))]);
        true
    }

    /// Every `(address, port)` of a dnat map whose key matches the packet (a `numgen` part of
    /// the key matches any value).
    fn nft_map_targets(
        &mut self,
        rs: &Ruleset,
        family: &str,
        table: &str,
        map: &Value,
        p: &Pkt,
    ) -> Vec<(IpAddr, Option<u16>)> {
        let Some(key) = self.nft_eval(&map["key"], p) else {
            return Vec::new();
        };
        let elems: Vec<Value> = match &map["data"] {
            Value::String(s) if s.starts_with('@') => rs
                .set(family, table, &s[1..])
                .map(|m| m.elements.clone())
                .unwrap_or_default(),
            d => d["set"].as_array().cloned().unwrap_or_default(),
        };
        let mut out = Vec::new();
        for e in elems {
            let Some([k, d]) = e
                .as_array()
                .and_then(|a| <&[Value; 2]>::try_from(&a[..]).ok())
            else {
                continue;
            };
            if !nval_matches(&key, k) {
                continue;
            }
            let target = match d.get("concat").and_then(Value::as_array) {
                Some(parts) => parts
                    .first()
                    .and_then(Value::as_str)
                    .and_then(|a| a.parse().ok())
                    .map(|a| (a, parts.get(1).and_then(Value::as_u64).map(|x| x as u16))),
                None => d.as_str().and_then(|a| a.parse().ok()).map(|a| (a, None)),
            };
            if let Some(t) = target {
                if !out.contains(&t) {
                    out.push(t);
                }
            }
        }
        out
    }

    /// The DNAT target of each chain a `numgen … vmap` may go to (kube-proxy's nftables
    /// layout: `endpoint-…` chains holding one `dnat to ip:port`).
    pub(super) fn nft_vmap_endpoints(
        &self,
        rs: &Ruleset,
        family: &str,
        table: &str,
        data: &Value,
    ) -> Vec<String> {
        data["set"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| self.vmap_chain_dnat(rs, family, table, e))
            .collect()
    }

    /// The endpoint one element of a `numgen … vmap` leads to: its chain's DNAT target, else
    /// the verdict as written.
    pub(super) fn nft_vmap_label(
        &self,
        rs: &Ruleset,
        family: &str,
        table: &str,
        elem: &Value,
    ) -> String {
        self.vmap_chain_dnat(rs, family, table, elem)
            .unwrap_or_else(|| {
                elem.as_array()
                    .and_then(|a| a.get(1))
                    .map(crate::nft::render_value)
                    .unwrap_or_default()
            })
    }

    fn vmap_chain_dnat(
        &self,
        rs: &Ruleset,
        family: &str,
        table: &str,
        elem: &Value,
    ) -> Option<String> {
        let verdict = elem.as_array()?.get(1)?;
        let chain = ["goto", "jump"]
            .iter()
            .find_map(|k| verdict.get(k)?["target"].as_str())?;
        rs.rules
            .iter()
            .filter(|r| r.family == family && r.table == table && r.chain == chain)
            .flat_map(|r| r.expr.iter())
            .find_map(|x| {
                let d = x.get("dnat")?;
                let a: IpAddr = d["addr"].as_str()?.parse().ok()?;
                Some(endpoint(a, d["port"].as_u64().map(|x| x as u16)))
            })
    }
}
