//! Byte units, and the one way sizes are printed in scheduler messages.

/// One kibibyte.
pub const KIB: u64 = 1024;
/// One mebibyte.
pub const MIB: u64 = 1024 * KIB;
/// One gibibyte.
pub const GIB: u64 = 1024 * MIB;

/// Formats a byte count as GiB with one decimal, e.g. `71.2 GiB`.
///
/// Every human message of this crate prints sizes through this function so that an
/// operator can compare the numbers of two messages at a glance.
pub fn format_gib(bytes: u64) -> String {
    // Precision loss above 2^53 bytes (8 PiB) is irrelevant for a one-decimal display.
    format!("{:.1} GiB", bytes as f64 / GIB as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_gib_prints_one_decimal() {
        assert_eq!(format_gib(0), "0.0 GiB");
        assert_eq!(format_gib(GIB), "1.0 GiB");
        assert_eq!(format_gib(GIB + GIB / 2), "1.5 GiB");
        assert_eq!(format_gib(80 * GIB), "80.0 GiB");
    }
}
