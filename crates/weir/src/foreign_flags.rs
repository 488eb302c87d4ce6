//! The flags (and fields) of the tools weir replaces — kube-proxy for `weir proxy`
//! (`proxy_cmd::kube_proxy`), flanneld for `weir routes` (`routes_cmd::flanneld`) — each in one
//! list of [`Row`]s saying what weir does with it. The flags weir has no flag of its own for
//! are added to the command from the list ([`OnlyFlags`]), hidden from `--help`, so nothing
//! the replaced tool accepts is an "unexpected argument": each is applied, accepted with a
//! notice, or refused by name with what weir offers instead.

use std::fmt;
use std::marker::PhantomData;

use clap::{Arg, ArgAction, ArgMatches, Args, Command, FromArgMatches};

/// What a row names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Command-line flags (`--…`, `-v`) and/or configuration field paths (`iptables.syncPeriod`).
    Option,
    /// A `--feature-gates` / `featureGates` name.
    Gate,
    /// A field of an object the tool reads (Service, EndpointSlice, Node) or a kind it watches.
    Api,
    /// A metric the tool exports.
    Metric,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// weir does what the tool does with it (`tests` show it).
    Same,
    /// Accepted; `text` says how weir differs, or that it has no effect. A notice names it.
    Differs,
    /// Refused: `text` says why and what weir offers instead.
    Refused,
}

#[derive(Debug, Clone, Copy)]
pub struct Row {
    pub kind: Kind,
    /// Flags (with their dashes) and field paths; or a gate's, an API field's, a metric's name.
    pub names: &'static [&'static str],
    /// For values other than `harmless`.
    pub class: Class,
    /// Same: what weir does. Differs: how (a notice quotes it). Refused: why, and what instead.
    pub text: &'static str,
    /// Tests that show the behaviour (required for `Same`; the docs' table names them, which
    /// its test checks).
    #[cfg_attr(not(test), allow(dead_code))]
    pub tests: &'static [&'static str],
    /// Values that ask for what weir does anyway, accepted silently (a flag's value as written,
    /// a field's as YAML reads it: `false`, `14`, `""`).
    pub harmless: &'static [&'static str],
    /// A boolean flag (pflag's and Go flag's): `--flag` alone means `=true`, a value needs `=`.
    pub boolean: bool,
    /// weir's own code takes it (a typed flag, an alias, a field the loader reads); otherwise
    /// the flag is added by [`OnlyFlags`] and the value only noticed or refused.
    pub applied: bool,
}

pub const fn row(
    kind: Kind,
    names: &'static [&'static str],
    class: Class,
    text: &'static str,
) -> Row {
    Row {
        kind,
        names,
        class,
        text,
        tests: &[],
        harmless: &[],
        boolean: false,
        applied: false,
    }
}

/// An option applied by weir with the tool's meaning.
pub const fn same(names: &'static [&'static str], text: &'static str) -> Row {
    row(Kind::Option, names, Class::Same, text).applied()
}

pub const fn differs(names: &'static [&'static str], text: &'static str) -> Row {
    row(Kind::Option, names, Class::Differs, text)
}

pub const fn refused(names: &'static [&'static str], text: &'static str) -> Row {
    row(Kind::Option, names, Class::Refused, text)
}

