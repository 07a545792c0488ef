//! Kinds of configuration values: how each kind is read from text (a flag, a `GANTRY_*`
//! variable, a YAML scalar) and written back for `--help` and the docs. Every key of
//! the table names its kind, so all keys of one kind read alike; sizes and durations go
//! through the one parser each in `gantry_types::units`.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::path::PathBuf;

use gantry_types::units;

/// A kind of value.
pub trait Kind {
    /// The field's type in the resolved configuration.
    type Value;
    /// The placeholder of the flag's value in `--help`; `None` uses the key's name.
    const VALUE_NAME: Option<&'static str> = None;
    /// Whether the value is a list: its flag may be repeated and the file may hold a
    /// YAML list; either way the items are joined with commas before parsing.
    const LIST: bool = false;
    /// Reads a value from trimmed text. The error says what is wrong and what to write.
    fn parse(text: &str) -> Result<Self::Value, String>;
    /// Writes a value the way [`Kind::parse`] reads it back; `None` for "nothing" (an
    /// absent option, an empty list).
    fn render(value: &Self::Value) -> Option<String>;
}

/// Any non-empty text.
#[derive(Debug)]
pub struct Text;

impl Kind for Text {
    type Value = String;
    fn parse(text: &str) -> Result<String, String> {
        if text.is_empty() {
            return Err("must not be empty".into());
        }
        Ok(text.to_owned())
    }
    fn render(value: &String) -> Option<String> {
        Some(value.clone())
    }
}

/// `K`, or nothing when the text is empty (a YAML `~`, an empty variable).
#[derive(Debug)]
pub struct Optional<K>(std::marker::PhantomData<K>);

impl<K: Kind> Kind for Optional<K> {
    type Value = Option<K::Value>;
    const VALUE_NAME: Option<&'static str> = K::VALUE_NAME;
    const LIST: bool = K::LIST;
    fn parse(text: &str) -> Result<Self::Value, String> {
        if text.is_empty() {
            return Ok(None);
        }
        K::parse(text).map(Some)
    }
    fn render(value: &Self::Value) -> Option<String> {
        value.as_ref().and_then(K::render)
    }
}

/// A directory.
#[derive(Debug)]
pub struct Dir;

impl Kind for Dir {
    type Value = PathBuf;
    const VALUE_NAME: Option<&'static str> = Some("DIR");
    fn parse(text: &str) -> Result<PathBuf, String> {
        Text::parse(text).map(PathBuf::from)
    }
    fn render(value: &PathBuf) -> Option<String> {
        Some(value.display().to_string())
    }
}

/// Directories, comma-separated or repeated.
#[derive(Debug)]
pub struct Dirs;

impl Kind for Dirs {
    type Value = Vec<PathBuf>;
    const VALUE_NAME: Option<&'static str> = Some("DIR");
    const LIST: bool = true;
    fn parse(text: &str) -> Result<Vec<PathBuf>, String> {
        text.split(',')
            .map(str::trim)
            .filter(|dir| !dir.is_empty())
            .map(Dir::parse)
            .collect()
    }
    fn render(value: &Vec<PathBuf>) -> Option<String> {
        (!value.is_empty()).then(|| {
            value
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(",")
        })
    }
}

/// A TCP port; 0 picks a free one.
#[derive(Debug)]
pub struct Port;

impl Kind for Port {
    type Value = u16;
    const VALUE_NAME: Option<&'static str> = Some("PORT");
    fn parse(text: &str) -> Result<u16, String> {
        text.parse()
            .map_err(|_| "must be a port number from 0 to 65535".into())
    }
    fn render(value: &u16) -> Option<String> {
        Some(value.to_string())
    }
}

/// A range of ports, `40000-40999`, both ends included.
#[derive(Debug)]
pub struct PortRange;

impl Kind for PortRange {
    type Value = RangeInclusive<u16>;
    const VALUE_NAME: Option<&'static str> = Some("LOW-HIGH");
    fn parse(text: &str) -> Result<Self::Value, String> {
        let shape = "must be two port numbers joined by '-', such as 40000-40999";
        let (low, high) = text.split_once('-').ok_or(shape)?;
        let low: u16 = low.trim().parse().map_err(|_| shape)?;
        let high: u16 = high.trim().parse().map_err(|_| shape)?;
        if low == 0 || low > high {
            return Err("the first port must be positive and not above the last".into());
        }
        Ok(low..=high)
    }
    fn render(value: &Self::Value) -> Option<String> {
        Some(format!("{}-{}", value.start(), value.end()))
    }
}

