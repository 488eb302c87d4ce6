//! Running `iptables`, `iptables-restore`, `iptables-save` (or their `ip6tables` twins, or
//! the `-nft` / `-legacy` programs by name). The children inherit the calling thread's network
//! namespace, which is how the backend acts on "the namespace of the calling thread".
//!
//! [`Tool`] is one family's set of programs of one [`Flavor`]; the free functions drive the
//! system's `iptables…` (whatever the alternatives system points it at), which is what the
//! ipvs mode uses.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};
use std::process::{Command, Output, Stdio};

use weir_model::IpFamily;

use super::restore::Table;
use crate::backend::{Error, Result};

/// Which iptables programs run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Flavor {
    /// `iptables`, `iptables-restore`, …: whichever implementation the host links them to.
    #[default]
    System,
    /// `iptables-nft`, `iptables-nft-restore`, …: the nf_tables back end by name.
    Nft,
    /// `iptables-legacy`, `iptables-legacy-restore`, …: the x_tables back end by name.
    Legacy,
}

impl Flavor {
    pub fn name(self) -> &'static str {
        match self {
            Flavor::System => "system",
            Flavor::Nft => "nft",
            Flavor::Legacy => "legacy",
        }
    }
}

/// `iptables…` for IPv4, `ip6tables…` for IPv6.
pub fn binary(family: IpFamily, base: &str) -> String {
    match family {
        IpFamily::V4 => base.to_string(),
        IpFamily::V6 => base.replacen("iptables", "ip6tables", 1),
    }
}

/// One family's iptables programs of one flavor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tool {
    pub family: IpFamily,
    pub flavor: Flavor,
}

impl Tool {
    /// The system's programs for `family`.
    pub fn system(family: IpFamily) -> Tool {
        Tool {
            family,
            flavor: Flavor::System,
        }
    }

    /// The program for `base` (`iptables`, `iptables-restore`, `iptables-save`):
    /// `ip6tables-nft-restore` for IPv6, nft flavor, restore.
    pub fn program(self, base: &str) -> String {
        let named = match self.flavor {
            Flavor::System => base.to_string(),
            Flavor::Nft => base.replacen("iptables", "iptables-nft", 1),
            Flavor::Legacy => base.replacen("iptables", "iptables-legacy", 1),
        };
        binary(self.family, &named)
    }
}

fn run(bin: &str, args: &[&str], stdin: Option<&str>) -> io::Result<Output> {
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn()?;
    if let Some(input) = stdin {
        // Dropped at the end of the statement: the tool sees EOF.
        child
            .stdin
            .take()
            .expect("stdin is piped")
            .write_all(input.as_bytes())?;
    }
    child.wait_with_output()
}

fn tool_error(bin: &str, out: &Output) -> Error {
    Error::Tool {
        tool: bin.to_string(),
        detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    }
}

impl Tool {
    /// Feeds `script` to `iptables-restore --noflush` (counters are not restored: the
    /// `[0:0]` on chain lines is only syntax). `-w` waits for the xtables lock that the legacy
    /// backend uses; iptables-nft ignores it.
    pub fn restore(self, script: &str) -> Result<()> {
        let bin = self.program("iptables-restore");
        let out = run(&bin, &["-w", "--noflush"], Some(script))?;
        if out.status.success() {
            return Ok(());
        }
        let mut e = tool_error(&bin, &out);
        // "iptables-restore: line 12 failed": quote that line, the message alone is cryptic.
        if let Error::Tool { detail, .. } = &mut e {
            if let Some(n) = failed_line(detail) {
                if let Some(line) = script.lines().nth(n.saturating_sub(1)) {
                    detail.push_str(&format!(" (line {n}: {line})"));
                }
            }
        }
        Err(e)
    }