impl Row {
    pub const fn tests(self, tests: &'static [&'static str]) -> Row {
        Row { tests, ..self }
    }
    pub const fn harmless(self, harmless: &'static [&'static str]) -> Row {
        Row { harmless, ..self }
    }
    pub const fn boolean(self) -> Row {
        Row {
            boolean: true,
            ..self
        }
    }
    pub const fn applied(self) -> Row {
        Row {
            applied: true,
            ..self
        }
    }

    pub fn flags(&self) -> impl Iterator<Item = &'static str> + '_ {
        let option = self.kind == Kind::Option;
        self.names
            .iter()
            .copied()
            .filter(move |n| option && n.starts_with('-'))
    }

    /// What weir does with `value` given as `name`: nothing to say, a notice, or a refusal.
    /// Applied rows are handled by the code that applies them: nothing to say here.
    pub fn judge(&self, name: &str, value: &str) -> Verdict {
        if self.applied || self.harmless.contains(&value) {
            return Verdict::Silent;
        }
        let given = if value.is_empty() && !name.starts_with('-') {
            name.to_string()
        } else {
            format!("{name}={value}")
        };
        match self.class {
            Class::Same => Verdict::Silent,
            Class::Differs => Verdict::Notice(format!("{given}: accepted; {}", self.text)),
            Class::Refused => Verdict::Refused(format!("{given}: refused: {}", self.text)),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Silent,
    Notice(String),
    Refused(String),
}

/// The row of `rows` holding `name` (a flag with its dashes, a field path, a gate's name) of
/// `kind`.
pub fn find_in(rows: &'static [Row], kind: Kind, name: &str) -> Option<&'static Row> {
    rows.iter()
        .find(|r| r.kind == kind && r.names.contains(&name))
}

/// The error of a refused flag, field or gate value: the process exits with 2, as for a
/// usage error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub Vec<String>);

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.join("\n"))
    }
}

impl std::error::Error for Refused {}

/// What checking the flags (and a configuration file) found: notices to log (or print),
/// refusals.
#[derive(Debug, Default)]
pub struct Findings {
    pub notices: Vec<String>,
    pub refused: Vec<String>,
    /// Field paths that are not the file format's (nor weir's own): errors.
    pub unknown: Vec<String>,
}

impl Findings {
    pub fn add(&mut self, v: Verdict) {
        match v {
            Verdict::Silent => {}
            Verdict::Notice(n) => self.notices.push(n),
            Verdict::Refused(r) => self.refused.push(r),
        }
    }
}

/// A replaced tool's list of rows.
pub trait Table {
    fn rows() -> &'static [Row];
}

/// The rows' flags that weir has no flag of its own for.
fn only_flags<T: Table>() -> impl Iterator<Item = (&'static Row, &'static str)> {
    T::rows()
        .iter()
        .filter(|r| !r.applied)
        .flat_map(|r| r.flags().map(move |f| (r, f)))
}

/// The flags of `T` that weir has no flag of its own for, as given (flag, value), in order.
/// Added to the command from `T`'s rows, hidden from `--help`; pflag's and Go flag's syntax:
/// a boolean takes `--flag` or `--flag=VALUE`, another flag `--flag VALUE` or
/// `--flag=VALUE`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OnlyFlags<T> {
    pub given: Vec<(&'static str, String)>,
    table: PhantomData<T>,
}

impl<T: Table> OnlyFlags<T> {
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn new(given: Vec<(&'static str, String)>) -> Self {
        Self {
            given,
            table: PhantomData,
        }
    }

    /// The notice or refusal of each given flag.
    pub fn check(&self, out: &mut Findings) {
        for (flag, value) in &self.given {
            if let Some(row) = find_in(T::rows(), Kind::Option, flag) {
                let value = match row.boolean {
                    true => parse_go_bool(value).map_or(value.clone(), |b| b.to_string()),
                    false => value.clone(),
                };
                out.add(row.judge(flag, &value));
            }
        }
    }
}

pub fn arg_id(flag: &str) -> &str {
    flag.trim_start_matches('-')
}

impl<T: Table> FromArgMatches for OnlyFlags<T> {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let mut given: Vec<(usize, &'static str, String)> = Vec::new();
        for (_, flag) in only_flags::<T>() {
            let id = arg_id(flag);
            if let (Some(values), Some(indices)) = (m.get_many::<String>(id), m.indices_of(id)) {
                given.extend(indices.zip(values).map(|(i, v)| (i, flag, v.clone())));
            }
        }
        given.sort_by_key(|(i, ..)| *i);
        Ok(Self::new(
            given.into_iter().map(|(_, f, v)| (f, v)).collect(),
        ))
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl<T: Table> Args for OnlyFlags<T> {
    fn augment_args(mut cmd: Command) -> Command {
        for (row, flag) in only_flags::<T>() {
            let id = arg_id(flag);
            let mut arg = Arg::new(id)
                .long(id)
                .hide(true)
                .action(ArgAction::Append)
                .value_name("VALUE")
                .allow_hyphen_values(true);
            arg = match row.boolean {
                true => arg
                    .num_args(0..=1)
                    .require_equals(true)
                    .default_missing_value("true"),
                false => arg.num_args(1),
            };
            cmd = cmd.arg(arg);
        }
        cmd
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

/// Go's `strconv.ParseBool`, which pflag's and Go flag's boolean flags use.
pub fn parse_go_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!("{s:?} is not a boolean (true or false)")),
    }
}

/// What the docs' tables and their tests share.
#[cfg(test)]
pub mod doc_table {
    use super::{Class, Kind, Row};