/// An IP address to bind to.
#[derive(Debug)]
pub struct IpAddr;

impl Kind for IpAddr {
    type Value = std::net::IpAddr;
    const VALUE_NAME: Option<&'static str> = Some("IP");
    fn parse(text: &str) -> Result<Self::Value, String> {
        text.parse()
            .map_err(|_| "must be an IP address such as 0.0.0.0 or 127.0.0.1".into())
    }
    fn render(value: &Self::Value) -> Option<String> {
        Some(value.to_string())
    }
}

/// A positive duration: `15s`, `2m`, `1h 30m`, or a number of seconds.
#[derive(Debug)]
pub struct Duration;

impl Kind for Duration {
    type Value = std::time::Duration;
    const VALUE_NAME: Option<&'static str> = Some("DURATION");
    fn parse(text: &str) -> Result<Self::Value, String> {
        let duration = units::parse_duration(text).map_err(|e| e.to_string())?;
        if duration.is_zero() {
            return Err("must be longer than zero".into());
        }
        Ok(duration)
    }
    fn render(value: &Self::Value) -> Option<String> {
        Some(units::format_duration(*value))
    }
}

/// The size limit of a request body: `1MiB`, `32M`, `10MB`, or bytes; at least 1 KiB,
/// since a smaller limit would reject every request.
#[derive(Debug)]
pub struct BodyLimit;

impl BodyLimit {
    const MIN: u64 = 1024;
}

impl Kind for BodyLimit {
    type Value = usize;
    const VALUE_NAME: Option<&'static str> = Some("SIZE");
    fn parse(text: &str) -> Result<usize, String> {
        let bytes = units::parse_size(text).map_err(|e| e.to_string())?;
        if bytes < Self::MIN {
            return Err(format!(
                "must be at least {}",
                units::format_size(Self::MIN)
            ));
        }
        usize::try_from(bytes).map_err(|_| "is larger than this machine can address".into())
    }
    fn render(value: &usize) -> Option<String> {
        Some(units::format_size(*value as u64))
    }
}

/// A size on disk: `100GiB`, `500G`, `1TB`, or bytes.
#[derive(Debug)]
pub struct Size;

impl Kind for Size {
    type Value = u64;
    const VALUE_NAME: Option<&'static str> = Some("SIZE");
    fn parse(text: &str) -> Result<u64, String> {
        let bytes = units::parse_size(text).map_err(|e| e.to_string())?;
        if bytes == 0 {
            return Err("must be larger than zero".into());
        }
        Ok(bytes)
    }
    fn render(value: &u64) -> Option<String> {
        Some(units::format_size(*value))
    }
}

/// How many of something: a whole number from 1 to 64.
#[derive(Debug)]
pub struct Count;

impl Kind for Count {
    type Value = usize;
    const VALUE_NAME: Option<&'static str> = Some("N");
    fn parse(text: &str) -> Result<usize, String> {
        match text.parse::<usize>() {
            Ok(n) if (1..=64).contains(&n) => Ok(n),
            _ => Err("must be a whole number from 1 to 64".into()),
        }
    }
    fn render(value: &usize) -> Option<String> {
        Some(value.to_string())
    }
}

/// `true` or `false` (also `yes`/`no`, `on`/`off`, `1`/`0`).
#[derive(Debug)]
pub struct Bool;

impl Kind for Bool {
    type Value = bool;
    const VALUE_NAME: Option<&'static str> = Some("BOOL");
    fn parse(text: &str) -> Result<bool, String> {
        match text.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(true),
            "false" | "0" | "no" | "off" => Ok(false),
            _ => Err("must be true or false".into()),
        }
    }
    fn render(value: &bool) -> Option<String> {
        Some(value.to_string())
    }
}

/// HTTP(S) base URLs, comma-separated; a trailing `/` is dropped.
#[derive(Debug)]
pub struct Urls;