    /// `iptables-save [-t table]`.
    pub fn save(self, table: Option<Table>) -> Result<String> {
        let bin = self.program("iptables-save");
        let mut args = Vec::new();
        if let Some(t) = table {
            args.extend(["-t", t.name()]);
        }
        let out = run(&bin, &args, None)?;
        if !out.status.success() {
            return Err(tool_error(&bin, &out));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `iptables -t table <op> chain args…`; `Ok(true)` on success, `Ok(false)` when
    /// iptables answered with exit status 1 (no such rule / chain), `Err` otherwise.
    fn rule_op(self, table: Table, op: &str, chain: &str, args: &[&str]) -> Result<bool> {
        let bin = self.program("iptables");
        let mut all = vec!["-w", "-t", table.name(), op, chain];
        if op == "-I" {
            all.push("1");
        }
        all.extend_from_slice(args);
        let out = run(&bin, &all, None)?;
        match out.status.code() {
            Some(0) => Ok(true),
            Some(1) => Ok(false),
            _ => Err(tool_error(&bin, &out)),
        }
    }

    /// Whether the rule exists (`iptables -C`: compares the rule's meaning, not its spelling).
    pub fn has_rule(self, table: Table, chain: &str, args: &[&str]) -> Result<bool> {
        self.rule_op(table, "-C", chain, args)
    }

    /// Inserts the rule at the head of `chain`.
    pub fn insert_rule(self, table: Table, chain: &str, args: &[&str]) -> Result<()> {
        if self.rule_op(table, "-I", chain, args)? {
            Ok(())
        } else {
            Err(Error::Tool {
                tool: self.program("iptables"),
                detail: format!("cannot insert into {chain}: {}", args.join(" ")),
            })
        }
    }

    /// Deletes one copy of the rule; `false` when there was none (or its target is gone).
    pub fn delete_rule(self, table: Table, chain: &str, args: &[&str]) -> bool {
        // Exit status 2 ("Couldn't load target") also means: nothing to delete.
        matches!(self.rule_op(table, "-D", chain, args), Ok(true))
    }

    /// `iptables -t table -S chain [rulenum]`: the chain's rules (or rule `rulenum`,
    /// 1-based) in save syntax; `None` if the chain (or that rule) does not exist.
    pub fn list_chain(
        self,
        table: Table,
        chain: &str,
        rulenum: Option<usize>,
    ) -> Result<Option<String>> {
        let bin = self.program("iptables");
        let n = rulenum.map(|n| n.to_string());
        let mut args = vec!["-w", "-t", table.name(), "-S", chain];
        args.extend(n.as_deref());
        let out = run(&bin, &args, None)?;
        match out.status.code() {
            Some(0) => {
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                // A rule number past the end prints nothing and succeeds (iptables 1.8.9).
                let missing_rule = rulenum.is_some() && !text.lines().any(|l| l.starts_with("-A "));
                Ok((!missing_rule).then_some(text))
            }
            Some(1) => Ok(None),
            _ => Err(tool_error(&bin, &out)),
        }
    }

    /// Creates `chain` unless it exists.
    pub fn ensure_chain(self, table: Table, chain: &str) -> Result<()> {
        self.rule_op(table, "-N", chain, &[]).map(|_| ())
    }

    /// Whether the programs can be started at all (cleanup on a host without them has
    /// nothing to do).
    pub fn available(self) -> bool {
        run(&self.program("iptables-save"), &["--version"], None).is_ok()
    }

    /// Whether these programs are iptables-nft (`iptables v1.8.9 (nf_tables)`) rather than
    /// iptables-legacy (`… (legacy)`): the two want differently shaped restore input.
    pub fn is_nf_tables(self) -> Result<bool> {
        match self.flavor {
            Flavor::Nft => return Ok(true),
            Flavor::Legacy => return Ok(false),
            Flavor::System => {}
        }
        let bin = self.program("iptables");
        let out = run(&bin, &["--version"], None)?;
        if !out.status.success() {
            return Err(tool_error(&bin, &out));
        }
        Ok(String::from_utf8_lossy(&out.stdout).contains("nf_tables"))
    }

    /// The nat table's chains. With iptables-nft they are read with `nft list chains`
    /// (chain names only: 0.1 s of CPU at 2,000 services, where `iptables-save -t nat`
    /// decodes every rule back into iptables syntax); with legacy, or without `nft`, from
    /// `iptables-save`.
    pub fn nat_chains(self, nf_tables: bool) -> Result<BTreeSet<String>> {
        if nf_tables {
            let fam = match self.family {
                IpFamily::V4 => "ip",
                IpFamily::V6 => "ip6",
            };
            if let Ok(out) = run("nft", &["list", "chains", fam], None) {
                if out.status.success() {
                    return Ok(chains_in_nft_listing(
                        &String::from_utf8_lossy(&out.stdout),
                        "nat",
                    ));
                }
            }
        }
        let saved = self.save(Some(Table::Nat))?;
        Ok(chains_in_save(&saved)
            .remove(Table::Nat.name())
            .unwrap_or_default())
    }
}

fn failed_line(stderr: &str) -> Option<usize> {
    let rest = &stderr[stderr.find("line ")? + 5..];
    rest.split_whitespace().next()?.parse().ok()
}

/// The chains of each table in `iptables-save` output (the `:NAME POLICY [p:b]` lines).
pub fn chains_in_save(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut table = None;
    for line in text.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = Some(t.trim().to_string());
        } else if let (Some(t), Some(rest)) = (&table, line.strip_prefix(':')) {
            if let Some(name) = rest.split_whitespace().next() {
                out.entry(t.clone()).or_default().insert(name.to_string());
            }
        }
    }
    out
}

// The system's programs (what the ipvs mode drives).

/// [`Tool::restore`] with the system's programs.
pub fn restore(family: IpFamily, script: &str) -> Result<()> {
    Tool::system(family).restore(script)
}

/// [`Tool::save`] with the system's programs.
pub fn save(family: IpFamily, table: Option<Table>) -> Result<String> {
    Tool::system(family).save(table)
}

/// [`Tool::delete_rule`] with the system's programs.
pub fn delete_rule(family: IpFamily, table: Table, chain: &str, args: &[&str]) -> bool {
    Tool::system(family).delete_rule(table, chain, args)
}

/// [`Tool::list_chain`] with the system's programs.
pub fn list_chain(
    family: IpFamily,
    table: Table,
    chain: &str,
    rulenum: Option<usize>,
) -> Result<Option<String>> {
    Tool::system(family).list_chain(table, chain, rulenum)
}

/// [`Tool::available`] with the system's programs.
pub fn available(family: IpFamily) -> bool {
    Tool::system(family).available()
}

/// The chains of table `table` in `nft list chains <family>` output:
/// `table ip nat {` … `\tchain KUBE-SERVICES {` … `}`.
pub fn chains_in_nft_listing(text: &str, table: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut inside = false;
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["table", _, name, "{"] => inside = *name == table,
            ["chain", name, "{"] if inside => {
                out.insert(name.trim_matches('"').to_string());
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nft_chain_listing_is_read_per_table() {
        let text = "table ip filter {\n\tchain KUBE-SERVICES {\n\t}\n}\n\
                    table ip nat {\n\tchain PREROUTING {\n\t\ttype nat hook prerouting \
                    priority dstnat; policy accept;\n\t}\n\tchain KUBE-SEP-ABC {\n\t}\n}\n";
        let got = chains_in_nft_listing(text, "nat");
        assert_eq!(
            got,
            BTreeSet::from(["PREROUTING".to_string(), "KUBE-SEP-ABC".to_string()])
        );
        assert_eq!(chains_in_nft_listing(text, "mangle"), BTreeSet::new());
    }
}
