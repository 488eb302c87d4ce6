//! Every reader never panics, whatever is pasted (issue 30's rule): a seeded loop feeds every
//! parser of the crate the real fixtures of `tests/data` mutated (lines dropped, doubled,
//! swapped, cut mid-way; characters that open or close the formats' structures put anywhere;
//! numbers made huge; pieces of one output spliced into another) and random bytes; every
//! tenth case also goes through intake, the node state, doctor's checks and a walk. Bounded by
//! case count (`WEIR_FUZZ_CASES`, default 1,500: a few seconds in a debug build); a failure
//! names its seed and case, and the case's text is written next to the test binary's target
//! directory for replay.

mod common;

use std::path::{Path, PathBuf};

use common::scratch::Rng;
use weir_netdiag::state::NodeState;
use weir_netdiag::trace::{self, Packet, Proto};
use weir_netdiag::{
    conntrack, doctor, hairpin, intake, iproute, ipset, iptables, iptables_listing, ipvs,
    kernel_log, nft, nft_text, objects, paste, route_get, sysctl,
};

/// What the formats are made of, and what breaks them.
const NASTY: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    "\"",
    ":",
    "/",
    "-",
    ".",
    ",",
    ";",
    "!",
    "#",
    "@",
    "$ ",
    "\r",
    "\n",
    "\t",
    " ",
    "\\",
    "0x",
    "=",
    "|",
    "*",
    "é",
    "😀",
    "\u{0}",
    "--\n",
    "COMMIT\n",
    "*nat\n",
    "}\n}\n",
    "table ip t {\n",
    "chain c {\n",
    "elements = { ",
    " : ",
    " . ",
    " vmap { ",
    " map @",
    "counter packets ",
    "[1:2] ",
    "-A ",
    "-j ",
    "Chain X (policy DROP 1 packets, 2 bytes)\n",
    "ct state ",
    " dnat to ",
    "[",
    "->",
    "src=",
    "dport=",
    "inet ",
    "lookup ",
    "via ",
    "dev ",
];

const HUGE: &[&str] = &[
    "99999999999999999999999",
    "18446744073709551616",
    "4294967296",
    "65536",
    "-1",
    "0",
    "256.256.256.256",
    "ffff:ffff::ffff:ffff:ffff:ffff:ffff:ffff:ffff",
    "1.2.3.4/99",
    "0x",
    "0xffffffffffffffffff",
];

/// Every reader of the crate over one text; none may panic. Whether the rulesets' readers read
/// something, and skipped something (the mutations must reach past the first line).
fn read_everything(text: &str) -> (bool, bool) {
    let _ = paste::lines(text).notes();
    let ipt = iptables::parse(text);
    let _ = iptables_listing::parse(text);
    let _ = nft::parse(text);
    let nt = nft_text::parse(text);
    let _ = iproute::parse_rules(text);
    let routes = iproute::parse_routes(text);
    let _ = iproute::parse_routes6(text);
    let _ = iproute::parse_links(text);
    let _ = iproute::parse_addrs(text);
    let _ = iproute::parse_neighbours(text);
    let _ = ipvs::parse(text);
    let _ = ipvs::parse_connections(text);
    let _ = ipset::parse(text);
    let _ = conntrack::parse(text);
    let _ = sysctl::parse(text);
    let _ = kernel_log::parse(text);
    let _ = kernel_log::conntrack_full(text);
    let _ = hairpin::parse(text);
    let _ = route_get::parse(text);
    let _ = objects::looks_like_objects(text);
    let mut objs = objects::Objects::default();
    objs.add_text("fuzz", text);
    for s in intake::split::split(text) {
        let _ = intake::classify::classify(s.text, s.command.as_deref(), "fuzz");
    }
    let read = !ipt.value.is_empty() || !nt.value.rules.is_empty() || !routes.value.is_empty();
    let skipped = !ipt.skipped.is_empty() || !nt.skipped.is_empty() || !routes.skipped.is_empty();
    (read, skipped)
}

/// The whole path a paste takes: intake, the node state, every check, a walk both ways.
fn diagnose(name: &str, text: &str) {
    let st = NodeState::from_sources([(name.to_string(), text.to_string())]);
    let _ = intake::render(&st.sections);
    let _ = doctor::run_all(&st, None);
    for (src, dst, iif) in [
        ("10.0.0.5", "10.96.0.10", "eth0"),
        ("fd00::5", "fd00:96::10", "eth0"),
    ] {
        let t = trace::trace(
            &st,
            &Packet {
                src: src.parse().unwrap(),
                dst: dst.parse().unwrap(),
                proto: Proto::Tcp,
                sport: 40000,
                dport: 80,
                iif: iif.into(),
            },
        );
        let _ = trace::render(&t);
    }
}

fn fixtures() -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else {
                out.push(p);
            }
        }
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let mut files = Vec::new();
    walk(&root, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = String::from_utf8_lossy(&std::fs::read(&p).unwrap()).into_owned();
            (p.file_name().unwrap().to_string_lossy().into_owned(), text)
        })
        .collect()
}

