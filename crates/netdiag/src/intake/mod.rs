//! Input as people paste it: a directory of outputs, one file, or standard input, any of them
//! holding one output or many (a ticket body: `$ ip route` … `$ sudo iptables -v -L FORWARD` …).
//! [`split`] cuts a text into the outputs it holds, [`classify`] says what each one is by its
//! content, and [`sections`] turns them into [`Section`]s that name the [`Output`] a reader
//! of `crates/netdiag` consumes, so one pasted blob feeds the same node state a `weir trace
//! collect` directory does ([`crate::state::NodeState::from_sections`]). All pure.

pub mod classify;
pub mod split;

use serde::Serialize;

use crate::output::Output;

/// What a section of a paste is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    IptablesSave,
    /// `iptables -S`, or `-A …` lines cut out of a dump with grep.
    IptablesRules,
    IptablesListing,
    NftJson,
    NftText,
    IpRoute,
    IpRouteGet,
    IpRule,
    IpAddr,
    IpBrAddr,
    IpLink,
    IpBrLink,
    IpNeigh,
    IpvsadmLn,
    IpvsadmSave,
    IpvsadmConns,
    IpsetList,
    IpsetSave,
    ConntrackList,
    ProcConntrack,
    ConntrackStats,
    Sysctl,
    HairpinMode,
    KernelLog,
    Tcpdump,
    ResolvConf,
    /// Kubernetes objects (YAML or JSON), for doctor's policy checks.
    Objects,
    Unknown,
}

impl Kind {
    /// How the report names it: the command that prints it.
    pub fn label(self) -> &'static str {
        match self {
            Kind::IptablesSave => "iptables-save",
            Kind::IptablesRules => "iptables -S (rules)",
            Kind::IptablesListing => "iptables -L",
            Kind::NftJson => "nft -j list ruleset",
            Kind::NftText => "nft list ruleset",
            Kind::IpRoute => "ip route",
            Kind::IpRouteGet => "ip route get",
            Kind::IpRule => "ip rule",
            Kind::IpAddr => "ip addr",
            Kind::IpBrAddr => "ip -br addr",
            Kind::IpLink => "ip link",
            Kind::IpBrLink => "ip -br link",
            Kind::IpNeigh => "ip neigh",
            Kind::IpvsadmLn => "ipvsadm -Ln",
            Kind::IpvsadmSave => "ipvsadm -Sn",
            Kind::IpvsadmConns => "ipvsadm -Lnc",
            Kind::IpsetList => "ipset list",
            Kind::IpsetSave => "ipset save",
            Kind::ConntrackList => "conntrack -L",
            Kind::ProcConntrack => "/proc/net/nf_conntrack",
            Kind::ConntrackStats => "conntrack -S",
            Kind::Sysctl => "sysctl",
            Kind::HairpinMode => "hairpin_mode",
            Kind::KernelLog => "kernel log",
            Kind::Tcpdump => "tcpdump",
            Kind::ResolvConf => "resolv.conf",
            Kind::Objects => "Kubernetes objects",
            Kind::Unknown => "?",
        }
    }

    /// Whether the same lines may be IPv4's or IPv6's (told by the command or the addresses).
    pub fn has_v6_form(self) -> bool {
        matches!(
            self,
            Kind::IptablesSave
                | Kind::IptablesRules
                | Kind::IptablesListing
                | Kind::IpRoute
                | Kind::IpRule
        )
    }

    /// The reader that consumes it, if there is one yet.
    pub fn output(self, v6: bool) -> Option<Output> {
        Some(match self {
            Kind::IptablesSave | Kind::IptablesRules | Kind::IptablesListing if v6 => {
                Output::Ip6tablesSave
            }
            Kind::IptablesSave | Kind::IptablesRules | Kind::IptablesListing => {
                Output::IptablesSave
            }
            Kind::NftJson | Kind::NftText => Output::NftRuleset,
            Kind::IpRoute if v6 => Output::Ip6Route,
            Kind::IpRoute => Output::IpRoute,
            Kind::IpRouteGet => Output::IpRouteGet,
            Kind::IpRule if v6 => Output::Ip6Rule,
            Kind::IpRule => Output::IpRule,
            Kind::IpAddr | Kind::IpBrAddr => Output::IpAddr,
            Kind::IpLink => Output::IpLink,
            Kind::IpNeigh => Output::IpNeigh,
            Kind::IpvsadmLn | Kind::IpvsadmSave => Output::IpvsadmLn,
            Kind::IpvsadmConns => Output::IpvsadmConns,
            Kind::IpsetList | Kind::IpsetSave => Output::IpsetList,
            Kind::ConntrackList | Kind::ProcConntrack => Output::ConntrackList,
            Kind::ConntrackStats => Output::ConntrackStats,
            Kind::Sysctl => Output::Sysctl,
            Kind::HairpinMode => Output::HairpinMode,
            Kind::KernelLog => Output::KernelLog,
            Kind::Tcpdump => Output::Tcpdump,
            Kind::ResolvConf => Output::PodResolvConf,
            Kind::IpBrLink | Kind::Objects | Kind::Unknown => return None,
        })
    }

    /// The kind an output's file holds when it is given by name only (a live collection).
    fn of_output(o: Output) -> Kind {
        match o {
            Output::IptablesSave | Output::Ip6tablesSave => Kind::IptablesSave,
            Output::NftRuleset => Kind::NftJson,
            Output::IpsetList => Kind::IpsetList,
            Output::IpRule | Output::Ip6Rule => Kind::IpRule,
            Output::IpRoute | Output::Ip6Route => Kind::IpRoute,
            Output::IpLink => Kind::IpLink,
            Output::IpAddr | Output::PodIpAddr => Kind::IpAddr,
            Output::IpNeigh => Kind::IpNeigh,
            Output::IpvsadmLn => Kind::IpvsadmLn,
            Output::Sysctl => Kind::Sysctl,
            Output::ConntrackStats => Kind::ConntrackStats,
            Output::ConntrackList => Kind::ConntrackList,
            Output::IpRouteGet => Kind::IpRouteGet,
            Output::IpvsadmConns => Kind::IpvsadmConns,
            Output::HairpinMode => Kind::HairpinMode,
            Output::KernelLog => Kind::KernelLog,
            Output::Tcpdump => Kind::Tcpdump,
            Output::PodResolvConf => Kind::ResolvConf,
        }
    }
}

