//! Configuration loading: every key can come from a command-line flag, a `GANTRY_*`
//! environment variable, the YAML file given with `--config`, or the default — in that
//! order of precedence. Unknown keys in the file and invalid values anywhere stop
//! start-up with a message naming the key and where its value came from.
//!
//! Keys are declared once, in the table of `keys.rs`; [`config_table!`] turns each
//! declaration into a field of [`Config`], a [`Key`] descriptor in [`KEYS`] (which
//! drives the flags, `--help`, the file's known keys and the docs' table), and the
//! line of [`Layers::resolve`] that reads it. How values of each kind are read and
//! written is in `kinds.rs`; the command line is built in `cli.rs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};

/// Declares the configuration keys. Input: groups `global { … } server { … } worker
/// { … }` of entries
///
/// ```text
/// /// One-line doc.
/// name: Kind = default_expression [, shown "how the default is described"] [, also "flag", …];
/// ```
///
/// `shown` may be any expression that makes a `String`, so a description can quote the
/// constants it describes rather than repeat them.
///
/// Output: the [`Config`] struct (one field per key, typed by the kind), [`KEYS`] (one
/// [`Key`] per entry, in table order) and `Layers::resolve_keys`.
macro_rules! config_table {
    (@scope global) => { Scope::Global };
    (@scope server) => { Scope::Server };
    (@scope worker) => { Scope::Worker };
    (@default $kind:ty, $default:expr) => {
        DefaultText::rendered(<$kind as Kind>::render(&$default))
    };
    (@default $kind:ty, $default:expr, $shown:expr) => {
        DefaultText::Described(String::from($shown))
    };
    ($(
        $scope:ident {
            $(
                $(#[doc = $doc:expr])+
                $name:ident : $kind:ty = $default:expr
                    $(, shown $shown:expr)?
                    $(, also $($also:literal),+)?
                ;
            )*
        }
    )*) => {
        /// The resolved configuration: one field per key of the table.
        #[derive(Debug, Clone)]
        pub struct Config {
            $($(
                $(#[doc = $doc])+
                pub $name: <$kind as Kind>::Value,
            )*)*
        }

        /// Every key, in the table's order.
        pub const KEYS: &[Key] = &[$($(
            Key {
                name: stringify!($name),
                scope: config_table!(@scope $scope),
                doc: concat!($($doc),+),
                also: &[$($($also),+)?],
                value_name: <$kind as Kind>::VALUE_NAME,
                list: <$kind as Kind>::LIST,
                default: || config_table!(@default $kind, $default $(, $shown)?),
            },
        )*)*];

        impl Layers {
            /// Reads every key from its highest-precedence source, or takes its default.
            pub(super) fn resolve_keys(&self) -> anyhow::Result<Config> {
                Ok(Config {
                    $($(
                        $name: self.value::<$kind>(stringify!($name), || $default)?,
                    )*)*
                })
            }
        }
    };
}

pub mod cli;
#[cfg(test)]
mod docs;
mod keys;
mod kinds;

pub use keys::{Config, KEYS};
pub use kinds::{LogFormat, SchedulingMode};

/// Which commands read a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every command; the flag may come before or after the command's name.
    Global,
    /// `gantry server` and `gantry start`.
    Server,
    /// `gantry worker` and `gantry start`.
    Worker,
}

/// A key's default as `--help` and the docs show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DefaultText {
    /// No value: an absent option, an empty list.
    Nothing,
    /// A value, written the way a user would write it (`15s`, `1MiB`).
    Value(String),
    /// Words, for a default that depends on the machine or the command.
    Described(String),
}

impl DefaultText {
    fn rendered(value: Option<String>) -> Self {
        value.map_or(Self::Nothing, Self::Value)
    }
}

/// One configuration key, as the table declares it.
#[derive(Debug)]
pub struct Key {
    /// The YAML key and the field of [`Config`]; the flag and the variable derive from it.
    pub name: &'static str,
    pub scope: Scope,
    /// One sentence or two; Markdown code spans allowed.
    pub doc: &'static str,
    /// Flag spellings accepted besides `--<name with dashes>`, without the dashes.
    pub also: &'static [&'static str],
    /// The value's placeholder in `--help`.
    pub value_name: Option<&'static str>,
    /// A list: the flag may repeat and the file may hold a YAML list.
    pub list: bool,
    pub default: fn() -> DefaultText,
}

