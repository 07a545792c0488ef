//! Sizes and durations as people write them in flags, environment variables, config
//! files and model settings. There is one parser for each, so `20G` means 20 GiB
//! wherever gantry reads a size, and one formatter that writes what the parser reads.
//! Checks that belong to one use (a body limit of at least 1 KiB, a timeout longer than
//! zero) stay with that use.

use std::fmt;
use std::time::Duration;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

/// Every unit a size may carry, lowercase (sizes are read case-insensitively). A bare
/// letter is binary, as `nvidia-smi` and most people mean it: `20G` is 20 GiB.
const SIZE_UNITS: &[(&str, u64)] = &[
    ("", 1),
    ("b", 1),
    ("k", KIB),
    ("ki", KIB),
    ("kib", KIB),
    ("kb", 1_000),
    ("m", MIB),
    ("mi", MIB),
    ("mib", MIB),
    ("mb", 1_000_000),
    ("g", GIB),
    ("gi", GIB),
    ("gib", GIB),
    ("gb", 1_000_000_000),
    ("t", TIB),
    ("ti", TIB),
    ("tib", TIB),
    ("tb", 1_000_000_000_000),
];

/// What a size may look like; every size error ends with it.
pub const SIZE_FORMS: &str = "write a number of bytes, or a number with a unit: \
     K, M, G, T or KiB, MiB, GiB, TiB (powers of 1024), KB, MB, GB, TB (powers of 1000), \
     in any case, for example 20G, 1.5GiB or 512MB";

/// What a duration may look like; every duration error ends with it.
pub const DURATION_FORMS: &str = "write a number of seconds, or numbers with units \
     (ms, s, m, h, d), for example 15s, 2m or 1h 30m";

/// A size that did not parse. The message quotes the text and names the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeError {
    message: String,
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SizeError {}

/// A duration that did not parse. The message quotes the text and names the accepted
/// forms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurationError {
    message: String,
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DurationError {}

/// Parses a size in bytes: `1048576`, `512KiB`, `20G` (= 20 GiB), `20GB` (= 20·10⁹),
/// `1.5GiB`, `512 mb`. Surrounding whitespace and whitespace before the unit are
/// ignored; fractions of a byte are dropped.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let fail = |problem: &str| SizeError {
        message: format!("{text:?} is not a size ({problem}); {SIZE_FORMS}"),
    };
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let scale = SIZE_UNITS
        .iter()
        .find(|(name, _)| *name == unit)
        .map(|(_, scale)| u128::from(*scale))
        .ok_or_else(|| fail(&format!("unknown unit {unit:?}")))?;
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if (whole.is_empty() && fraction.is_empty()) || !all_digits(whole) || !all_digits(fraction) {
        return Err(fail("not a number"));
    }
    // Exact arithmetic: the digits as one integer, scaled, then divided by the power of
    // ten the decimal point stands for. u128 holds any size that fits u64 times a unit.
    let too_large = || fail("larger than 2^64 bytes");
    let mut digits: u128 = 0;
    for digit in whole.bytes().chain(fraction.bytes()) {
        digits = digits
            .checked_mul(10)
            .and_then(|d| d.checked_add(u128::from(digit - b'0')))
            .ok_or_else(too_large)?;
    }
    let decimals = u32::try_from(fraction.len()).map_err(|_| too_large())?;
    let divisor = 10u128.checked_pow(decimals).ok_or_else(too_large)?;
    let bytes = digits.checked_mul(scale).ok_or_else(too_large)? / divisor;
    u64::try_from(bytes).map_err(|_| too_large())
}

