//! `weir version`: what `weir --version` says, as a subcommand (kubectl's habit), and as JSON
//! for scripts that check a node's build.

use std::process::ExitCode;

use clap::{Args, ValueEnum};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum VersionFormat {
    Text,
    Json,
}

#[derive(Args)]
pub struct VersionArgs {
    /// text: `weir VERSION (commit C)`; json: {"version", "commit", "line", "features"}.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = VersionFormat::Text)]
    output: VersionFormat,
}

/// The build's version line (`0.1.0 (commit abc)`) split into its version and commit.
fn parts(line: &str) -> (&str, Option<&str>) {
    match line.split_once(" (commit ") {
        Some((v, rest)) => (v, rest.strip_suffix(')')),
        None => (line, None),
    }
}

fn render(format: VersionFormat, line: &str) -> String {
    match format {
        VersionFormat::Text => format!("weir {line}"),
        VersionFormat::Json => {
            let (version, commit) = parts(line);
            let features: Vec<&str> = [cfg!(feature = "lab").then_some("lab")]
                .into_iter()
                .flatten()
                .collect();
            serde_json::json!({
                "version": version,
                "commit": commit,
                "line": line,
                "features": features,
            })
            .to_string()
        }
    }
}

pub fn run(args: VersionArgs) -> anyhow::Result<ExitCode> {
    outln!("{}", render(args.output, env!("WEIR_VERSION_LINE")));
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_json_name_the_version_and_commit() {
        assert_eq!(
            render(VersionFormat::Text, "0.1.0 (commit abc123)"),
            "weir 0.1.0 (commit abc123)"
        );
        let v: serde_json::Value =
            serde_json::from_str(&render(VersionFormat::Json, "0.1.0 (commit abc123)")).unwrap();
        assert_eq!(v["version"], "0.1.0");
        assert_eq!(v["commit"], "abc123");
        let v: serde_json::Value =
            serde_json::from_str(&render(VersionFormat::Json, "0.1.0")).unwrap();
        assert_eq!(
            (v["version"].as_str(), v["commit"].is_null()),
            (Some("0.1.0"), true)
        );
        // This binary's own line parses the same way.
        let (version, _) = parts(env!("WEIR_VERSION_LINE"));
        assert_eq!(version, env!("CARGO_PKG_VERSION"));
    }
}