impl Key {
    /// The key named `name`.
    pub fn named(name: &str) -> Option<&'static Key> {
        KEYS.iter().find(|key| key.name == name)
    }

    /// The flag's long name: `heartbeat-interval`.
    pub fn flag(&self) -> String {
        self.name.replace('_', "-")
    }

    /// The environment variable: `GANTRY_HEARTBEAT_INTERVAL`.
    pub fn env_var(&self) -> String {
        format!("GANTRY_{}", self.name.to_uppercase())
    }

    /// Every spelling of the flag, for messages: `--worker-name (or --name)`.
    fn flag_spellings(&self) -> String {
        let mut spellings = format!("--{}", self.flag());
        for also in self.also {
            spellings.push_str(&format!(" (or --{also})"));
        }
        spellings
    }

    /// The doc as plain text (`--help` has no code spans).
    pub fn plain_doc(&self) -> String {
        self.doc.trim().replace('`', "")
    }
}

/// Where a value came from, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Flag(String),
    Env(String),
    File(PathBuf),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Flag(flag) => write!(f, "flag {flag}"),
            Source::Env(var) => write!(f, "environment variable {var}"),
            Source::File(path) => write!(f, "config file {}", path.display()),
        }
    }
}

/// Raw values before parsing, from the three sources.
#[derive(Debug, Default)]
pub struct Layers {
    /// Values given as flags, by key.
    pub flags: BTreeMap<&'static str, String>,
    /// Environment lookup (injected so tests need not touch the process environment).
    pub env: BTreeMap<String, String>,
    /// The config file's values, by key, and its path.
    pub file: BTreeMap<String, String>,
    pub file_path: Option<PathBuf>,
}

impl Layers {
    /// The layers of this process: the `flags` from the command line, its `GANTRY_*`
    /// variables, and the file named by `--config` (`config_file`) or `GANTRY_CONFIG`.
    pub fn gather(
        config_file: Option<PathBuf>,
        flags: BTreeMap<&'static str, String>,
    ) -> anyhow::Result<Self> {
        let mut layers = Layers {
            flags,
            env: std::env::vars()
                .filter(|(name, _)| name.starts_with("GANTRY_"))
                .collect(),
            ..Default::default()
        };
        let config_file =
            config_file.or_else(|| std::env::var_os("GANTRY_CONFIG").map(PathBuf::from));
        if let Some(path) = &config_file {
            layers.load_file(path)?;
        }
        Ok(layers)
    }

    /// Reads the YAML file. Keys must be known; values must be scalars, or lists of
    /// scalars for list keys (joined with commas).
    pub fn load_file(&mut self, path: &Path) -> anyhow::Result<()> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("read config file {}", path.display()))?;
        let value: serde_norway::Value = serde_norway::from_str(&text)
            .with_context(|| format!("parse config file {} as YAML", path.display()))?;
        let mapping = match value {
            serde_norway::Value::Mapping(m) => m,
            serde_norway::Value::Null => Default::default(),
            _ => bail!(
                "config file {} must be a mapping of key: value",
                path.display()
            ),
        };
        for (key, value) in mapping {
            let name = match key {
                serde_norway::Value::String(k) => k,
                other => bail!(
                    "config file {}: key {other:?} is not a string",
                    path.display()
                ),
            };
            let Some(key) = Key::named(&name) else {
                let known: Vec<&str> = KEYS.iter().map(|key| key.name).collect();
                bail!(
                    "config file {}: unknown key {name:?}; remove it or use one of {}",
                    path.display(),
                    known.join(", ")
                );
            };
            let text = match &value {
                serde_norway::Value::Sequence(items) if key.list => items
                    .iter()
                    .map(scalar_text)
                    .collect::<Option<Vec<_>>>()
                    .map(|items| items.join(",")),
                other => scalar_text(other),
            }
            .ok_or_else(|| {
                let shape = if key.list {
                    "a value or a list of values"
                } else {
                    "a single value"
                };
                anyhow!("config file {}: key {name} must be {shape}", path.display())
            })?;
            self.file.insert(name, text);
        }
        self.file_path = Some(path.to_path_buf());
        Ok(())
    }

    /// The raw value of `key` from the highest-precedence source that has one.
    fn get(&self, name: &'static str) -> Option<(String, Source)> {
        let key = Key::named(name).expect("every key read comes from the table");
        if let Some(v) = self.flags.get(name) {
            return Some((v.clone(), Source::Flag(key.flag_spellings())));
        }
        let var = key.env_var();
        if let Some(v) = self.env.get(&var) {
            return Some((v.clone(), Source::Env(var)));
        }
        self.file.get(name).map(|v| {
            (
                v.clone(),
                Source::File(self.file_path.clone().unwrap_or_default()),
            )
        })
    }

    /// The value of `key` as its kind reads it, or the default when no source has one.
    fn value<K: kinds::Kind>(
        &self,
        key: &'static str,
        default: impl FnOnce() -> K::Value,
    ) -> anyhow::Result<K::Value> {
        match self.get(key) {
            None => Ok(default()),
            Some((raw, source)) => K::parse(raw.trim())
                .map_err(|e| anyhow!("invalid value {raw:?} for {key} (from {source}): {e}")),
        }
    }

    /// Resolves every key, then checks the rules that tie keys together.
    pub fn resolve(&self) -> anyhow::Result<Config> {
        let config = self.resolve_keys()?;
        config.check()?;
        Ok(config)
    }
}

