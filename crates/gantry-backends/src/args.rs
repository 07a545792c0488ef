//! Reading flag values out of a backend's argument vector.
//!
//! Backends are started with user-supplied arguments (`--ctx-size 4096`,
//! `--gpu-memory-utilization=0.8`, `-ngl 99`). Estimation needs a few of them; this module
//! finds them without knowing the rest of the backend's command line.

use std::str::FromStr;

use thiserror::Error;

/// A flag was present but its value could not be used.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid value {value:?} for {flag}: {reason}")]
pub struct ArgsError {
    /// The flag as the user wrote it, e.g. `--ctx-size`.
    pub flag: String,
    /// The value as the user wrote it.
    pub value: String,
    /// Why it was rejected, in words.
    pub reason: String,
}

impl ArgsError {
    pub(crate) fn new(flag: &str, value: &str, reason: impl std::fmt::Display) -> Self {
        Self {
            flag: flag.to_owned(),
            value: value.to_owned(),
            reason: reason.to_string(),
        }
    }
}

/// Returns the value of the last occurrence of any of `names` in `args`, with the flag name
/// that carried it.
///
/// Both `--name value` and `--name=value` are understood, for long and short names alike
/// (`-c 4096`, `-c=4096`). The last occurrence wins, as in the backends' own parsers. A flag
/// at the very end with no value is ignored: the backend itself will reject it, and the
/// estimate should not guess.
pub fn flag_value<'a, 'n>(args: &'a [String], names: &[&'n str]) -> Option<(&'n str, &'a str)> {
    let mut found = None;
    let mut position = 0;
    while position < args.len() {
        let arg = args[position].as_str();
        for name in names {
            if arg == *name {
                if let Some(value) = args.get(position + 1) {
                    found = Some((*name, value.as_str()));
                    position += 1;
                }
                break;
            }
            if let Some(value) = arg
                .strip_prefix(name)
                .and_then(|rest| rest.strip_prefix('='))
            {
                found = Some((*name, value));
                break;
            }
        }
        position += 1;
    }
    found
}

/// Parses the value of the last occurrence of any of `names` as a `T`.
///
/// `Ok(None)` when the flag is absent; an [`ArgsError`] naming the flag when it is present
/// but does not parse.
pub fn parse_flag<T>(args: &[String], names: &[&str]) -> Result<Option<T>, ArgsError>
where
    T: FromStr,
    T::Err: std::fmt::Display,
{
    match flag_value(args, names) {
        None => Ok(None),
        Some((flag, value)) => value
            .trim()
            .parse::<T>()
            .map(Some)
            .map_err(|e| ArgsError::new(flag, value, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::tests::args;

    #[test]
    fn flag_value_reads_space_and_equals_forms() {
        let a = args(&["--ctx-size", "4096", "--port", "8080"]);
        assert_eq!(
            flag_value(&a, &["--ctx-size", "-c"]),
            Some(("--ctx-size", "4096"))
        );
        let a = args(&["--ctx-size=2048"]);
        assert_eq!(
            flag_value(&a, &["--ctx-size", "-c"]),
            Some(("--ctx-size", "2048"))
        );
        let a = args(&["-c=1024"]);
        assert_eq!(flag_value(&a, &["--ctx-size", "-c"]), Some(("-c", "1024")));
    }

    #[test]
    fn flag_value_last_occurrence_wins() {
        let a = args(&["-c", "1024", "--ctx-size=2048", "-c", "512"]);
        assert_eq!(flag_value(&a, &["--ctx-size", "-c"]), Some(("-c", "512")));
    }

    #[test]
    fn flag_value_does_not_match_prefixes_of_other_flags() {
        // `-c` must not match `-ctk`, and `--ctx-size` must not match `--ctx-size-draft`.
        let a = args(&["-ctk", "q8_0", "--ctx-size-draft", "100"]);
        assert_eq!(flag_value(&a, &["--ctx-size", "-c"]), None);
    }

    #[test]
    fn flag_value_ignores_a_trailing_flag_without_value() {
        let a = args(&["-c", "1024", "-c"]);
        assert_eq!(flag_value(&a, &["-c"]), Some(("-c", "1024")));
    }

    #[test]
    fn parse_flag_names_the_flag_on_error() {
        let a = args(&["--ctx-size=lots"]);
        let e = parse_flag::<u32>(&a, &["--ctx-size"]).expect_err("not a number");
        assert_eq!(e.flag, "--ctx-size");
        assert_eq!(e.value, "lots");
        assert!(e.to_string().contains("--ctx-size"));
        assert_eq!(parse_flag::<u32>(&a, &["-c"]), Ok(None));
    }
}
