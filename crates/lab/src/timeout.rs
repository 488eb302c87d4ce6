//! How long the lab waits for what it starts, scaled for slow machines.

/// How long the lab waits for its agents and servers to start: `base` times
/// `WEIR_LAB_TIMEOUT_SCALE` (a whole number, default 1). Under software emulation (the qemu VM
/// of docs/vm.md, on a loaded machine) starting a process takes many times longer than here;
/// the VM tests set 8 rather than every constant growing for everyone.
pub fn startup_timeout(base: std::time::Duration) -> std::time::Duration {
    base * timeout_scale(std::env::var("WEIR_LAB_TIMEOUT_SCALE").ok().as_deref())
}

/// The factor of [`startup_timeout`]: a whole number from 1 to 20; anything else is 1.
fn timeout_scale(value: Option<&str>) -> u32 {
    value
        .and_then(|v| v.trim().parse().ok())
        .filter(|f| (1..=20).contains(f))
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    #[test]
    fn timeout_scale_is_a_small_whole_number_or_one() {
        use super::timeout_scale;
        assert_eq!(timeout_scale(None), 1);
        assert_eq!(timeout_scale(Some("4")), 4);
        assert_eq!(timeout_scale(Some(" 3\n")), 3);
        for bad in ["0", "-2", "1.5", "x", "", "21"] {
            assert_eq!(timeout_scale(Some(bad)), 1, "{bad:?}");
        }
    }
}