/// What became of a section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Given to its reader.
    Read,
    /// Recognised, but nothing reads it yet.
    NotUsedYet,
    NotRecognised,
}

impl Status {
    pub fn label(self) -> &'static str {
        match self {
            Status::Read => "read",
            Status::NotUsedYet => "recognised, not used by the walk yet",
            Status::NotRecognised => "not recognised",
        }
    }
}

/// One output found in the input, and what became of it.
#[derive(Debug, Clone, Serialize)]
pub struct Section {
    /// The file it came from (`-` for standard input).
    pub source: String,
    /// 1-based line of its first line in that file.
    pub line: usize,
    /// How many lines it spans.
    pub lines: usize,
    /// The command of its prompt line (or the one its file's name spells).
    pub command: Option<String>,
    pub kind: Kind,
    /// [`Kind::label`], for readers of the JSON.
    pub format: &'static str,
    pub v6: bool,
    /// The reader's output it feeds.
    pub output: Option<Output>,
    pub status: Status,
    /// What decided between forms the content alone could not tell apart.
    pub hint: Option<String>,
    /// Its first line (cut to 80 characters) when not recognised.
    pub first_line: Option<String>,
    /// Its text as given to the reader (with the command its file's name spells as a prompt
    /// line when it had none).
    #[serde(skip)]
    pub text: String,
    /// Lines of `text` before the input's own (that synthetic prompt line).
    #[serde(skip)]
    pub added_lines: usize,
    /// `text` is JSON: its readers number elements, not lines.
    #[serde(skip)]
    pub json: bool,
}

