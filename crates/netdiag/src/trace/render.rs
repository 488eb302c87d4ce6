//! A trace as text for people, and as an SVG picture.

use super::packet::{EndpointOutcome, PolicyVerdict, Trace, Verdict};

/// `tcp 10.0.0.1:40000 → 10.96.0.1:443`, `icmp echo-request 10.0.0.1 → 10.0.0.2`.
fn packet_line(p: &super::packet::Packet) -> String {
    use super::packet::destination;
    if p.proto.has_ports() {
        let (src, dst) = (
            destination(p.src, p.sport, p.proto),
            destination(p.dst, p.dport, p.proto),
        );
        format!("{} {src} → {dst}", p.proto.name())
    } else {
        format!("{} echo-request {} → {}", p.proto.name(), p.src, p.dst)
    }
}

/// A trace for people: one line per hop with its rule, then the verdict.
pub fn render(t: &Trace) -> String {
    let p = &t.packet;
    let mut out = format!("{} in {}\n", packet_line(p), p.iif);
    for h in &t.hops {
        out.push_str(&format!("  {:<18} {:<36} {}\n", h.stage, h.place, h.note));
        if let Some(r) = &h.rule {
            out.push_str(&format!("  {:<18}   {r}\n", ""));
        }
    }
    for c in &t.choices {
        out.push_str(&format!("choice: {c}\n"));
    }
    for d in &t.policy {
        let word = match d.verdict {
            PolicyVerdict::Dropped => "DROPPED by NetworkPolicy: ",
            _ => "",
        };
        out.push_str(&format!("policy: {word}{}\n", d.describe()));
    }
    if !t.endpoint_outcomes.is_empty() {
        out.push_str(&format!("endpoints: {}\n", endpoint_count(t)));
        for e in &t.endpoint_outcomes {
            out.push_str(&format!("  {:<22} {}\n", e.endpoint, endpoint_line(e)));
        }
        if let Some(e) = shown_endpoint(t) {
            out.push_str(&format!(
                "  (the hops above are the walk to {})\n",
                e.endpoint
            ));
        }
    }
    match &t.verdict {
        Verdict::Delivered => {
            out.push_str("verdict: delivered (request and reply pass this node)\n")
        }
        Verdict::Dropped | Verdict::Rejected | Verdict::Unknown => {
            out.push_str(&format!(
                "verdict: {}: {}\n",
                verdict_word(&t.verdict),
                t.cause.as_deref().unwrap_or("")
            ));
            for (i, f) in t.fixes.iter().enumerate() {
                out.push_str(&format!("  fix {}: {f}\n", i + 1));
            }
        }
        Verdict::Conditional => {
            out.push_str("verdict: CONDITIONAL: it depends on what the dump does not say\n");
            for b in &t.branches {
                match &b.cause {
                    Some(c) => out.push_str(&format!(
                        "  {} if {}: {c}\n",
                        verdict_word(&b.verdict),
                        b.when_text
                    )),
                    None => out.push_str(&format!(
                        "  {} if {}\n",
                        verdict_word(&b.verdict),
                        b.when_text
                    )),
                }
                for (i, f) in b.fixes.iter().enumerate() {
                    out.push_str(&format!("    fix {}: {f}\n", i + 1));
                }
            }
            if let Some(b) = t
                .branches
                .iter()
                .find(|b| b.verdict != Verdict::Delivered && b.cause == t.cause)
            {
                out.push_str(&format!(
                    "  (the hops above are the path where {})\n",
                    b.when_text
                ));
            }
        }
    }
    for u in &t.unknowns {
        out.push_str(&format!(
            "unknown: {}: {}; settle it with {}\n",
            u.fact.name(),
            u.why,
            u.settle
        ));
    }
    for a in &t.assumptions {
        out.push_str(&format!("assumed: {a}\n"));
    }
    out
}

