//! `ip route get` answers, with the command each answers (the prompt line above it), as people
//! paste them to show where the kernel sends one packet:
//!
//! ```text
//! $ ip route get 172.30.182.212 from 172.21.51.75 iif ens3
//! RTNETLINK answers: Invalid cross-device link
//! $ ip route get 10.108.116.161
//! 10.108.116.161 via 10.16.31.254 dev em3 src 10.16.30.4
//!     cache
//! ```
//!
//! Each is one lookup the kernel made: with `iif`, an input lookup (the reverse-path check
//! included: `Invalid cross-device link` is `fib_validate_source`'s EXDEV, a martian source);
//! without, an output lookup. The walk uses an answer as evidence for the same lookup when the
//! dump has no routes.

use std::net::IpAddr;

use serde::Serialize;

use crate::{paste, Parsed, Skipped};

/// One `ip route get` and its answer.
#[derive(Debug, Clone, Serialize)]
pub struct RouteGet {
    /// 1-based line of the answer.
    pub line: usize,
    /// The command as pasted, when its prompt line is there.
    pub command: Option<String>,
    pub dst: IpAddr,
    pub from: Option<IpAddr>,
    /// `iif DEV`: an input lookup, as for a packet arriving on DEV.
    pub iif: Option<String>,
    pub mark: Option<u32>,
    /// The route, or the kernel's error (`Invalid cross-device link`).
    pub answer: Result<Answer, String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Answer {
    /// `unicast`, `local`, `broadcast`, `unreachable`, …
    pub kind: String,
    pub dev: Option<String>,
    pub via: Option<IpAddr>,
    pub src: Option<IpAddr>,
    pub text: String,
}

/// The lookup's keys from the words after `get` (the command's or the answer's).
#[derive(Default)]
struct Keys {
    dst: Option<IpAddr>,
    from: Option<IpAddr>,
    iif: Option<String>,
    mark: Option<u32>,
    kind: Option<String>,
    dev: Option<String>,
    via: Option<IpAddr>,
    src: Option<IpAddr>,
}

fn keys(words: &[&str]) -> Keys {
    let mut k = Keys::default();
    let mut i = 0;
    while i < words.len() {
        let (w, v) = (words[i], words.get(i + 1).copied());
        let mut two = true;
        match (w, v) {
            ("from", Some(v)) => k.from = v.parse().ok(),
            ("iif", Some(v)) => k.iif = Some(v.to_string()),
            ("mark", Some(v)) => {
                k.mark = v
                    .strip_prefix("0x")
                    .map_or_else(|| v.parse().ok(), |h| u32::from_str_radix(h, 16).ok())
            }
            ("dev" | "oif", Some(v)) => k.dev = Some(v.to_string()),
            ("via", Some(v)) => k.via = v.parse().ok(),
            ("src", Some(v)) => k.src = v.parse().ok(),
            ("to", Some(v)) => k.dst = v.parse().ok(),
            ("table" | "uid" | "tos" | "ipproto" | "sport" | "dport" | "realms", Some(_)) => {}
            (
                "local" | "broadcast" | "unreachable" | "prohibit" | "blackhole" | "multicast"
                | "anycast" | "throw",
                _,
            ) if k.dst.is_none() => {
                k.kind = Some(w.to_string());
                two = false;
            }
            _ => {
                two = false;
                if k.dst.is_none() {
                    k.dst = w.parse().ok();
                }
            }
        }
        i += if two { 2 } else { 1 };
    }
    k
}

/// The words after `ip route get` (`ip r g`, `ip ro get`, …) in a command line.
fn query_words(command: &str) -> Option<Vec<&str>> {
    let words: Vec<&str> = command.split_whitespace().collect();
    let ip = words.iter().position(|w| *w == "ip")?;
    let rest = &words[ip + 1..];
    let mut i = 0;
    while rest.get(i).is_some_and(|w| w.starts_with('-')) {
        i += 1;
    }
    let obj = rest.get(i)?;
    let verb = rest.get(i + 1)?;
    ("route".starts_with(obj)
        && obj.starts_with('r')
        && "get".starts_with(verb)
        && verb.starts_with('g'))
    .then(|| rest[i + 2..].to_vec())
}

/// Reads pasted `ip route get` answers. An answer without its command above it is read from
/// itself (its `from`/`iif`); an error without a command cannot say which lookup failed, and
/// is skipped.
pub fn parse(text: &str) -> Parsed<Vec<RouteGet>> {
    let pasted = paste::lines(text);
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    let mut answered: Vec<usize> = Vec::new();
    for l in pasted.data() {
        let line = l.text.trim();
        if line.is_empty() || line == "cache" || line.starts_with("cache ") {
            continue;
        }
        let command = pasted.command_above(l.no).map(str::to_string);
        let cmd_no = pasted
            .command_lines
            .iter()
            .rev()
            .find(|(n, _)| *n < l.no)
            .map(|(n, _)| *n);
        let q = command.as_deref().and_then(query_words).map(|w| keys(&w));
        if let Some(msg) = line.strip_prefix("RTNETLINK answers:") {
            let Some(q) = q.as_ref().filter(|q| q.dst.is_some()) else {
                skipped.push(Skipped::new(
                    l.no,
                    l.text,
                    "an error without the `ip route get` command above it: which lookup failed is unknown",
                ));
                continue;
            };
            out.push(RouteGet {
                line: l.no,
                command,
                dst: q.dst.expect("checked"),
                from: q.from,
                iif: q.iif.clone(),
                mark: q.mark,
                answer: Err(msg.trim().to_string()),
            });
            continue;
        }
        // Only the first answer line after a command is its answer (the rest is `cache`, or
        // another command's output with its prompt cut away).
        if let Some(n) = cmd_no {
            if answered.contains(&n) {
                skipped.push(Skipped::new(
                    l.no,
                    l.text,
                    l.reason("a second answer to one `ip route get`"),
                ));
                continue;
            }
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let a = keys(&words);
        let Some(dst) = a.dst else {
            skipped.push(Skipped::new(
                l.no,
                l.text,
                l.reason("not an `ip route get` answer"),
            ));
            continue;
        };
        if let Some(n) = cmd_no {
            answered.push(n);
        }
        let q = q.unwrap_or_default();
        out.push(RouteGet {
            line: l.no,
            command,
            dst,
            from: a.from.or(q.from),
            iif: a.iif.clone().or(q.iif.clone()),
            mark: a.mark.or(q.mark),
            answer: Ok(Answer {
                kind: a.kind.unwrap_or_else(|| "unicast".into()),
                dev: a.dev,
                via: a.via,
                src: a.src,
                text: line.to_string(),
            }),
        });
    }
    Parsed {
        value: out,
        skipped,
    }
}