/// Writes a size the way [`parse_size`] reads it back exactly, in the unit that divides
/// it and leaves the smallest number, binary first: `1MiB`, `32MiB`, `24GB`, else in bytes
/// (`1500B`).
pub fn format_size(bytes: u64) -> String {
    const BINARY: [(u64, &str); 4] = [(TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")];
    const DECIMAL: [(u64, &str); 4] = [
        (1_000_000_000_000, "TB"),
        (1_000_000_000, "GB"),
        (1_000_000, "MB"),
        (1_000, "KB"),
    ];
    BINARY
        .iter()
        .chain(DECIMAL.iter())
        .filter(|(scale, _)| bytes != 0 && bytes % *scale == 0)
        .map(|(scale, unit)| (bytes / scale, unit))
        .min_by_key(|(number, _)| *number)
        .map(|(number, unit)| format!("{number}{unit}"))
        .unwrap_or_else(|| format!("{bytes}B"))
}

/// Parses a duration: `15s`, `2m`, `1h 30m`, `500ms` (humantime's forms); a bare number
/// is seconds. Zero is a valid duration here; a use that needs a positive one says so.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let trimmed = text.trim();
    if let Ok(seconds) = trimmed.parse::<u64>() {
        return Ok(Duration::from_secs(seconds));
    }
    humantime::parse_duration(trimmed).map_err(|e| DurationError {
        message: format!("{text:?} is not a duration ({e}); {DURATION_FORMS}"),
    })
}

/// Writes a duration the way [`parse_duration`] reads it back: `15s`, `1m`, `1h 30m`.
pub fn format_duration(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_unit_letter_is_binary_everywhere() {
        assert_eq!(parse_size("20G"), Ok(20 * GIB));
        assert_eq!(parse_size("20g"), Ok(20 * GIB));
        assert_eq!(parse_size("20 G"), Ok(20 * GIB));
        assert_eq!(parse_size("20Gi"), Ok(20 * GIB));
        assert_eq!(parse_size("20GiB"), Ok(20 * GIB));
        assert_eq!(parse_size("512K"), Ok(512 * KIB));
        assert_eq!(parse_size("3M"), Ok(3 * MIB));
        assert_eq!(parse_size("2T"), Ok(2 * TIB));
    }

    #[test]
    fn decimal_units_are_powers_of_a_thousand() {
        assert_eq!(parse_size("512MB"), Ok(512_000_000));
        assert_eq!(parse_size("20GB"), Ok(20_000_000_000));
        assert_eq!(parse_size("10kb"), Ok(10_000));
        assert_eq!(parse_size("1TB"), Ok(1_000_000_000_000));
    }

    #[test]
    fn sizes_read_bytes_decimals_case_and_whitespace() {
        assert_eq!(parse_size("1048576"), Ok(MIB));
        assert_eq!(parse_size("100B"), Ok(100));
        assert_eq!(parse_size("1.5GiB"), Ok(GIB + GIB / 2));
        assert_eq!(parse_size("1.5gib"), Ok(GIB + GIB / 2));
        assert_eq!(parse_size(".5KiB"), Ok(512));
        assert_eq!(parse_size("2.MiB"), Ok(2 * MIB));
        assert_eq!(parse_size("  512 MiB  "), Ok(512 * MIB));
        assert_eq!(
            parse_size("0.1KiB"),
            Ok(102),
            "fractions of a byte are dropped"
        );
        assert_eq!(parse_size("16777215TiB"), Ok(16_777_215 * TIB));
    }

    #[test]
    fn bad_sizes_name_the_problem_and_the_accepted_forms() {
        for (text, problem) in [
            ("80PB", "unknown unit \"pb\""),
            ("12 parsecs", "unknown unit \"parsecs\""),
            ("twelve", "unknown unit \"twelve\""),
            ("16EiB", "unknown unit \"eib\""),
            ("", "not a number"),
            ("GiB", "not a number"),
            ("K", "not a number"),
            ("1.2.3G", "not a number"),
            ("-1G", "unknown unit"),
            ("16777216TiB", "larger than 2^64 bytes"),
            (
                "99999999999999999999999999999999999999999",
                "larger than 2^64 bytes",
            ),
        ] {
            let message = parse_size(text).expect_err(text).to_string();
            assert!(message.contains(problem), "{text:?}: {message}");
            assert!(message.contains(&format!("{text:?}")), "{message}");
            assert!(message.ends_with(SIZE_FORMS), "{message}");
        }
    }

    #[test]
    fn formatted_sizes_parse_back_to_the_same_bytes() {
        assert_eq!(format_size(MIB), "1MiB");
        assert_eq!(format_size(32 * MIB), "32MiB");
        assert_eq!(format_size(80 * GIB), "80GiB");
        assert_eq!(format_size(24_000_000_000), "24GB");
        assert_eq!(format_size(1536), "1536B");
        assert_eq!(format_size(1000), "1KB");
        assert_eq!(format_size(2_048_000), "2000KiB");
        assert_eq!(format_size(0), "0B");
        for bytes in [0, 1, 1000, 1024, 1536, 1500, 3 * TIB, 7 * GIB + 1, u64::MAX] {
            assert_eq!(parse_size(&format_size(bytes)), Ok(bytes), "{bytes}");
        }
    }

    #[test]
    fn durations_read_units_and_bare_seconds() {
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration(" 90 "), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
    }

    #[test]
    fn bad_durations_name_the_accepted_forms() {
        for text in ["soon", "", "15 parsecs", "-5s", "1.5"] {
            let message = parse_duration(text).expect_err(text).to_string();
            assert!(message.contains(&format!("{text:?}")), "{message}");
            assert!(message.ends_with(DURATION_FORMS), "{message}");
        }
    }

    #[test]
    fn formatted_durations_parse_back() {
        for duration in [
            Duration::from_secs(15),
            Duration::from_secs(60),
            Duration::from_secs(600),
            Duration::from_secs(5400),
            Duration::from_millis(1500),
        ] {
            assert_eq!(parse_duration(&format_duration(duration)), Ok(duration));
        }
        assert_eq!(format_duration(Duration::from_secs(600)), "10m");
    }
}