impl Section {
    /// `file:line`.
    pub fn origin(&self) -> String {
        format!("{}:{}", self.source, self.line)
    }

    /// The input's line number of line `no` of [`Section::text`].
    pub fn input_line(&self, no: usize) -> usize {
        (self.line + no).saturating_sub(1 + self.added_lines)
    }

    /// A section holding output `o` whole, as a live collection gives it.
    pub fn given(o: Output, text: String) -> Section {
        Section {
            source: o.file_name().to_string(),
            line: 1,
            lines: text.lines().count(),
            command: None,
            kind: Kind::of_output(o),
            format: Kind::of_output(o).label(),
            v6: matches!(
                o,
                Output::Ip6tablesSave | Output::Ip6Rule | Output::Ip6Route
            ),
            output: Some(o),
            status: Status::Read,
            hint: None,
            first_line: None,
            json: text
                .lines()
                .find(|l| !l.trim().is_empty())
                .is_some_and(classify::looks_json),
            text,
            added_lines: 0,
        }
    }
}

/// The sections of one input (`source` names it: a file name, or `-`).
pub fn sections(source: &str, text: &str) -> Vec<Section> {
    let spans: Vec<split::Span> = split::split(text)
        .into_iter()
        .flat_map(|s| cut_tails(s, source))
        .collect();
    let whole = spans.len() == 1;
    let by_name = Output::for_file_name(source);
    // An empty file named for an output is that output, empty (no rules, no sets): not absent.
    if spans.is_empty() && text.trim().is_empty() {
        if let Some(o) = by_name {
            let mut s = Section::given(o, text.to_string());
            s.source = source.to_string();
            return vec![s];
        }
    }
    spans
        .into_iter()
        .map(|span| {
            // A file holding one output may name its command (`ip-route-show-table-local`).
            let named = (whole && span.command.is_none())
                .then(|| command_of_name(source))
                .flatten();
            let command = span.command.clone().or(named.clone());
            let class = classify::classify(span.text, command.as_deref(), source);
            let mut output = class.kind.output(class.v6);
            let mut hint = class.hint;
            let mut kind = class.kind;
            // `[]` (`ip -j neigh` of no entries) says nothing of what it lists: the name does.
            // A whole file named for an output whose lines are not recognised goes to that
            // output's reader too, which says what it could not read (and leaves it out).
            if kind == Kind::Unknown && (whole || matches!(span.text.trim(), "[]" | "{}")) {
                if let Some(o) = by_name {
                    (kind, output) = (Kind::of_output(o), Some(o));
                    hint = Some(if matches!(span.text.trim(), "[]" | "{}") {
                        format!("file name {source}")
                    } else {
                        format!("file name {source}; its lines were not recognised")
                    });
                }
            }
            // The pod's own `ip addr` is told by its file's name, or a command run in a pod.
            if output == Some(Output::IpAddr) {
                if by_name == Some(Output::PodIpAddr) {
                    output = by_name;
                    hint = Some(format!("file name {source}"));
                } else if let Some(c) = command.as_deref().filter(|c| runs_in_a_pod(c)) {
                    output = Some(Output::PodIpAddr);
                    hint = Some(format!("`{c}`"));
                }
            }
            let status = match (kind, output) {
                (Kind::Unknown, _) => Status::NotRecognised,
                (Kind::Objects, _) | (_, Some(_)) => Status::Read,
                (_, None) => Status::NotUsedYet,
            };
            let mut text = span.text.to_string();
            let mut added_lines = 0;
            if let Some(cmd) = named.as_deref().filter(|_| output.is_some()) {
                text.insert_str(0, &format!("$ {cmd}\n"));
                added_lines = 1;
            }
            Section {
                source: source.to_string(),
                line: span.line,
                lines: span.text.lines().count(),
                command,
                kind,
                format: kind.label(),
                v6: class.v6,
                output,
                status,
                hint,
                first_line: (status == Status::NotRecognised).then(|| first_line(span.text)),
                json: span
                    .text
                    .lines()
                    .find(|l| !l.trim().is_empty() && crate::paste::prompt_command(l).is_none())
                    .is_some_and(classify::looks_json),
                text,
                added_lines,
            }
        })
        .collect()
}

