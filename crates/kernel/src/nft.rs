//! `nft -f -`: one nftables script applied as one transaction by the `nft` command.
//!
//! The proxy's nftables mode, the CNI plugin's masquerade and eni-shared tables and
//! `weir dns --node-local` each write a whole script at once; nft reads all of it before it
//! commits, so a rejected script changes nothing.

use std::io::{self, Write};
use std::process::{Command, Stdio};

/// Why a script was not applied.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    /// `nft` could not be started (not installed, not executable).
    #[error("cannot run nft: {0}")]
    Spawn(#[source] io::Error),
    /// The script could not be handed to `nft`, or its exit not collected.
    #[error("talking to nft: {0}")]
    Io(#[source] io::Error),
    /// `nft` refused the script (nothing of it was applied): its error output, trimmed.
    #[error("nft: {0}")]
    Rejected(String),
}

/// Applies `script` with `nft -f -`.
pub fn apply(script: &str) -> Result<(), NftError> {
    apply_with(Command::new("nft"), script)
}

/// Applies `script` with `nft` as `command` starts it (a prefix such as `ip netns exec NS nft`
/// for a test, or another binary), adding `-f -`.
pub fn apply_with(mut command: Command, script: &str) -> Result<(), NftError> {
    let mut child = command
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(NftError::Spawn)?;
    let mut stdin = child.stdin.take().expect("stdin is piped");
    // Written from a thread: nft may report an error (stderr) before it has read a large
    // script, and a full stderr pipe must not wait on a full stdin pipe.
    let (out, written) = std::thread::scope(|s| {
        let writer = s.spawn(move || stdin.write_all(script.as_bytes()));
        let out = child.wait_with_output();
        (out, writer.join())
    });
    let out = out.map_err(NftError::Io)?;
    if !out.status.success() {
        // A write cut short by nft exiting is part of this: its stderr says why.
        return Err(NftError::Rejected(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    match written {
        Ok(Ok(())) => Ok(()),
        // nft succeeded without the whole script (it cannot: it reads to the end before it
        // commits); an error all the same, so a caller never takes a part for the whole.
        Ok(Err(e)) => Err(NftError::Io(e)),
        Err(_) => Err(NftError::Io(io::Error::other("the nft writer panicked"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for nft: `sh -c SCRIPT` reading what `-f -` hands it on stdin.
    fn fake(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script, "fake-nft"]);
        c
    }

    #[test]
    fn the_whole_script_reaches_stdin_and_success_is_ok() {
        let dir = std::env::temp_dir().join(format!("weir-kernel-nft-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let copy = dir.join("stdin");
        // `$1 $2` are `-f -`: the runner's own arguments come after the command's.
        let cmd = fake(&format!(
            "test \"$1 $2\" = '-f -' && cat > {}",
            copy.display()
        ));
        // Larger than a pipe's buffer, so the writer and the reader overlap.
        let script: String = (0..20_000)
            .map(|i| format!("add element inet t s {{ {i} }}\n"))
            .collect();
        apply_with(cmd, &script).unwrap();
        assert_eq!(std::fs::read_to_string(&copy).unwrap(), script);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_refusal_carries_nfts_error_output_trimmed() {
        // Exits before reading a large script, as nft does on a syntax error it reports
        // early: the runner must not block on the unread stdin.
        let cmd = fake("echo 'Error: syntax error, unexpected junk' >&2; exit 1");
        let script = "junk\n".repeat(100_000);
        match apply_with(cmd, &script) {
            Err(NftError::Rejected(m)) => assert_eq!(m, "Error: syntax error, unexpected junk"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_missing_binary_is_a_spawn_error() {
        let cmd = Command::new("/nonexistent/weir-no-such-nft");
        let e = apply_with(cmd, "flush ruleset\n").unwrap_err();
        assert!(matches!(e, NftError::Spawn(_)), "{e:?}");
        assert!(e.to_string().starts_with("cannot run nft: "), "{e}");
    }
}