/// One endpoint's outcome on a line: its verdict and cause, or each branch's.
fn endpoint_line(e: &EndpointOutcome) -> String {
    match e.verdict {
        Verdict::Delivered => "delivered".into(),
        Verdict::Conditional => format!(
            "CONDITIONAL: {}",
            e.branches
                .iter()
                .map(|b| match &b.cause {
                    Some(c) => format!("{} if {}: {c}", verdict_word(&b.verdict), b.when_text),
                    None => format!("{} if {}", verdict_word(&b.verdict), b.when_text),
                })
                .collect::<Vec<_>>()
                .join("; ")
        ),
        _ => format!(
            "{}: {}",
            verdict_word(&e.verdict),
            e.cause.as_deref().unwrap_or("")
        ),
    }
}

/// "1 of 2 delivered", with how many depend on what the dump does not say.
fn endpoint_count(t: &Trace) -> String {
    let n = t.endpoint_outcomes.len();
    let ok = t.endpoint_outcomes.iter().filter(|e| e.delivered()).count();
    let cond = t
        .endpoint_outcomes
        .iter()
        .filter(|e| e.verdict == Verdict::Conditional && !e.delivered())
        .count();
    match cond {
        0 => format!("{ok} of {n} delivered"),
        c => format!("{ok} of {n} delivered whatever the dump does not say, {c} conditional"),
    }
}

/// The endpoint whose walk the trace's hops are.
fn shown_endpoint(t: &Trace) -> Option<&EndpointOutcome> {
    t.endpoint_outcomes.iter().find(|e| {
        e.hops.len() == t.hops.len()
            && e.hops
                .iter()
                .zip(&t.hops)
                .all(|(a, b)| a.note == b.note && a.rule == b.rule)
    })
}

pub(super) fn verdict_word(v: &Verdict) -> &'static str {
    match v {
        Verdict::Delivered => "delivered",
        Verdict::Dropped => "DROPPED",
        Verdict::Rejected => "REJECTED",
        Verdict::Conditional => "CONDITIONAL",
        Verdict::Unknown => "UNKNOWN",
    }
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The path as an SVG picture: one box per hop, top to bottom, with the stage, the place, the
/// note and the rule that decided; the box where the packet was dropped is red, and the verdict
/// closes the column.
pub fn svg(t: &Trace) -> String {
    let p = &t.packet;
    let w = svg_width(t);
    let n = t.hops.len();
    let per_endpoint = if t.endpoint_outcomes.is_empty() {
        0
    } else {
        t.endpoint_outcomes.len() + 1
    };
    let height = 70 + n * (BOX_H + GAP) + 60 + 18 * (t.fixes.len() + per_endpoint);
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{height}\" font-family=\"monospace\" font-size=\"12\">\n"
    );
    out.push_str(&format!(
        "<text x=\"10\" y=\"24\" font-size=\"15\" font-weight=\"bold\">{}</text>\n",
        xml_escape(&format!("{} in {}", packet_line(p), p.iif))
    ));
    svg_hops(t, w, &mut out);
    svg_verdict(t, &mut out);
    out.push_str("</svg>\n");
    out
}

/// An SVG hop box's height, and the gap (with its arrow) between two boxes.
const BOX_H: usize = 58;
const GAP: usize = 18;

/// The picture's width in pixels.
fn svg_width(t: &Trace) -> usize {
    // Wide enough for the longest line at 12px monospace (~7.3px a character).
    let longest = t
        .hops
        .iter()
        .flat_map(|h| {
            [
                h.note.chars().count(),
                h.rule.as_deref().map_or(0, |r| r.chars().count()),
            ]
        })
        .chain(t.fixes.iter().map(|f| f.chars().count() + 8))
        .chain(t.cause.iter().map(|c| c.chars().count() + 20))
        .chain(
            t.endpoint_outcomes
                .iter()
                .map(|e| e.endpoint.chars().count() + endpoint_line(e).chars().count() + 8),
        )
        .max()
        .unwrap_or(0);
    (longest * 73 / 10 + 60).max(900)
}

