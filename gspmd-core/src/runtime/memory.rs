//! Memory limits: how many bytes of live values a device may hold while it runs a
//! program, and the default taken from the host's available memory.
//!
//! The evaluation loop (`interpreter::execute`) checks every value, with the scratch
//! its kernel holds while it runs, against the limit before allocating it, so a program too large for the host is an
//! [`Error::OutOfMemory`](crate::Error::OutOfMemory) with the user's source line, not an
//! aborted process.

/// The limit assumed when the host's available memory cannot be read (no
/// `/proc/meminfo`, as off Linux): 8 GiB.
pub const FALLBACK_MEMORY_LIMIT: usize = 8 << 30;

/// The memory the host can give a new allocation without swapping: `MemAvailable` of
/// `/proc/meminfo`, read at each call; [`FALLBACK_MEMORY_LIMIT`] if that is unreadable.
pub fn available_memory() -> usize {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| mem_available(&text))
        .unwrap_or(FALLBACK_MEMORY_LIMIT)
}

/// The `MemAvailable:` entry of a `/proc/meminfo` text, in bytes (the file gives kB).
fn mem_available(meminfo: &str) -> Option<usize> {
    let line = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemAvailable:"))?;
    let kib: usize = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_reads_kib() {
        let text =
            "MemTotal:       16314480 kB\nMemFree:         1000 kB\nMemAvailable:    2048 kB\n";
        assert_eq!(mem_available(text), Some(2048 * 1024));
        assert_eq!(mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(mem_available("MemAvailable: lots\n"), None);
    }

    #[test]
    fn available_memory_is_positive() {
        assert!(available_memory() > 0);
    }
}
