//! Network sysctls of the calling thread's namespace (`/proc/sys/net` is resolved per netns at open).

use std::fs;
use std::io;
use std::path::PathBuf;

fn path(key: &str) -> PathBuf {
    PathBuf::from("/proc/sys").join(key.replace('.', "/"))
}

/// Reads a sysctl such as `net.ipv4.ip_forward`. Interface names with dots are not supported here.
pub fn read(key: &str) -> io::Result<String> {
    Ok(fs::read_to_string(path(key))?.trim().to_string())
}

/// Writes a sysctl, skipping the write when the value is already set.
pub fn ensure(key: &str, value: &str) -> io::Result<()> {
    if read(key)? == value {
        return Ok(());
    }
    fs::write(path(key), value)
}
