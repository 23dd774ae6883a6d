//! Sizes, rates and durations on the command line, in the config file and in API requests,
//! parsed and shown the same way by the CLI, the server and the reclaim agent.
//!
//! Units follow util-linux (`fstrim --minimum`, `lsblk`): `K`, `M`, `G`, `T` and `KiB`..`TiB`
//! are powers of 1024; `KB`, `MB`, `GB`, `TB` are powers of 1000. Rates are sizes per second
//! (`500MB/s`, `1GiB/s`), as ESXi states its reclaim rates in MB/s.

/// Parses a size such as `4096`, `4K`, `64KiB`, `1.5GiB` or `500MB`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!(
            "'{s}' is not a size (e.g. 4096, 64KiB, 1GiB, 500MB)"
        ));
    }
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "k" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "T" | "TiB" => 1 << 40,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "unknown unit '{other}' in '{s}' (use K, M, G, T, KiB.., KB..)"
            ))
        }
    };
    let value = if num.contains('.') {
        let f: f64 = num.parse().map_err(|_| format!("'{s}' is not a size"))?;
        let v = f * mult as f64;
        if !v.is_finite() || v >= u64::MAX as f64 {
            return Err(format!("'{s}' is too large"));
        }
        v.round() as u64
    } else {
        let n: u64 = num.parse().map_err(|_| format!("'{s}' is not a size"))?;
        n.checked_mul(mult)
            .ok_or_else(|| format!("'{s}' is too large"))?
    };
    Ok(value)
}

/// Parses a rate in bytes per second: `500MB/s`, `1GiB/s`, `25M` (the `/s` is optional).
/// `0` is refused: an unlimited pass is asked for with `--rate unlimited`.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t
        .strip_suffix("/s")
        .or_else(|| t.strip_suffix("ps"))
        .unwrap_or(t);
    let v = parse_size(t).map_err(|e| format!("{e}; rates look like 500MB/s or 1GiB/s"))?;
    if v == 0 {
        return Err(format!("rate '{s}' must be positive (or 'unlimited')"));
    }
    Ok(v)
}

/// Parses a duration: `30s`, `5m`, `1h`, `1d`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a duration (e.g. 30s, 5m, 1h)"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" | "min" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        "d" => n.saturating_mul(86_400),
        _ => return Err(format!("unknown duration unit in '{s}' (use s, m, h, d)")),
    };
    if secs == 0 {
        return Err(format!("duration '{s}' must be positive"));
    }
    Ok(std::time::Duration::from_secs(secs))
}

/// Binary-prefixed size for humans: `487.2 MiB`.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

/// Decimal rate for humans, as ESXi states rates: `25.0 MB/s`.
pub fn human_rate(bytes_per_second: f64) -> String {
    if !bytes_per_second.is_finite() {
        return "unbounded".into();
    }
    let mb = bytes_per_second / 1e6;
    if mb >= 1000.0 {
        format!("{:.2} GB/s", mb / 1000.0)
    } else {
        format!("{mb:.1} MB/s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("64KiB").unwrap(), 65536);
        assert_eq!(parse_size("128MiB").unwrap(), 128 << 20);
        assert_eq!(parse_size("400GB").unwrap(), 400_000_000_000);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size(" 2 T ").unwrap(), 2 << 40);
        for bad in [
            "",
            "MiB",
            "12XB",
            "1.2.3G",
            "99999999999999999999",
            "20000000T",
        ] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rates_and_durations() {
        assert_eq!(parse_rate("500MB/s").unwrap(), 500_000_000);
        assert_eq!(parse_rate("1GiB/s").unwrap(), 1 << 30);
        assert_eq!(parse_rate("25M").unwrap(), 25 << 20);
        assert_eq!(parse_rate("100MBps").unwrap(), 100_000_000);
        assert!(parse_rate("0MB/s").is_err());
        assert!(parse_rate("fast").is_err());
        assert_eq!(parse_duration("90").unwrap().as_secs(), 90);
        assert_eq!(parse_duration("5m").unwrap().as_secs(), 300);
        assert_eq!(parse_duration("2h").unwrap().as_secs(), 7200);
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5 weeks").is_err());
    }

    #[test]
    fn humans() {
        assert_eq!(human_bytes(510_849_024), "487.2 MiB");
        assert_eq!(human_bytes(12), "12 B");
        assert_eq!(human_rate(25e6), "25.0 MB/s");
        assert_eq!(human_rate(1.5e9), "1.50 GB/s");
        assert_eq!(human_rate(f64::INFINITY), "unbounded");
    }
}