/// One box per hop (red where the packet was dropped, blue on the reply's way), arrows
/// between them.
fn svg_hops(t: &Trace, w: usize, out: &mut String) {
    let n = t.hops.len();
    let dropped_at = match t.verdict {
        Verdict::Dropped | Verdict::Rejected | Verdict::Conditional | Verdict::Unknown => {
            n.checked_sub(1)
        }
        Verdict::Delivered => None,
    };
    for (i, h) in t.hops.iter().enumerate() {
        let y = 40 + i * (BOX_H + GAP);
        let (fill, stroke) = if Some(i) == dropped_at {
            ("#fde2e2", "#c0392b")
        } else if h.stage.starts_with("reply") {
            ("#e8f0fe", "#4a6fa5")
        } else {
            ("#eef7ee", "#4a8a4a")
        };
        out.push_str(&format!(
            "<rect x=\"10\" y=\"{y}\" width=\"{}\" height=\"{BOX_H}\" rx=\"6\" fill=\"{fill}\" stroke=\"{stroke}\"/>\n",
            w - 20
        ));
        out.push_str(&format!(
            "<text x=\"20\" y=\"{}\" font-weight=\"bold\">{}</text>\n",
            y + 17,
            xml_escape(&format!("{}  {}", h.stage, h.place))
        ));
        out.push_str(&format!(
            "<text x=\"20\" y=\"{}\">{}</text>\n",
            y + 34,
            xml_escape(&h.note)
        ));
        if let Some(r) = &h.rule {
            out.push_str(&format!(
                "<text x=\"20\" y=\"{}\" fill=\"#555\">{}</text>\n",
                y + 50,
                xml_escape(r)
            ));
        }
        if i + 1 < n {
            let (x, y1, y2) = (w / 2, y + BOX_H, y + BOX_H + GAP);
            out.push_str(&format!(
                "<line x1=\"{x}\" y1=\"{y1}\" x2=\"{x}\" y2=\"{y2}\" stroke=\"#333\"/><path d=\"M{} {} L{x} {y2} L{} {} Z\" fill=\"#333\"/>\n",
                x - 4,
                y2 - 6,
                x + 4,
                y2 - 6
            ));
        }
    }
}

/// The verdict under the boxes, the fixes, one line per endpoint of the rules' choice.
fn svg_verdict(t: &Trace, out: &mut String) {
    let n = t.hops.len();
    let y = 40 + n * (BOX_H + GAP) + 16;
    let verdict = match t.verdict {
        Verdict::Delivered => "verdict: delivered".to_string(),
        Verdict::Dropped => format!("verdict: DROPPED: {}", t.cause.as_deref().unwrap_or("")),
        Verdict::Rejected => format!("verdict: REJECTED: {}", t.cause.as_deref().unwrap_or("")),
        Verdict::Unknown => format!("verdict: UNKNOWN: {}", t.cause.as_deref().unwrap_or("")),
        Verdict::Conditional => format!(
            "verdict: CONDITIONAL: {}",
            t.branches
                .iter()
                .map(|b| format!("{} if {}", verdict_word(&b.verdict), b.when_text))
                .collect::<Vec<_>>()
                .join("; ")
        ),
    };
    let color = if t.verdict == Verdict::Delivered {
        "#2e7d32"
    } else {
        "#c0392b"
    };
    out.push_str(&format!(
        "<text x=\"10\" y=\"{y}\" font-weight=\"bold\" fill=\"{color}\">{}</text>\n",
        xml_escape(&verdict)
    ));
    for (i, f) in t.fixes.iter().enumerate() {
        out.push_str(&format!(
            "<text x=\"20\" y=\"{}\">{}</text>\n",
            y + 18 * (i + 1),
            xml_escape(&format!("fix {}: {f}", i + 1))
        ));
    }
    // One line per endpoint of the rules' choice, green when delivered, red otherwise.
    if !t.endpoint_outcomes.is_empty() {
        let y0 = y + 18 * (t.fixes.len() + 1);
        out.push_str(&format!(
            "<text x=\"10\" y=\"{y0}\" font-weight=\"bold\">{}</text>\n",
            xml_escape(&format!("endpoints: {}", endpoint_count(t)))
        ));
        for (i, e) in t.endpoint_outcomes.iter().enumerate() {
            let color = if e.delivered() { "#2e7d32" } else { "#c0392b" };
            out.push_str(&format!(
                "<text x=\"20\" y=\"{}\" fill=\"{color}\" class=\"endpoint\">{}</text>\n",
                y0 + 18 * (i + 1),
                xml_escape(&format!("{}: {}", e.endpoint, endpoint_line(e)))
            ));
        }
    }
}