impl Kind for Urls {
    type Value = Vec<String>;
    const VALUE_NAME: Option<&'static str> = Some("URL");
    const LIST: bool = true;
    fn parse(text: &str) -> Result<Vec<String>, String> {
        text.split(',')
            .map(str::trim)
            .filter(|url| !url.is_empty())
            .map(|url| {
                if url.starts_with("http://") || url.starts_with("https://") {
                    Ok(url.trim_end_matches('/').to_owned())
                } else {
                    Err(format!("{url:?} must start with http:// or https://"))
                }
            })
            .collect()
    }
    fn render(value: &Vec<String>) -> Option<String> {
        (!value.is_empty()).then(|| value.join(","))
    }
}

/// Labels `k=v,k2=v2`, with the key and value rules the server applies.
#[derive(Debug)]
pub struct Labels;

impl Kind for Labels {
    type Value = BTreeMap<String, String>;
    const VALUE_NAME: Option<&'static str> = Some("KEY=VALUE");
    const LIST: bool = true;
    fn parse(text: &str) -> Result<Self::Value, String> {
        let labels = text
            .split(',')
            .map(str::trim)
            .filter(|pair| !pair.is_empty())
            .map(|pair| {
                pair.split_once('=')
                    .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                    .ok_or_else(|| format!("{pair:?} is not key=value"))
            })
            .collect::<Result<BTreeMap<_, _>, _>>()?;
        gantry_types::validate::check_labels("labels", &labels).map_err(|e| e.to_string())?;
        Ok(labels)
    }
    fn render(value: &Self::Value) -> Option<String> {
        let pairs: Vec<String> = value.iter().map(|(k, v)| format!("{k}={v}")).collect();
        (!pairs.is_empty()).then(|| pairs.join(","))
    }
}

/// Where the server keeps its state: a PostgreSQL URL, or a SQLite one.
#[derive(Debug)]
pub struct DatabaseUrl;

impl Kind for DatabaseUrl {
    type Value = String;
    const VALUE_NAME: Option<&'static str> = Some("URL");
    fn parse(text: &str) -> Result<String, String> {
        if ["postgres://", "postgresql://", "sqlite:"]
            .iter()
            .any(|scheme| text.starts_with(scheme))
        {
            Ok(text.to_owned())
        } else {
            Err("must start with postgres://, postgresql:// or sqlite:".into())
        }
    }
    fn render(value: &String) -> Option<String> {
        Some(value.clone())
    }
}

/// A server's name: 1 to 128 characters.
#[derive(Debug)]
pub struct ServerId;

impl Kind for ServerId {
    type Value = String;
    const VALUE_NAME: Option<&'static str> = Some("NAME");
    fn parse(text: &str) -> Result<String, String> {
        if text.chars().count() > 128 {
            return Err("must be 1 to 128 characters".into());
        }
        Text::parse(text)
    }
    fn render(value: &String) -> Option<String> {
        Some(value.clone())
    }
}

/// A worker's name, by the rule of every resource name.
#[derive(Debug)]
pub struct WorkerName;

impl Kind for WorkerName {
    type Value = String;
    const VALUE_NAME: Option<&'static str> = Some("NAME");
    fn parse(text: &str) -> Result<String, String> {
        gantry_types::validate::check_name("worker_name", text).map_err(|e| e.message)?;
        Ok(text.to_owned())
    }
    fn render(value: &String) -> Option<String> {
        Some(value.clone())
    }
}

/// A `tracing` filter such as `info` or `gantry_server=debug,info`.
#[derive(Debug)]
pub struct LogFilter;

impl Kind for LogFilter {
    type Value = String;
    const VALUE_NAME: Option<&'static str> = Some("FILTER");
    fn parse(text: &str) -> Result<String, String> {
        tracing_subscriber::EnvFilter::try_new(text).map_err(|e| {
            format!("{e}; write a level (info, debug) or target=level pairs joined by commas")
        })?;
        Ok(text.to_owned())
    }
    fn render(value: &String) -> Option<String> {
        Some(value.clone())
    }
}

/// Simulated GPUs: `COUNTxSIZE`, such as `4x80GiB`.
#[derive(Debug)]
pub struct SimulatedGpus;

impl Kind for SimulatedGpus {
    type Value = gantry_worker::gpu::SimulatedGpus;
    const VALUE_NAME: Option<&'static str> = Some("COUNTxSIZE");
    fn parse(text: &str) -> Result<Self::Value, String> {
        gantry_worker::gpu::SimulatedGpus::parse(text)
    }
    fn render(value: &Self::Value) -> Option<String> {
        Some(format!(
            "{}x{}",
            value.count,
            units::format_size(value.memory)
        ))
    }
}

