//! What surrounds an output when people paste it into a ticket, and is not the output: Windows
//! line ends, the shell prompt and command above it (`$ ip route`, `root@node:~# ipvsadm -Ln`,
//! `[root@node ~]# …`), `grep -A`/`-B`/`-C` group separators (`--`), and a last line cut off
//! mid-way. Every text parser reads its input through [`lines`], so each of them handles all
//! of these the same way.

/// One line of a pasted output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Line<'a> {
    /// 1-based line number in the input as pasted.
    pub no: usize,
    /// The line without its line end (`\n` or `\r\n`).
    pub text: &'a str,
    /// A `grep` group separator (`--`): the lines before and after it were not adjacent, so
    /// whatever a parser was reading (an interface block, a virtual server's real servers, a
    /// set's members) ends here, possibly cut.
    pub grep_break: bool,
    /// The last line, with no line end after it: the paste may have cut it off.
    pub unterminated: bool,
}

impl Line<'_> {
    /// Why this line was not read: `e`, said to be the paste's cut-off last line when it is.
    pub fn reason(&self, e: impl Into<String>) -> String {
        let e = e.into();
        if self.unterminated {
            format!("the last line, cut off by the paste? ({e})")
        } else {
            e
        }
    }
}

/// A pasted output's lines, without its prompt lines.
#[derive(Debug, Clone, Default)]
pub struct Pasted<'a> {
    pub lines: Vec<Line<'a>>,
    /// The commands of the prompt lines (`ip route show table all`), in order.
    pub commands: Vec<String>,
    /// The same with the line number of each prompt line.
    pub command_lines: Vec<(usize, String)>,
    /// There were `--` separators, or the prompt's command pipes into grep: grep cut the
    /// output, what it left out is unknown.
    pub grep_cut: bool,
    /// Lines ended with `\r\n`.
    pub crlf: bool,
}

impl<'a> Pasted<'a> {
    /// The lines that carry data (no separators, no blank lines).
    pub fn data(&self) -> impl Iterator<Item = &Line<'a>> {
        self.lines
            .iter()
            .filter(|l| !l.grep_break && !l.text.trim().is_empty())
    }

    /// The text without prompt lines, separators and `\r` (for the JSON forms).
    pub fn body(&self) -> String {
        let mut out = String::new();
        for l in self.data() {
            out.push_str(l.text);
            out.push('\n');
        }
        out
    }

    /// The command of the last prompt line above line `no`, when there is one (a paste of
    /// several commands' outputs has one above each).
    pub fn command_above(&self, no: usize) -> Option<&str> {
        self.command_lines
            .iter()
            .rev()
            .find(|(n, _)| *n < no)
            .map(|(_, c)| c.as_str())
    }

    /// The number of the last line when it has no line end (it may be cut), else `None`.
    pub fn unterminated_line(&self) -> Option<usize> {
        self.lines
            .iter()
            .rev()
            .find(|l| l.unterminated)
            .map(|l| l.no)
    }

    /// What a reader of this output should know about its shape, for the assumptions list:
    /// empty when it is a plain output.
    pub fn notes(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.grep_cut {
            out.push("cut with grep: what grep left out is unknown, not absent".into());
        }
        if let Some(n) = self.unterminated_line() {
            out.push(format!(
                "line {n} has no line end: the paste may have cut it off"
            ));
        }
        out
    }
}

