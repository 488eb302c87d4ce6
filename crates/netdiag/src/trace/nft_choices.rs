//! nft's random choices as "one of": `dnat to <key with numgen> map @m` (every value of the
//! numgen looked up) and the cascade of rules matching `numgen random mod N == k` (weir's
//! affinity chains); every option is walked (`Walker::choose`).

use std::net::IpAddr;

use serde_json::Value;

use crate::nft::{self, Ruleset};

use super::nft_walk::{is_numgen_match, NVal};
use super::packet::Pkt;
use super::walker::Walker;

impl Walker<'_> {
    /// The address and port a `dnat to KEY map @m` gives: the key as the packet has it, with a
    /// `numgen` in it taken as each of its values: a choice, this walk's option returned.
    pub(super) fn dnat_map(
        &mut self,
        rs: &Ruleset,
        family: &str,
        table: &str,
        m: &Value,
        p: &Pkt,
    ) -> Option<(IpAddr, u16)> {
        let key = self.nft_eval(&m["key"], p)?;
        let data = &m["data"];
        let numgen = m["key"]["concat"].as_array().and_then(|parts| {
            parts.iter().enumerate().find_map(|(i, e)| {
                let n = e.get("numgen")?;
                Some((i, n["mod"].as_u64()?, n["offset"].as_u64().unwrap_or(0)))
            })
        });
        let target = |v: &Value| -> Option<(IpAddr, u16)> {
            let parts = v.get("concat")?.as_array()?;
            Some((
                parts.first()?.as_str()?.parse().ok()?,
                parts.get(1)?.as_u64()? as u16,
            ))
        };
        let mut followed = target(&self.nft_lookup(rs, family, table, data, &key)?)?;
        if let (Some((i, n, offset)), NVal::Concat(vals)) = (numgen, &key) {
            let mut options = Vec::new();
            let mut targets = Vec::new();
            for k in 0..n {
                let mut vals = vals.clone();
                vals[i] = NVal::Num(offset + k);
                if let Some((ip, port)) = self
                    .nft_lookup(rs, family, table, data, &NVal::Concat(vals))
                    .as_ref()
                    .and_then(target)
                {
                    options.push(format!(
                        "{k} (DNAT {})",
                        super::nat::endpoint(ip, Some(port))
                    ));
                    targets.push((ip, port));
                }
            }
            self.choices.push(format!(
                "one of {} (numgen random mod {n} map {}): each walked",
                options.join(", "),
                nft::render_value(data)
            ));
            if !targets.is_empty() {
                let c = self.choose(
                    targets
                        .iter()
                        .map(|(ip, port)| super::nat::endpoint(*ip, Some(*port)))
                        .collect(),
                );
                followed = targets[c];
            }
        }
        Some(followed)
    }

    /// `numgen random mod N == k` rules followed by their fallback: each one's DNAT listed.
    /// Returns each option's endpoint (its DNAT target, else the rule), one per rule from the
    /// first of `rest`.
    pub(super) fn one_of_nft(&mut self, rest: &[nft::Rule]) -> Vec<String> {
        let mut options = Vec::new();
        let mut labels = Vec::new();
        for r in rest {
            let to = r.expr.iter().find_map(|e| {
                let d = e.get("dnat")?;
                let addr = d.get("addr")?.as_str()?;
                let port = d.get("port").and_then(Value::as_u64).unwrap_or(0);
                Some(match addr.parse() {
                    Ok(ip) => super::nat::endpoint(ip, Some(port as u16)),
                    Err(_) => format!("{addr}:{port}"),
                })
            });
            labels.push(to.clone().unwrap_or_else(|| format!("`{}`", r.text)));
            options.push(format!(
                "`{}` (DNAT {})",
                r.text,
                to.unwrap_or_else(|| "?".into())
            ));
            let has_numgen = r
                .expr
                .iter()
                .any(|e| e.get("match").is_some_and(is_numgen_match));
            if !has_numgen {
                break;
            }
        }
        self.choices.push(format!(
            "one of {} (numgen random): each walked",
            options.join(", ")
        ));
        labels
    }
}