    fn word(c: Class) -> &'static str {
        match c {
            Class::Same => "same",
            Class::Differs => "differs",
            Class::Refused => "refused",
        }
    }

    /// A row as its docs table's line: `| kind | names | class | text. Tests: … |`.
    pub fn line(r: &Row) -> String {
        let kind = match r.kind {
            Kind::Option => match (
                r.flags().next().is_some(),
                r.names.iter().any(|n| !n.starts_with('-')),
            ) {
                (true, true) => "flag, field",
                (true, false) => "flag",
                _ => "field",
            },
            Kind::Gate => "gate",
            Kind::Api => "API",
            Kind::Metric => "metric",
        };
        let quoted = |v: &[&str]| {
            v.iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut text = r.text.to_string();
        if !r.tests.is_empty() {
            text.push_str(&format!(". Tests: {}", quoted(r.tests)));
        }
        format!(
            "| {kind} | {} | {} | {text} |",
            quoted(r.names),
            word(r.class)
        )
    }

    /// Checks that section `heading` of `docs/<doc>` holds exactly `rows`' lines (on failure
    /// the expected table is printed, to paste under `header`), and that every test a row
    /// names is a function in the workspace.
    pub fn check(doc: &str, heading: &str, header: &str, rows: &[Row]) {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let text = std::fs::read_to_string(root.join("docs").join(doc)).unwrap();
        let section = text
            .split(&format!("\n## {heading}\n"))
            .nth(1)
            .unwrap_or_else(|| panic!("docs/{doc}: no section {heading:?}"))
            .split("\n## ")
            .next()
            .unwrap();
        let in_doc: Vec<&str> = section
            .lines()
            .filter(|l| l.starts_with("| ") && !l.starts_with("| kind |"))
            .collect();
        let expected: Vec<String> = rows.iter().map(line).collect();
        if in_doc != expected {
            panic!(
                "docs/{doc}'s table differs from the rows; expected:\n{header}\n|---|---|---|---|\n{}",
                expected.join("\n")
            );
        }
        let mut sources = String::new();
        fn read(dir: &std::path::Path, out: &mut String) {
            for e in std::fs::read_dir(dir).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() && !p.ends_with("target") {
                    read(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    out.push_str(&std::fs::read_to_string(&p).unwrap_or_default());
                }
            }
        }
        read(&root.join("crates"), &mut sources);
        for t in rows.iter().flat_map(|r| r.tests) {
            assert!(sources.contains(&format!("fn {t}(")), "no test fn {t}");
        }
    }

    /// Checks a list's rows: names unique, `Same` rows name a test, a row weir does not apply
    /// is not `Same` (it would be silent), a boolean's harmless values are booleans.
    pub fn well_formed(rows: &[Row]) {
        let mut names = std::collections::BTreeSet::new();
        for r in rows {
            assert!(!r.names.is_empty() && !r.text.is_empty(), "{r:?}");
            for n in r.names {
                assert!(names.insert((r.kind as u8, *n)), "{n} twice");
            }
            if r.class == Class::Same {
                assert!(
                    !r.tests.is_empty(),
                    "{:?}: same, but no test named",
                    r.names
                );
            }
            if !r.applied && r.kind == Kind::Option {
                assert_ne!(r.class, Class::Same, "{:?}", r.names);
            }
            if r.boolean {
                assert!(
                    r.harmless.iter().all(|h| *h == "true" || *h == "false"),
                    "{:?}",
                    r.names
                );
            }
        }
    }
}
