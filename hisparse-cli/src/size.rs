//! Byte sizes on the command line: `80GiB`, `512GB`, `1024MiB`, `1.5GiB`, `4096` (plain bytes).
//!
//! Binary units (`KiB`, `MiB`, `GiB`, `TiB`, and the short `K`, `M`, `G`, `T`) are powers of 1024;
//! decimal units (`KB`, `MB`, `GB`, `TB`) are powers of 1000. Units are case-insensitive and may be
//! separated from the number by spaces. Fractions are allowed and rounded down to whole bytes.

/// Parses a byte size. The error says what was wrong and what is accepted.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let s = text.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let num: String = num.chars().filter(|&c| c != '_').collect();
    let unit = unit.trim().to_ascii_lowercase();
    let multiplier: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => {
            return Err(format!(
                "`{text}` has an unknown unit `{unit}`; use bytes or B, KiB, MiB, GiB, TiB, KB, MB, GB, TB"
            ));
        }
    };
    let bad = || format!("`{text}` is not a size; write e.g. 80GiB, 512GB, 1024MiB or plain bytes");
    let (int, frac) = match num.split_once('.') {
        Some((i, f)) => (i, f),
        None => (num.as_str(), ""),
    };
    if int.is_empty() && frac.is_empty() {
        return Err(bad());
    }
    if frac.contains('.') {
        return Err(bad());
    }
    let too_big = || format!("`{text}` is larger than 16 EiB");
    let int: u128 = if int.is_empty() {
        0
    } else {
        int.parse().map_err(|_| bad())?
    };
    let mut bytes = int.checked_mul(multiplier.into()).ok_or_else(too_big)?;
    if !frac.is_empty() {
        let digits = frac.len().min(18) as u32;
        let f: u128 = frac[..digits as usize].parse().map_err(|_| bad())?;
        bytes = bytes
            .checked_add(f * u128::from(multiplier) / 10u128.pow(digits))
            .ok_or_else(too_big)?;
    }
    u64::try_from(bytes).map_err(|_| too_big())
}

/// Formats bytes for people: `80.00 GiB`, `512.00 KiB`, `656 B` (the runtime's one rule).
pub use hisparse_runtime::plan::human_bytes as human;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_size("80GiB"), Ok(80 << 30));
        assert_eq!(parse_size("512GB"), Ok(512_000_000_000));
        assert_eq!(parse_size("1024MiB"), Ok(1 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1.5 gib"), Ok(3 << 29));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("1_000B"), Ok(1000));
    }

    #[test]
    fn rejects_garbage_with_a_hint() {
        for bad in [
            "",
            "GiB",
            "12XB",
            "1.2.3G",
            "-5",
            "99999999999TiB",
            "340282366920938463463374607.9TB",
        ] {
            let e = parse_size(bad).unwrap_err();
            assert!(!e.contains('\n'), "{e}");
            assert!(e.contains(bad.trim()) || bad.is_empty(), "{e}");
        }
    }

    #[test]
    fn formats_for_people() {
        assert_eq!(human(656), "656 B");
        assert_eq!(human(80 << 30), "80.00 GiB");
        assert_eq!(human(545792), "533.00 KiB");
    }
}