/// Splits a pasted output into lines, dropping `\r`, prompt lines and marking `--` separators.
pub fn lines(text: &str) -> Pasted<'_> {
    let mut out = Pasted::default();
    if text.is_empty() {
        return out;
    }
    let ends_with_newline = text.ends_with('\n');
    let mut raw: Vec<&str> = text.split('\n').collect();
    if ends_with_newline {
        raw.pop();
    }
    let n = raw.len();
    for (i, l) in raw.into_iter().enumerate() {
        // `\r\n`, and `\r\r\n` from a file converted twice.
        let line = l.trim_end_matches('\r');
        if line.len() != l.len() {
            out.crlf = true;
        }
        let no = i + 1;
        if line.trim() == "--" {
            out.grep_cut = true;
            out.lines.push(Line {
                no,
                text: "",
                grep_break: true,
                unterminated: false,
            });
            continue;
        }
        if let Some(cmd) = prompt_command(line) {
            if !cmd.is_empty() {
                // A grep with one group of lines prints no separator; its command says it.
                let words: Vec<&str> = cmd.split_whitespace().collect();
                if words
                    .iter()
                    .enumerate()
                    .any(|(k, w)| matches!(*w, "grep" | "egrep") && (k == 0 || words[k - 1] == "|"))
                    || cmd.contains("|grep")
                {
                    out.grep_cut = true;
                }
                out.commands.push(cmd.to_string());
                out.command_lines.push((no, cmd.to_string()));
            }
            continue;
        }
        out.lines.push(Line {
            no,
            text: line,
            grep_break: false,
            unterminated: i + 1 == n && !ends_with_newline && !line.trim().is_empty(),
        });
    }
    out
}

/// The tools whose command lines are recognised after a bare `$ ` or `# ` (a bare `# ` line is
/// otherwise a comment, as in iptables-save's header).
const TOOLS: &[&str] = &[
    "ip",
    "ipset",
    "ipvsadm",
    "sysctl",
    "nft",
    "conntrack",
    "cat",
    "grep",
    "egrep",
    "kubectl",
    "nsenter",
    "crictl",
    "docker",
    "tail",
    "head",
    "ss",
    "weir",
    "bash",
    "sh",
    "less",
    "tcpdump",
    "dmesg",
    "journalctl",
    "ethtool",
    "bridge",
    "tc",
    "ping",
    "curl",
    "traceroute",
    "dig",
    "nslookup",
    "nc",
    "netstat",
];

fn is_tool(word: &str) -> bool {
    let base = word.rsplit('/').next().unwrap_or(word);
    TOOLS.contains(&base) || base.starts_with("iptables") || base.starts_with("ip6tables")
}