/// Cuts off a span's last paragraphs (after a blank line) when every line of each is of one
/// other output, read by another reader: outputs pasted one after the other without a prompt
/// (`iptables -L FORWARD`, a blank line, then `/proc/sys/…` lines). The first paragraph always
/// stays; a paragraph with a line of the span's own kind, or none recognised, ends the search.
fn cut_tails<'a>(span: split::Span<'a>, name: &str) -> Vec<split::Span<'a>> {
    // (byte offset, line index) of each paragraph's first line.
    let mut starts = Vec::new();
    let mut offset = 0;
    let mut blank_before = false;
    for (i, l) in span.text.split_inclusive('\n').enumerate() {
        let blank = l.trim().is_empty();
        if !blank && blank_before && i > 0 {
            starts.push((offset, i));
        }
        blank_before = blank;
        offset += l.len();
    }
    let Some(&(first_end, _)) = starts.first() else {
        return vec![span];
    };
    // What the span is, as its first paragraph (under its prompt) says.
    let head = classify::classify(&span.text[..first_end], span.command.as_deref(), name);
    let own = head.kind.output(head.v6);
    let mut tails: Vec<(usize, usize, Kind)> = Vec::new();
    let mut end = span.text.len();
    for &(start, i) in starts.iter().rev() {
        let Some(k) = uniform(&span.text[start..end]) else {
            break;
        };
        if classify::refines(k, head.kind) || k.output(false) == own || k.output(false).is_none() {
            break;
        }
        match tails.last_mut() {
            Some(t) if t.2 == k => (t.0, t.1) = (start, i),
            _ => tails.push((start, i, k)),
        }
        end = start;
    }
    if tails.is_empty() {
        return vec![span];
    }
    let mut out = vec![split::Span {
        line: span.line,
        text: &span.text[..tails.last().expect("one").0],
        command: span.command.clone(),
    }];
    let mut ends: Vec<usize> = tails.iter().map(|t| t.0).collect();
    ends.insert(0, span.text.len());
    for (k, t) in tails.iter().enumerate().rev() {
        out.push(split::Span {
            line: span.line + t.1,
            text: &span.text[t.0..ends[k]],
            command: None,
        });
    }
    out
}

/// The kind every line of a paragraph has, when they all have the same one.
fn uniform(text: &str) -> Option<Kind> {
    let mut kind = None;
    for l in text.lines().filter(|l| !l.trim().is_empty()) {
        let k = classify::line_kind(l)?;
        if kind.is_some_and(|have| have != k) {
            return None;
        }
        kind = Some(k);
    }
    kind
}

/// `kubectl exec POD -- ip addr`, `crictl exec …`, `docker exec …`: a command run in a pod.
fn runs_in_a_pod(cmd: &str) -> bool {
    let w: Vec<&str> = cmd.split_whitespace().collect();
    w.iter().any(|t| {
        matches!(
            t.rsplit('/').next(),
            Some("kubectl" | "crictl" | "docker" | "nerdctl")
        )
    }) && w.contains(&"exec")
}

/// The first non-blank line, cut to 80 characters.
fn first_line(text: &str) -> String {
    let l = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    match l.char_indices().nth(80) {
        Some((i, _)) => format!("{}…", &l[..i]),
        None => l.to_string(),
    }
}