impl Config {
    /// Rules between keys.
    fn check(&self) -> anyhow::Result<()> {
        if self.heartbeat_interval >= self.server_timeout {
            bail!(
                "heartbeat_interval ({}) must be shorter than server_timeout ({}); \
                 shorten the one or lengthen the other",
                gantry_types::units::format_duration(self.heartbeat_interval),
                gantry_types::units::format_duration(self.server_timeout)
            );
        }
        if self.scheduling_mode == SchedulingMode::Distributed
            && !self
                .database_url
                .as_deref()
                .is_some_and(|u| u.starts_with("postgres"))
        {
            bail!(
                "scheduling_mode distributed needs database_url to be a PostgreSQL URL; \
                 set database_url or use scheduling_mode auto"
            );
        }
        match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(_), None) => bail!(
                "tls_cert_file is set without tls_key_file; give both (or neither, for plain HTTP)"
            ),
            (None, Some(_)) => bail!(
                "tls_key_file is set without tls_cert_file; give both (or neither, for plain HTTP)"
            ),
            _ => {}
        }
        Ok(())
    }
}

fn scalar_text(value: &serde_norway::Value) -> Option<String> {
    use serde_norway::Value;
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Null => Some(String::new()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn layers() -> Layers {
        Layers::default()
    }

    #[test]
    fn defaults_apply_when_nothing_is_given() {
        let config = layers().resolve().unwrap();
        assert_eq!(config.port, gantry_server::config::DEFAULT_PORT);
        assert_eq!(config.heartbeat_interval, Duration::from_secs(15));
        assert_eq!(config.server_timeout, Duration::from_secs(60));
        assert_eq!(config.lock_timeout, Duration::from_secs(30));
        assert_eq!(config.schedule_lock_timeout, Duration::from_secs(60));
        assert!(config.distributed_scheduling);
        assert_eq!(config.scheduling_mode, SchedulingMode::Auto);
        assert_eq!(config.max_request_body, 1 << 20);
        assert_eq!(config.port_range, 40000..=40999);
        assert_eq!(config.database_url, None);
    }

    /// Each default, written as `--help` and the docs show it and given back as a
    /// variable, resolves to the same configuration: the shown defaults are the real ones.
    #[test]
    fn shown_defaults_read_back_as_the_defaults() {
        let mut l = layers();
        let mut rendered = 0;
        for key in KEYS {
            if let DefaultText::Value(text) = (key.default)() {
                l.env.insert(key.env_var(), text);
                rendered += 1;
            }
        }
        assert!(
            rendered * 2 > KEYS.len(),
            "most defaults are values: {rendered}"
        );
        let given = format!("{:?}", l.resolve().unwrap());
        let defaults = format!("{:?}", layers().resolve().unwrap());
        assert_eq!(given, defaults);
    }

    #[test]
    fn flag_beats_env_beats_file() {
        let mut l = layers();
        l.file.insert("port".into(), "1".into());
        assert_eq!(l.resolve().unwrap().port, 1);
        l.env.insert("GANTRY_PORT".into(), "2".into());
        assert_eq!(l.resolve().unwrap().port, 2);
        l.flags.insert("port", "3".into());
        assert_eq!(l.resolve().unwrap().port, 3);
    }

    #[test]
    fn invalid_values_name_the_key_and_source() {
        let mut l = layers();
        l.env
            .insert("GANTRY_HEARTBEAT_INTERVAL".into(), "soon".into());
        let err = l.resolve().unwrap_err().to_string();
        assert!(err.contains("heartbeat_interval"), "{err}");
        assert!(
            err.contains("environment variable GANTRY_HEARTBEAT_INTERVAL"),
            "{err}"
        );
        assert!(
            err.contains("15s, 2m or 1h 30m"),
            "says what to write: {err}"
        );

        let mut l = layers();
        l.flags.insert("worker_name", "Not A Name".into());
        let err = l.resolve().unwrap_err().to_string();
        assert!(
            err.contains("for worker_name (from flag --worker-name (or --name))"),
            "{err}"
        );

        let mut l = layers();
        l.file.insert("max_request_body".into(), "512".into());
        l.file_path = Some(PathBuf::from("/etc/gantry.yaml"));
        let err = l.resolve().unwrap_err().to_string();
        assert!(
            err.contains("max_request_body (from config file /etc/gantry.yaml)"),
            "{err}"
        );
        assert!(err.contains("at least 1KiB"), "{err}");
    }

    #[test]
    fn sizes_take_every_unit_form() {
        let mut l = layers();
        l.env
            .insert("GANTRY_GATEWAY_MAX_REQUEST_BODY".into(), "1.5GiB".into());
        l.file.insert("max_request_body".into(), "20G".into());
        let config = l.resolve().unwrap();
        assert_eq!(config.gateway_max_request_body, 3 << 29);
        assert_eq!(config.max_request_body, 20 << 30);
    }

    #[test]
    fn unknown_file_keys_are_rejected_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gantry.yaml");
        std::fs::write(&path, "port: 9000\nheartbeat_intervall: 5s\n").unwrap();
        let err = layers().load_file(&path).unwrap_err().to_string();
        assert!(err.contains("heartbeat_intervall"), "{err}");
        assert!(
            err.contains("heartbeat_interval,"),
            "lists the known keys: {err}"
        );
    }

    #[test]
    fn file_lists_become_comma_separated_for_list_keys_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gantry.yaml");
        std::fs::write(
            &path,
            "server_urls:\n  - http://a:8080\n  - http://b:8080/\nserver_timeout: 2m\n\
             labels: [gpu=a100, zone=b]\n",
        )
        .unwrap();
        let mut l = layers();
        l.load_file(&path).unwrap();
        let config = l.resolve().unwrap();
        assert_eq!(config.server_urls, ["http://a:8080", "http://b:8080"]);
        assert_eq!(config.server_timeout, Duration::from_secs(120));
        assert_eq!(config.labels.len(), 2);

        std::fs::write(&path, "port: [1, 2]\n").unwrap();
        let err = layers().load_file(&path).unwrap_err().to_string();
        assert!(err.contains("key port must be a single value"), "{err}");
    }

    #[test]
    fn worker_keys_parse() {
        let mut l = layers();
        l.flags.insert("labels", "gpu=a100, zone=b".into());
        l.env
            .insert("GANTRY_PORT_RANGE".into(), "41000-41010".into());
        l.env.insert("GANTRY_SIMULATE_GPUS".into(), "2x20G".into());
        let config = l.resolve().unwrap();
        assert_eq!(config.labels["gpu"], "a100");
        assert_eq!(config.labels["zone"], "b");
        assert_eq!(config.port_range, 41000..=41010);
        assert_eq!(config.simulate_gpus.map(|g| g.memory), Some(20 << 30));
        let mut bad = layers();
        bad.flags.insert("labels", "nokey".into());
        assert!(bad.resolve().unwrap_err().to_string().contains("labels"));
        let mut bad = layers();
        bad.env
            .insert("GANTRY_SIMULATE_GPUS".into(), "4x80PB".into());
        let err = bad.resolve().unwrap_err().to_string();
        assert!(
            err.contains("simulate_gpus (from environment variable"),
            "{err}"
        );
    }

    #[test]
    fn heartbeat_must_be_shorter_than_timeout() {
        let mut l = layers();
        l.flags.insert("heartbeat_interval", "2m".into());
        assert!(l
            .resolve()
            .unwrap_err()
            .to_string()
            .contains("shorter than server_timeout"));
    }

    #[test]
    fn distributed_scheduling_needs_postgres() {
        let mut l = layers();
        l.flags.insert("scheduling_mode", "distributed".into());
        let err = l.resolve().unwrap_err().to_string();
        assert!(
            err.contains("needs database_url to be a PostgreSQL URL"),
            "{err}"
        );
        l.flags
            .insert("database_url", "postgres://db/gantry".into());
        assert!(l.resolve().is_ok());
    }

    #[test]
    fn keys_are_declared_once_with_distinct_flags() {
        let mut spellings: Vec<String> = KEYS
            .iter()
            .flat_map(|key| {
                std::iter::once(key.flag()).chain(key.also.iter().map(|s| (*s).to_owned()))
            })
            .collect();
        let count = spellings.len();
        spellings.sort();
        spellings.dedup();
        assert_eq!(spellings.len(), count, "a flag spelling is used twice");
        for key in KEYS {
            assert!(!key.plain_doc().is_empty(), "{} has no doc", key.name);
        }
    }
}