/// One of a few words.
fn choose<T: Copy>(text: &str, choices: &[(&str, T)]) -> Result<T, String> {
    choices
        .iter()
        .find(|(word, _)| *word == text)
        .map(|(_, value)| *value)
        .ok_or_else(|| {
            let words: Vec<&str> = choices.iter().map(|(word, _)| *word).collect();
            format!("must be one of {}", words.join(", "))
        })
}

/// The word of a choice.
fn word_of<T: PartialEq>(value: &T, choices: &[(&'static str, T)]) -> Option<String> {
    choices
        .iter()
        .find(|(_, choice)| choice == value)
        .map(|(word, _)| (*word).to_owned())
}

pub use gantry_server::config::SchedulingMode;

/// How scheduling is shared between servers (the server's [`SchedulingMode`]).
#[derive(Debug)]
pub struct Scheduling;

impl Scheduling {
    const CHOICES: [(&'static str, SchedulingMode); 3] = [
        ("local", SchedulingMode::Local),
        ("distributed", SchedulingMode::Distributed),
        ("auto", SchedulingMode::Auto),
    ];
}

impl Kind for Scheduling {
    type Value = SchedulingMode;
    const VALUE_NAME: Option<&'static str> = Some("MODE");
    fn parse(text: &str) -> Result<SchedulingMode, String> {
        choose(text, &Self::CHOICES)
    }
    fn render(value: &SchedulingMode) -> Option<String> {
        word_of(value, &Self::CHOICES)
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl LogFormat {
    const CHOICES: [(&'static str, Self); 2] = [("text", Self::Text), ("json", Self::Json)];
}

impl Kind for LogFormat {
    type Value = Self;
    const VALUE_NAME: Option<&'static str> = Some("FORMAT");
    fn parse(text: &str) -> Result<Self, String> {
        choose(text, &Self::CHOICES)
    }
    fn render(value: &Self) -> Option<String> {
        word_of(value, &Self::CHOICES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_limits_read_every_size_form_but_refuse_tiny_ones() {
        assert_eq!(BodyLimit::parse("2MiB"), Ok(2 << 20));
        assert_eq!(BodyLimit::parse("20G"), Ok(20 << 30));
        assert_eq!(BodyLimit::parse("10MB"), Ok(10_000_000));
        assert_eq!(BodyLimit::parse("1KiB"), Ok(1024));
        let tiny = BodyLimit::parse("1000").expect_err("below 1 KiB");
        assert!(tiny.contains("at least 1KiB"), "{tiny}");
        let unit = BodyLimit::parse("2XB").expect_err("unknown unit");
        assert!(unit.contains("KiB, MiB, GiB"), "{unit}");
    }

    #[test]
    fn durations_must_be_positive() {
        assert_eq!(
            Duration::parse("90"),
            Ok(std::time::Duration::from_secs(90))
        );
        assert!(Duration::parse("0s")
            .expect_err("zero")
            .contains("longer than zero"));
    }

    #[test]
    fn port_ranges_need_two_ordered_ports() {
        assert_eq!(PortRange::parse("41000-41010"), Ok(41000..=41010));
        assert!(PortRange::parse("41010-41000").is_err());
        assert!(PortRange::parse("0-10").is_err());
        assert!(PortRange::parse("41000").is_err());
    }

    #[test]
    fn labels_follow_the_servers_rules() {
        let labels = Labels::parse("gpu=a100, zone=b").expect("valid");
        assert_eq!(labels["gpu"], "a100");
        assert_eq!(labels["zone"], "b");
        assert!(Labels::parse("nokey").is_err());
        assert!(Labels::parse("bad key=x").is_err());
    }

    #[test]
    fn choices_name_every_word() {
        assert_eq!(LogFormat::parse("json"), Ok(LogFormat::Json));
        let err = Scheduling::parse("leader").expect_err("not a mode");
        assert!(err.contains("local, distributed, auto"), "{err}");
    }

    #[test]
    fn optional_values_are_absent_when_empty() {
        assert_eq!(Optional::<Text>::parse(""), Ok(None));
        assert_eq!(Optional::<Text>::parse("x"), Ok(Some("x".to_owned())));
        assert!(Optional::<DatabaseUrl>::parse("mysql://x").is_err());
    }
}
