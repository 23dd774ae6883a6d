//! What the kernel says of this process's memory, for the examples that report it.

/// A line of /proc/self/status (`VmRSS:`, `VmHWM:`) in bytes; 0 if it cannot be read.
pub fn status_bytes(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}
