//! Timestamps: stored as milliseconds since the Unix epoch, shown as RFC 3339 in JSON.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A point in time with millisecond precision, serialised as an RFC 3339 string
/// (`2026-11-22T03:05:44.123Z`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(i64);

impl Timestamp {
    /// Wraps milliseconds since the Unix epoch.
    pub const fn from_millis(millis: i64) -> Self {
        Self(millis)
    }

    /// Milliseconds since the Unix epoch.
    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// The current wall-clock time.
    pub fn now() -> Self {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Self(i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX))
    }

    /// This time plus a duration, saturating.
    pub fn plus(self, duration: Duration) -> Self {
        let millis = i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
        Self(self.0.saturating_add(millis))
    }

    /// This time minus a duration, saturating.
    pub fn minus(self, duration: Duration) -> Self {
        let millis = i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
        Self(self.0.saturating_sub(millis))
    }
}

impl From<SystemTime> for Timestamp {
    fn from(time: SystemTime) -> Self {
        let millis = match time.duration_since(UNIX_EPOCH) {
            Ok(after) => i64::try_from(after.as_millis()).unwrap_or(i64::MAX),
            Err(before) => -i64::try_from(before.duration().as_millis()).unwrap_or(i64::MAX),
        };
        Self(millis)
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month = i64::from(month);
    let day_of_year =
        (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The date of a day since 1970-01-01 (`civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_index + 2) / 5 + 1) as u32;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        4 | 6 | 9 | 11 => 30,
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        _ => 31,
    }
}

/// Parses an RFC 3339 date-time (`2026-11-24T02:14:14.732Z`, `…T00:17:47.5-11:42`;
/// `t`, `z` and a space separator accepted, any number of fraction digits, kept to the
/// millisecond; a leap second counts as the next second).
fn parse_rfc3339(text: &str) -> Result<Timestamp, &'static str> {
    let bytes = text.as_bytes();
    let number = |range: std::ops::Range<usize>| -> Result<u32, &'static str> {
        let part = bytes.get(range).ok_or("too short")?;
        if !part.iter().all(u8::is_ascii_digit) {
            return Err("a digit is expected");
        }
        Ok(part.iter().fold(0, |n, d| n * 10 + u32::from(d - b'0')))
    };
    let expect = |at: usize, allowed: &[u8]| -> Result<(), &'static str> {
        match bytes.get(at) {
            Some(b) if allowed.contains(b) => Ok(()),
            _ => Err("unexpected character"),
        }
    };
    let year = i64::from(number(0..4)?);
    expect(4, b"-")?;
    let month = number(5..7)?;
    expect(7, b"-")?;
    let day = number(8..10)?;
    expect(10, b"Tt ")?;
    let hour = number(11..13)?;
    expect(13, b":")?;
    let minute = number(14..16)?;
    expect(16, b":")?;
    let second = number(17..19)?;
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return Err("no such date");
    }
    if hour > 23 || minute > 59 || second > 60 {
        return Err("no such time of day");
    }
    let mut at = 19;
    let mut millis = 0i64;
    if bytes.get(at) == Some(&b'.') {
        at += 1;
        let start = at;
        while bytes.get(at).is_some_and(u8::is_ascii_digit) {
            if at - start < 3 {
                millis = millis * 10 + i64::from(bytes[at] - b'0');
            }
            at += 1;
        }
        if at == start {
            return Err("a digit is expected after '.'");
        }
        for _ in (at - start)..3 {
            millis *= 10;
        }
    }
    let offset_minutes: i64 = match bytes.get(at) {
        Some(b'Z' | b'z') if at + 1 == bytes.len() => 0,
        Some(sign @ (b'+' | b'-')) if at + 6 == bytes.len() => {
            let hours = number(at + 1..at + 3)?;
            expect(at + 3, b":")?;
            let minutes = number(at + 4..at + 6)?;
            if hours > 23 || minutes > 59 {
                return Err("no such offset");
            }
            let offset = i64::from(hours * 60 + minutes);
            if *sign == b'-' {
                -offset
            } else {
                offset
            }
        }
        _ => return Err("a time zone (Z or ±HH:MM) is expected at the end"),
    };
    let seconds = days_from_civil(year, month, day) * 86_400
        + i64::from(hour) * 3600
        + i64::from(minute) * 60
        + i64::from(second)
        - offset_minutes * 60;
    Ok(Timestamp(seconds * 1000 + millis))
}

/// Shown as RFC 3339 in UTC with milliseconds; outside years 0000–9999 (which no parsed
/// timestamp reaches) the year has as many digits as it needs.
impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let seconds = self.0.div_euclid(1000);
        let millis = self.0.rem_euclid(1000);
        let (year, month, day) = civil_from_days(seconds.div_euclid(86_400));
        let of_day = seconds.rem_euclid(86_400);
        write!(
            f,
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
            of_day / 3600,
            of_day % 3600 / 60,
            of_day % 60
        )
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        parse_rfc3339(&text).map_err(|e| {
            serde::de::Error::custom(format!("invalid RFC 3339 timestamp {text:?}: {e}"))
        })
    }
}

impl utoipa::PartialSchema for Timestamp {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
                utoipa::openapi::KnownFormat::DateTime,
            )))
            .into()
    }
}

impl utoipa::ToSchema for Timestamp {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamp_round_trips_through_json_as_rfc3339() {
        let t = Timestamp::from_millis(1_795_000_000_123);
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(json, "\"2026-11-18T11:06:40.123Z\"");
        let back: Timestamp = serde_json::from_str(&json).unwrap();
        assert_eq!(back, t);
    }

    #[test]
    fn every_rfc3339_form_parses_to_the_same_instant() {
        let parse = |text: &str| serde_json::from_str::<Timestamp>(&format!("\"{text}\"")).unwrap();
        let t = Timestamp::from_millis(1_795_000_000_123);
        assert_eq!(parse("2026-11-18T11:06:40.123Z"), t);
        assert_eq!(parse("2026-11-18t11:06:40.123456z"), t);
        assert_eq!(parse("2026-11-18 12:36:40.123+01:30"), t);
        assert_eq!(parse("2026-11-18T00:06:40.1234-11:00"), t);
        assert_eq!(
            parse("4932-04-09T00:17:47.5-11:42").to_string(),
            "4932-04-09T11:59:47.500Z"
        );
        assert_eq!(parse("1970-01-01T00:00:00Z").as_millis(), 0);
        assert_eq!(parse("1969-12-31T23:59:59.999Z").as_millis(), -1);
        assert_eq!(
            parse("0000-01-01T00:00:00Z").to_string(),
            "0000-01-01T00:00:00.000Z"
        );
        assert_eq!(
            parse("2024-02-29T00:00:00Z").to_string(),
            "2024-02-29T00:00:00.000Z"
        );
        for bad in [
            "2023-02-29T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-11-18T24:00:00Z",
            "2026-11-18T11:06:40",
            "2026-11-18T11:06:40.Z",
            "2026-11-18T11:06:40+1:00",
            "2026-11-18T11:06:40Zjunk",
        ] {
            assert!(
                serde_json::from_str::<Timestamp>(&format!("\"{bad}\"")).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn every_millisecond_displays_and_parses_back() {
        for millis in [
            i64::from(i32::MIN) * 1000,
            -86_400_001,
            -1,
            0,
            1,
            951_782_400_000,
            253_402_300_799_999,
        ] {
            let t = Timestamp::from_millis(millis);
            let back: Timestamp =
                serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
            assert_eq!(back, t, "{t}");
        }
    }

    #[test]
    fn timestamp_rejects_garbage_with_a_message() {
        let err = serde_json::from_str::<Timestamp>("\"yesterday\"").unwrap_err();
        assert!(
            err.to_string().contains("invalid RFC 3339 timestamp"),
            "{err}"
        );
    }
}