/// One mutation of `text` (`other`: another fixture to splice from).
fn mutate(r: &mut Rng, text: &str, other: &str) -> String {
    let mut lines: Vec<String> = text.split_inclusive('\n').map(str::to_string).collect();
    match r.below(9) {
        0 if !lines.is_empty() => {
            lines.remove(r.below(lines.len()));
        }
        1 if !lines.is_empty() => {
            let l = lines[r.below(lines.len())].clone();
            let at = r.below(lines.len() + 1);
            lines.insert(at, l);
        }
        2 if lines.len() > 1 => {
            let (a, b) = (r.below(lines.len()), r.below(lines.len()));
            lines.swap(a, b);
        }
        3 => {
            let s: String = lines.concat();
            return cut_at(&s, r.below(s.len() + 1)).to_string();
        }
        4 => {
            let s: String = lines.concat();
            let at = char_floor(&s, r.below(s.len() + 1));
            let piece = NASTY[r.below(NASTY.len())];
            return format!("{}{piece}{}", &s[..at], &s[at..]);
        }
        5 => {
            let s: String = lines.concat();
            return replace_a_number(r, &s);
        }
        6 => {
            let o: Vec<&str> = other.split_inclusive('\n').collect();
            if !o.is_empty() {
                let from = r.below(o.len());
                let n = 1 + r.below(8);
                let chunk: String = o[from..(from + n).min(o.len())].concat();
                let at = r.below(lines.len() + 1);
                lines.insert(at, chunk);
            }
        }
        7 if !lines.is_empty() => {
            // A line's words shuffled a little: a word dropped.
            let i = r.below(lines.len());
            let words: Vec<&str> = lines[i].split(' ').collect();
            if words.len() > 1 {
                let drop = r.below(words.len());
                let kept: Vec<&str> = words
                    .iter()
                    .enumerate()
                    .filter(|(k, _)| *k != drop)
                    .map(|(_, w)| *w)
                    .collect();
                lines[i] = kept.join(" ");
            }
        }
        _ => {
            let s: String = lines.concat();
            let at = char_floor(&s, r.below(s.len() + 1));
            let n = 1 + r.below(64);
            return format!("{}{}", &s[..at], random_text(r, n));
        }
    }
    lines.concat()
}

fn char_floor(s: &str, mut at: usize) -> usize {
    at = at.min(s.len());
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn cut_at(s: &str, at: usize) -> &str {
    &s[..char_floor(s, at)]
}

/// A run of digits (the `k`-th) replaced by a number no reader expects.
fn replace_a_number(r: &mut Rng, s: &str) -> String {
    let starts: Vec<usize> = s
        .char_indices()
        .filter(|(i, c)| c.is_ascii_digit() && (*i == 0 || !s.as_bytes()[i - 1].is_ascii_digit()))
        .map(|(i, _)| i)
        .collect();
    if starts.is_empty() {
        return s.to_string();
    }
    let at = starts[r.below(starts.len())];
    let end = s[at..]
        .find(|c: char| !c.is_ascii_digit())
        .map_or(s.len(), |e| at + e);
    format!("{}{}{}", &s[..at], HUGE[r.below(HUGE.len())], &s[end..])
}

/// Random text: mostly printable, with line ends, structure characters and any code points.
fn random_text(r: &mut Rng, len: usize) -> String {
    (0..len)
        .map(|_| match r.below(12) {
            0 => '\n',
            1 => char::from_u32(r.next() as u32 % 0x11_0000).unwrap_or('\u{fffd}'),
            2 => ['{', '}', '[', ']', '"', ':', '.', ',', '/', '-'][r.below(10)],
            _ => (b' ' + r.below(95) as u8) as char,
        })
        .collect()
}

/// Random bytes read as a file is (invalid UTF-8 replaced).
fn random_bytes(r: &mut Rng, len: usize) -> String {
    let bytes: Vec<u8> = (0..len).map(|_| r.next() as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Runs `f` on `text`; a panic is re-raised naming the case, its text saved for replay.
fn guarded<T>(
    seed: u64,
    case: usize,
    text: &str,
    f: impl Fn(&str) -> T + std::panic::RefUnwindSafe,
) -> T {
    match std::panic::catch_unwind(|| f(text)) {
        Ok(v) => v,
        Err(_) => {
            let out = std::env::temp_dir().join(format!("weir-fuzz-{seed}-{case}.txt"));
            let _ = std::fs::write(&out, text);
            panic!(
                "seed {seed} case {case} panicked; its input is in {}",
                out.display()
            );
        }
    }
}

#[test]
fn every_reader_survives_mutated_fixtures_and_random_bytes() {
    let cases: usize = std::env::var("WEIR_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1500);
    let seed: u64 = std::env::var("WEIR_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed_0030);
    let fx = fixtures();
    assert!(fx.len() > 100, "only {} fixtures", fx.len());
    let mut r = Rng(seed | 1);
    let (mut total_bytes, mut read, mut skipped) = (0, 0, 0);
    for case in 0..cases {
        let (name, base) = &fx[r.below(fx.len())];
        let text = if case % 8 == 7 {
            let len = r.below(4096);
            if case % 16 == 7 {
                random_bytes(&mut r, len)
            } else {
                random_text(&mut r, len)
            }
        } else {
            let mut t = base.clone();
            for _ in 0..1 + r.below(6) {
                let other = &fx[r.below(fx.len())].1;
                t = mutate(&mut r, &t, other);
            }
            t
        };
        total_bytes += text.len();
        let (r_any, s_any) = guarded(seed, case, &text, read_everything);
        read += usize::from(r_any);
        skipped += usize::from(s_any);
        if case % 10 == 0 {
            guarded(seed, case, &text, |t| diagnose(name, t));
        }
    }
    eprintln!(
        "{cases} cases ({} MB) over {} fixtures, seed {seed}: {read} read in part, {skipped} with lines skipped",
        total_bytes >> 20,
        fx.len()
    );
    // The mutated outputs are still largely outputs, and the mutations break some of them.
    assert!(
        read > cases / 10 && skipped > cases / 10,
        "{read} read, {skipped} skipped"
    );
}
