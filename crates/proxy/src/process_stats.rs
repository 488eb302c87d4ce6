//! This process's own resource use, read from `/proc/self` (the values of Prometheus's
//! standard `process_*` metrics).

use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessStats {
    pub resident_memory_bytes: u64,
    pub virtual_memory_bytes: u64,
    /// User plus system CPU time.
    pub cpu_seconds: f64,
    pub open_fds: u64,
    /// Seconds since the Unix epoch.
    pub start_time_seconds: f64,
}

/// Fields of `/proc/self/stat` after the command name (which may contain spaces), so that
/// index 0 is field 3 (`state`) of proc(5).
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let after = stat.rsplit_once(')')?.1;
    Some(after.split_whitespace().collect())
}

fn boot_time_seconds() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

impl ProcessStats {
    pub fn read() -> Option<ProcessStats> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let f = stat_fields(&stat)?;
        let num = |i: usize| f.get(i)?.parse::<u64>().ok();
        // SAFETY: sysconf only reads configuration values.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        let ticks = (ticks > 0).then_some(ticks as f64)?;
        // proc(5): utime 14, stime 15, starttime 22, vsize 23, rss 24 (1-based).
        let (utime, stime, start, vsize, rss) = (num(11)?, num(12)?, num(19)?, num(20)?, num(21)?);
        let open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
        let start_time_seconds = match boot_time_seconds() {
            Some(boot) => boot as f64 + start as f64 / ticks,
            None => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        };
        Some(ProcessStats {
            resident_memory_bytes: rss * page.max(0) as u64,
            virtual_memory_bytes: vsize,
            cpu_seconds: (utime + stime) as f64 / ticks,
            open_fds,
            start_time_seconds,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_plausible_values_for_this_process() {
        let s = ProcessStats::read().expect("/proc/self");
        assert!(s.resident_memory_bytes > 1 << 20, "{s:?}");
        assert!(s.virtual_memory_bytes >= s.resident_memory_bytes);
        let f = std::fs::File::open("/proc/self/stat").unwrap();
        let with_one_more = ProcessStats::read().unwrap().open_fds;
        drop(f);
        assert!(
            with_one_more >= 4,
            "stdin/out/err and the file: {with_one_more}"
        );
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(s.start_time_seconds <= now + 1.0 && s.start_time_seconds > now - 86_400.0);
        assert_eq!(stat_fields("1 (a b) S 0").unwrap(), ["S", "0"]);
    }
}
