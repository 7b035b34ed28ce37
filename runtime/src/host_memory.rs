//! What the machine's memory allows, asked before a run allocates its model: Linux's
//! `MemAvailable` (/proc/meminfo: the kernel's estimate of what can be allocated without
//! swapping, page cache it can drop included). Elsewhere nothing is known and nothing is checked.

/// Bytes available for new allocations, if the system says.
pub fn available() -> Option<u64> {
    parse(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// `MemAvailable` of a /proc/meminfo text, in bytes.
fn parse(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut words = line.split_whitespace().skip(1);
    let kib: u64 = words.next()?.parse().ok()?;
    (words.next()? == "kB").then_some(kib.checked_mul(1024)?)
}

/// `bytes` in GiB.
pub fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_is_read_in_bytes() {
        let text = "MemTotal:       24576000 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(parse(text), Some(20_000_000 * 1024));
        assert_eq!(parse("MemTotal: 1 kB\n"), None);
        assert_eq!(parse("MemAvailable: lots\n"), None);
        assert_eq!(parse("MemAvailable: 12 MB\n"), None);
        assert_eq!(gib(3 << 30), 3.0);
    }

    #[test]
    fn this_machine_says_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(available().is_some_and(|b| b > 0));
        }
    }
}
