//! What the generated and fuzzed tests share: a reproducible random generator, and nft
//! listings of a ruleset loaded into a scratch network namespace.

use std::process::Command;

/// xorshift64*: reproducible (a failure message names its seed).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n`; 0 when `n` is 0.
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }

    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

/// The separator `listings` puts between the outputs of its commands.
const SPLIT: &str = "@@weir-nft-split@@";

/// `script` loaded with `nft -f -` into a fresh network namespace (`unshare --net`: gone when
/// the command ends, nothing outside it changes) after `setup` (e.g. `iptables-nft` commands),
/// then each of `listings` (`nft -j list ruleset`, …) run there: their outputs in order.
/// Panics with nft's message when the ruleset is refused.
pub fn listings(setup: &str, script: &str, listings: &[&str]) -> Vec<String> {
    let cmd = format!(
        "{setup}\nnft -f -\n{}",
        listings.join(&format!("\necho {SPLIT}\n"))
    );
    let out = weir_testkit::output_with_input(
        Command::new("unshare").args(["--net", "sh", "-ec", &cmd]),
        script.as_bytes(),
    )
    .expect("unshare runs");
    assert!(
        out.status.success(),
        "nft refused the ruleset: {}\n{script}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all = String::from_utf8(out.stdout).unwrap();
    let parts: Vec<String> = all
        .split(&format!("{SPLIT}\n"))
        .map(str::to_string)
        .collect();
    assert_eq!(parts.len(), listings.len(), "{all}");
    parts
}
