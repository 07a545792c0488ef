//! `Range` headers as the test doubles read them (RFC 9110, one range only).

/// What a `Range` header asks of a body of `size` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ByteRange {
    /// No header, or one the double does not understand (several ranges, another unit,
    /// bad syntax), which HTTP lets a server ignore.
    Whole,
    /// Bytes `first..=last`, within the body.
    Part { first: u64, last: u64 },
    /// A valid range that starts past the end, or a suffix of zero bytes.
    Unsatisfiable,
}

pub(crate) fn parse_range(header: Option<&str>, size: u64) -> ByteRange {
    let Some(spec) = header.and_then(|value| value.trim().strip_prefix("bytes=")) else {
        return ByteRange::Whole;
    };
    let Some((first, last)) = spec.trim().split_once('-') else {
        return ByteRange::Whole;
    };
    if spec.contains(',') {
        return ByteRange::Whole;
    }
    let parse = |text: &str| text.trim().parse::<u64>().ok();
    match (first.trim().is_empty(), last.trim().is_empty()) {
        // `bytes=-n`: the last n bytes.
        (true, false) => match parse(last) {
            None => ByteRange::Whole,
            Some(0) => ByteRange::Unsatisfiable,
            Some(_) if size == 0 => ByteRange::Unsatisfiable,
            Some(suffix) => ByteRange::Part {
                first: size.saturating_sub(suffix),
                last: size - 1,
            },
        },
        // `bytes=a-`: from a to the end.
        (false, true) => match parse(first) {
            None => ByteRange::Whole,
            Some(first) if first >= size => ByteRange::Unsatisfiable,
            Some(first) => ByteRange::Part {
                first,
                last: size - 1,
            },
        },
        // `bytes=a-b`: a to b inclusive, b clamped to the end.
        (false, false) => match (parse(first), parse(last)) {
            (Some(first), Some(last)) if first <= last => {
                if first >= size {
                    ByteRange::Unsatisfiable
                } else {
                    ByteRange::Part {
                        first,
                        last: last.min(size - 1),
                    }
                }
            }
            _ => ByteRange::Whole,
        },
        (true, true) => ByteRange::Whole,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_follow_rfc_9110() {
        assert_eq!(parse_range(None, 10), ByteRange::Whole);
        assert_eq!(
            parse_range(Some("bytes=2-5"), 10),
            ByteRange::Part { first: 2, last: 5 }
        );
        assert_eq!(
            parse_range(Some("bytes=2-"), 10),
            ByteRange::Part { first: 2, last: 9 }
        );
        assert_eq!(
            parse_range(Some("bytes=5-100"), 10),
            ByteRange::Part { first: 5, last: 9 }
        );
        assert_eq!(
            parse_range(Some("bytes=-3"), 10),
            ByteRange::Part { first: 7, last: 9 }
        );
        assert_eq!(
            parse_range(Some("bytes=-30"), 10),
            ByteRange::Part { first: 0, last: 9 }
        );
        assert_eq!(parse_range(Some("bytes=10-"), 10), ByteRange::Unsatisfiable);
        assert_eq!(
            parse_range(Some("bytes=10-12"), 10),
            ByteRange::Unsatisfiable
        );
        assert_eq!(parse_range(Some("bytes=-0"), 10), ByteRange::Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=0-"), 0), ByteRange::Unsatisfiable);
        // What a server may ignore is ignored.
        assert_eq!(parse_range(Some("bytes=5-2"), 10), ByteRange::Whole);
        assert_eq!(parse_range(Some("bytes=0-1,4-5"), 10), ByteRange::Whole);
        assert_eq!(parse_range(Some("items=0-1"), 10), ByteRange::Whole);
        assert_eq!(parse_range(Some("bytes=x-"), 10), ByteRange::Whole);
    }
}