/// The command of a shell prompt line, or `None` when the line is not one. Recognised:
/// `user@host:~$ cmd`, `user@host:/dir# cmd`, `user@host ~ $ cmd`, `[user@host dir]# cmd`, and a
/// bare `$ cmd` or `# cmd` whose first word (after `sudo`) is a networking or shell tool.
pub fn prompt_command(line: &str) -> Option<&str> {
    let t = line.trim();
    if t == "$" || t == "#" {
        return Some("");
    }
    // [root@node-1 ~]# ip rule
    if let Some(inner) = t.strip_prefix('[') {
        let (inside, rest) = inner.split_once(']')?;
        if inside.contains('@') && !inside.contains('[') {
            let rest = rest.strip_prefix('#').or_else(|| rest.strip_prefix('$'))?;
            if rest.is_empty() || rest.starts_with(' ') {
                return Some(rest.trim());
            }
        }
        return None;
    }
    // root@node-1:~# ip rule   /   admin@node ~ $ ip rule
    let first = t.split_whitespace().next()?;
    if let Some((user, host)) = first.split_once('@') {
        let word = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
        let host_name: &str = host.split([':', '#', '$']).next().unwrap_or("");
        if !user.is_empty()
            && user.chars().all(word)
            && !host_name.is_empty()
            && host_name.chars().all(word)
            && !user.chars().all(|c| c.is_ascii_digit())
        {
            let after_host = &t[user.len() + 1 + host_name.len()..];
            // The prompt ends at the first `# ` or `$ ` (or a `#`/`$` ending the line).
            let bytes = after_host.as_bytes();
            for (k, b) in bytes.iter().enumerate() {
                if (*b == b'#' || *b == b'$')
                    && (k + 1 == bytes.len() || bytes[k + 1] == b' ')
                    && k < 80
                {
                    let between = &after_host[..k];
                    if between.is_empty() || between.starts_with(':') || between.starts_with(' ') {
                        return Some(after_host[k + 1..].trim());
                    }
                    return None;
                }
            }
        }
        return None;
    }
    // A command echoed bare above its output (`ip route show table local`): a networking
    // tool's name then options or a subcommand, never the first word of any of their outputs.
    if let Some(first) = t.split_whitespace().next() {
        let base = first.rsplit('/').next().unwrap_or(first);
        let bare_tools = [
            "ip",
            "ipset",
            "ipvsadm",
            "sysctl",
            "nft",
            "conntrack",
            "sudo",
        ];
        if (bare_tools.contains(&base)
            || base.starts_with("iptables")
            || base.starts_with("ip6tables"))
            && !t.contains(" = ")
            && !t.contains(": ")
        {
            return Some(t);
        }
    }
    // $ ip route   /   # iptables-save
    let rest = t.strip_prefix("$ ").or_else(|| t.strip_prefix("# "))?;
    let mut words = rest.split_whitespace();
    let mut w = words.next()?;
    if w == "sudo" {
        w = words.find(|x| !x.starts_with('-'))?;
    }
    is_tool(w).then_some(rest.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_are_told_from_comments_and_data() {
        assert_eq!(
            prompt_command("root@ip-10-12-97-49:~# ip route show table all"),
            Some("ip route show table all")
        );
        assert_eq!(
            prompt_command("[root@node-1 ~]# ipvsadm -Ln | grep -A3 10.12.115.101"),
            Some("ipvsadm -Ln | grep -A3 10.12.115.101")
        );
        assert_eq!(
            prompt_command("ec2-user@node ~ $ sudo iptables-save"),
            Some("sudo iptables-save")
        );
        assert_eq!(prompt_command("$ ip rule"), Some("ip rule"));
        assert_eq!(
            prompt_command("# /usr/sbin/iptables-save -c"),
            Some("/usr/sbin/iptables-save -c")
        );
        assert_eq!(
            prompt_command("$ sudo -E ipset list"),
            Some("sudo -E ipset list")
        );
        assert_eq!(prompt_command("root@node:~# "), Some(""));
        assert_eq!(
            prompt_command("ip route show table local"),
            Some("ip route show table local")
        );
        assert_eq!(prompt_command("iptables-save"), Some("iptables-save"));
        assert_eq!(prompt_command("net.ipv4.ip_forward = 1"), None);
        assert_eq!(prompt_command("local 10.0.0.5 dev ens4 proto kernel"), None);
        assert_eq!(prompt_command("Name: KUBE-CLUSTER-IP"), None);
        // Not prompts: iptables-save's comments, ip's interface lines, data with `@` or `#`.
        assert_eq!(
            prompt_command("# Generated by iptables-save v1.4.21 on Mon Jan  8 10:00:00 2018"),
            None
        );
        assert_eq!(
            prompt_command("# Completed on Mon Jan  8 10:00:00 2018"),
            None
        );
        assert_eq!(
            prompt_command("3: eth0@if7: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9001"),
            None
        );
        assert_eq!(
            prompt_command("-A KUBE-SEP-X -m comment --comment \"a@b # c\" -j DNAT"),
            None
        );
        assert_eq!(
            prompt_command(
                "# Warning: iptables-legacy tables present, use iptables-legacy-save to see them"
            ),
            None
        );
    }

    #[test]
    fn crlf_separators_and_a_cut_last_line() {
        let p = lines("$ ip rule\r\n0:\tfrom all lookup local\r\n--\r\n32766:\tfrom all lookup main\r\n32767:\tfrom all lookup def");
        assert!(p.crlf);
        assert!(p.grep_cut);
        assert_eq!(p.commands, ["ip rule"]);
        let data: Vec<_> = p.data().map(|l| (l.no, l.text)).collect();
        assert_eq!(
            data,
            [
                (2, "0:\tfrom all lookup local"),
                (4, "32766:\tfrom all lookup main"),
                (5, "32767:\tfrom all lookup def")
            ]
        );
        assert_eq!(p.unterminated_line(), Some(5));
        assert_eq!(lines("a\nb\n").unterminated_line(), None);
    }
}