/// The command a file's name spells, as people name their pastes: `iptables-t-nat-L-n.txt` is
/// `iptables -t nat -L -n`, `ip-route-show-table-local` is `ip route show table local`. Only
/// names starting with a networking tool's name spell one.
pub fn command_of_name(name: &str) -> Option<String> {
    let stem = [".txt", ".out", ".log", ".json"]
        .iter()
        .find_map(|e| name.strip_suffix(e))
        .unwrap_or(name);
    let words: Vec<&str> = stem
        .split(['-', ' ', '_'])
        .filter(|w| !w.is_empty())
        .collect();
    let mut tool = words.first()?.to_string();
    let mut i = 1;
    // `iptables-nft-save`, `ip6tables-legacy-save`: one word.
    if tool.starts_with("iptables") || tool.starts_with("ip6tables") {
        while !tool.ends_with("save") && matches!(words.get(i), Some(&("nft" | "legacy" | "save")))
        {
            tool = format!("{tool}-{}", words[i]);
            i += 1;
        }
    }
    let tool = tool.as_str();
    let ip = tool == "ip";
    if !(ip
        || ["ipset", "ipvsadm", "conntrack", "nft", "sysctl"].contains(&tool)
        || tool.starts_with("iptables")
        || tool.starts_with("ip6tables"))
    {
        return None;
    }
    let mut out = vec![tool.to_string()];
    while i < words.len() {
        let w = words[i];
        if w == "line" && words.get(i + 1) == Some(&"numbers") {
            out.push("--line-numbers".into());
            i += 2;
            continue;
        }
        let flag = if ip {
            matches!(w, "4" | "6" | "j" | "d" | "s" | "br" | "c")
        } else {
            w.len() == 1 || w.len() <= 3 && w.starts_with(|c: char| c.is_ascii_uppercase())
        };
        out.push(if flag { format!("-{w}") } else { w.to_string() });
        i += 1;
    }
    Some(out.join(" "))
}

/// The "what was read" table: one line per section.
pub fn render(sections: &[Section]) -> String {
    let mut out = String::from("read:\n");
    for s in sections {
        let what = match s.status {
            Status::Read => format!(
                "{}{}",
                s.format,
                if s.v6 && s.kind.has_v6_form() {
                    " (IPv6)"
                } else {
                    ""
                }
            ),
            Status::NotUsedYet => format!("{} ({})", s.format, s.status.label()),
            Status::NotRecognised => format!(
                "not recognised: \"{}\"",
                s.first_line.as_deref().unwrap_or("")
            ),
        };
        let hint = s
            .hint
            .as_deref()
            .map(|h| format!(" (by {h})"))
            .unwrap_or_default();
        out.push_str(&format!(
            "  {:<28} {:>6} lines  {what}{hint}\n",
            s.origin(),
            s.lines
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_name_spells_its_command() {
        for (name, cmd) in [
            (
                "ip-route-show-table-local",
                Some("ip route show table local"),
            ),
            ("iptables-t-nat-L-n.txt", Some("iptables -t nat -L -n")),
            ("iptables-v-L-FORWARD", Some("iptables -v -L FORWARD")),
            (
                "iptables-L-n-v-line-numbers.txt",
                Some("iptables -L -n -v --line-numbers"),
            ),
            ("ip6tables-nft-save.txt", Some("ip6tables-nft-save")),
            ("ip-6-rule.txt", Some("ip -6 rule")),
            ("ipvsadm-Lnc.txt", Some("ipvsadm -Lnc")),
            ("nf_conntrack", None),
            ("paste.txt", None),
        ] {
            assert_eq!(command_of_name(name).as_deref(), cmd, "{name}");
        }
    }

    #[test]
    fn sections_number_lines_of_the_input() {
        let text = "intro\n\n$ ip route\ndefault via 10.0.0.1 dev eth0\n";
        let s = sections("paste.txt", text);
        assert_eq!(s.len(), 2);
        assert_eq!(
            (s[0].status, s[0].first_line.as_deref()),
            (Status::NotRecognised, Some("intro"))
        );
        assert_eq!((s[1].line, s[1].lines, s[1].kind), (3, 2, Kind::IpRoute));
        assert_eq!(s[1].input_line(2), 4);
        // A file spelling its command reads it as a prompt line above its own lines.
        let s = sections(
            "ip-route-show-table-local",
            "local 10.0.0.5 dev eth0 scope host\n",
        );
        assert!(s[0].text.starts_with("$ ip route show table local\n"));
        assert_eq!((s[0].added_lines, s[0].input_line(2)), (1, 1));
    }
}
