//! Configuration loading: every key can come from a command-line flag, a `GANTRY_*`
//! environment variable, the YAML file given with `--config`, or the default — in that
//! order of precedence. Unknown keys in the file and invalid values anywhere stop
//! start-up with a message naming the key and where its value came from.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};

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

/// Every key the config file may hold. Flags and environment variables use the same
/// names (`--heartbeat-interval`, `GANTRY_HEARTBEAT_INTERVAL`).
pub const KEYS: &[&str] = &[
    "data_dir",
    "host",
    "port",
    "database_url",
    "jwt_secret",
    "bootstrap_password",
    "server_id",
    "server_urls",
    "scheduling_mode",
    "heartbeat_interval",
    "server_timeout",
    "lock_timeout",
    "distributed_scheduling",
    "schedule_lock_timeout",
    "max_request_body",
    "gateway_max_request_body",
    "log_level",
    "log_format",
    "token",
    "worker_name",
    "labels",
    "simulate_gpus",
    "worker_host",
    "worker_port",
    "advertise_host",
    "backend_host",
    "port_range",
    "llama_server_path",
    "vllm_path",
    "sglang_python",
    "stop_grace_period",
    "backend_ready_timeout",
];

/// How scheduling is shared between servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchedulingMode {
    /// This server schedules alone (single server, SQLite).
    Local,
    /// The elected leader schedules, with locks (several servers, PostgreSQL).
    Distributed,
    /// Distributed when the database is PostgreSQL, local otherwise.
    Auto,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// The resolved configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub data_dir: PathBuf,
    pub host: String,
    pub port: u16,
    pub database_url: Option<String>,
    pub jwt_secret: Option<String>,
    pub bootstrap_password: Option<String>,
    pub server_id: String,
    pub server_urls: Vec<String>,
    pub scheduling_mode: SchedulingMode,
    pub heartbeat_interval: Duration,
    pub server_timeout: Duration,
    pub lock_timeout: Duration,
    pub distributed_scheduling: bool,
    pub schedule_lock_timeout: Duration,
    pub max_request_body: usize,
    pub gateway_max_request_body: usize,
    pub log_level: String,
    pub log_format: LogFormat,
    /// Worker settings (used by `gantry worker` and `gantry start`).
    pub worker: WorkerSettings,
}

/// The worker's keys. Fields whose default depends on the command (`start` keeps
/// everything on loopback; `worker` serves other machines) are `None` when unset.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    pub token: Option<String>,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub simulate_gpus: Option<String>,
    pub host: String,
    pub port: u16,
    pub advertise_host: Option<String>,
    pub backend_host: Option<std::net::IpAddr>,
    pub port_range: (u16, u16),
    pub llama_server_path: Option<String>,
    pub vllm_path: Option<String>,
    pub sglang_python: Option<String>,
    pub stop_grace_period: Duration,
    pub backend_ready_timeout: Option<Duration>,
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
    /// Reads the YAML file. Keys must be known; values must be scalars or lists of
    /// scalars (joined with commas).
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
            let key = match key {
                serde_norway::Value::String(k) => k,
                other => bail!(
                    "config file {}: key {other:?} is not a string",
                    path.display()
                ),
            };
            if !KEYS.contains(&key.as_str()) {
                bail!(
                    "config file {}: unknown key {key:?}; known keys are {}",
                    path.display(),
                    KEYS.join(", ")
                );
            }
            let text = scalar_text(&value).ok_or_else(|| {
                anyhow!(
                    "config file {}: key {key} must be a scalar or a list of scalars",
                    path.display()
                )
            })?;
            self.file.insert(key, text);
        }
        self.file_path = Some(path.to_path_buf());
        Ok(())
    }

    fn get(&self, key: &'static str) -> Option<(String, Source)> {
        if let Some(v) = self.flags.get(key) {
            return Some((
                v.clone(),
                Source::Flag(format!("--{}", key.replace('_', "-"))),
            ));
        }
        let var = format!("GANTRY_{}", key.to_uppercase());
        if let Some(v) = self.env.get(&var) {
            return Some((v.clone(), Source::Env(var)));
        }
        self.file.get(key).map(|v| {
            (
                v.clone(),
                Source::File(self.file_path.clone().unwrap_or_default()),
            )
        })
    }

    fn parse<T>(
        &self,
        key: &'static str,
        default: impl FnOnce() -> T,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> anyhow::Result<T> {
        match self.get(key) {
            None => Ok(default()),
            Some((raw, source)) => parse(raw.trim())
                .map_err(|e| anyhow!("invalid value {raw:?} for {key} (from {source}): {e}")),
        }
    }

    /// Resolves every key.
    pub fn resolve(&self) -> anyhow::Result<Config> {
        let data_dir = self.parse("data_dir", default_data_dir, |s| {
            if s.is_empty() {
                Err("must not be empty".into())
            } else {
                Ok(PathBuf::from(s))
            }
        })?;
        let optional = |s: &str| {
            Ok(if s.is_empty() {
                None
            } else {
                Some(s.to_string())
            })
        };
        let database_url = self.parse(
            "database_url",
            || None,
            |s| {
                if s.is_empty() {
                    Ok(None)
                } else if s.starts_with("postgres://")
                    || s.starts_with("postgresql://")
                    || s.starts_with("sqlite:")
                {
                    Ok(Some(s.to_string()))
                } else {
                    Err("must start with postgres://, postgresql:// or sqlite:".into())
                }
            },
        )?;
        Ok(Config {
            host: self.parse(
                "host",
                || "0.0.0.0".to_string(),
                |s| {
                    if s.is_empty() {
                        Err("must not be empty".into())
                    } else {
                        Ok(s.to_string())
                    }
                },
            )?,
            port: self.parse(
                "port",
                || 8080,
                |s| {
                    s.parse::<u16>()
                        .map_err(|_| "must be a port number from 0 to 65535".to_string())
                },
            )?,
            jwt_secret: self.parse("jwt_secret", || None, optional)?,
            bootstrap_password: self.parse("bootstrap_password", || None, optional)?,
            server_id: self.parse("server_id", default_server_id, |s| {
                if s.is_empty() || s.len() > 128 {
                    Err("must be 1 to 128 characters".into())
                } else {
                    Ok(s.to_string())
                }
            })?,
            server_urls: self.parse("server_urls", Vec::new, parse_urls)?,
            scheduling_mode: self.parse(
                "scheduling_mode",
                || SchedulingMode::Auto,
                |s| match s {
                    "local" => Ok(SchedulingMode::Local),
                    "distributed" => Ok(SchedulingMode::Distributed),
                    "auto" => Ok(SchedulingMode::Auto),
                    _ => Err("must be local, distributed or auto".into()),
                },
            )?,
            heartbeat_interval: self.parse(
                "heartbeat_interval",
                || Duration::from_secs(15),
                parse_duration,
            )?,
            server_timeout: self.parse(
                "server_timeout",
                || Duration::from_secs(60),
                parse_duration,
            )?,
            lock_timeout: self.parse("lock_timeout", || Duration::from_secs(30), parse_duration)?,
            distributed_scheduling: self.parse("distributed_scheduling", || true, parse_bool)?,
            schedule_lock_timeout: self.parse(
                "schedule_lock_timeout",
                || Duration::from_secs(60),
                parse_duration,
            )?,
            max_request_body: self.parse("max_request_body", || 1024 * 1024, parse_size)?,
            gateway_max_request_body: self.parse(
                "gateway_max_request_body",
                || 32 * 1024 * 1024,
                parse_size,
            )?,
            log_level: self.parse("log_level", || "info".to_string(), |s| Ok(s.to_string()))?,
            log_format: self.parse(
                "log_format",
                || LogFormat::Text,
                |s| match s {
                    "text" => Ok(LogFormat::Text),
                    "json" => Ok(LogFormat::Json),
                    _ => Err("must be text or json".into()),
                },
            )?,
            worker: self.worker_settings(optional)?,
            data_dir,
            database_url,
        })
        .and_then(|config| {
            if config.heartbeat_interval >= config.server_timeout {
                bail!(
                    "heartbeat_interval ({}) must be shorter than server_timeout ({})",
                    humantime::format_duration(config.heartbeat_interval),
                    humantime::format_duration(config.server_timeout)
                );
            }
            if config.scheduling_mode == SchedulingMode::Distributed
                && !config
                    .database_url
                    .as_deref()
                    .is_some_and(|u| u.starts_with("postgres"))
            {
                bail!("scheduling_mode distributed needs database_url to be a PostgreSQL URL");
            }
            Ok(config)
        })
    }
}

impl Layers {
    fn worker_settings(
        &self,
        optional: impl Fn(&str) -> Result<Option<String>, String> + Copy,
    ) -> anyhow::Result<WorkerSettings> {
        Ok(WorkerSettings {
            token: self.parse("token", || None, optional)?,
            name: self.parse("worker_name", default_worker_name, |s| {
                if s.is_empty()
                    || s.len() > 63
                    || !s.chars().all(|c| {
                        c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.')
                    })
                {
                    Err("must be 1 to 63 lowercase letters, digits, '-', '_' or '.'".into())
                } else {
                    Ok(s.to_string())
                }
            })?,
            labels: self.parse("labels", BTreeMap::new, parse_labels)?,
            simulate_gpus: self.parse("simulate_gpus", || None, optional)?,
            host: self.parse(
                "worker_host",
                || "0.0.0.0".to_string(),
                |s| Ok(s.to_string()),
            )?,
            port: self.parse(
                "worker_port",
                || 10150,
                |s| {
                    s.parse::<u16>()
                        .map_err(|_| "must be a port number from 0 to 65535".to_string())
                },
            )?,
            advertise_host: self.parse("advertise_host", || None, optional)?,
            backend_host: self.parse(
                "backend_host",
                || None,
                |s| {
                    s.parse().map(Some).map_err(|_| {
                        "must be an IP address such as 0.0.0.0 or 127.0.0.1".to_string()
                    })
                },
            )?,
            port_range: self.parse(
                "port_range",
                || (40000, 40999),
                |s| {
                    let (low, high) = s.split_once('-').ok_or("must look like 40000-40999")?;
                    let low: u16 = low
                        .trim()
                        .parse()
                        .map_err(|_| "must look like 40000-40999")?;
                    let high: u16 = high
                        .trim()
                        .parse()
                        .map_err(|_| "must look like 40000-40999")?;
                    if low == 0 || low > high {
                        return Err("the first port must be positive and not above the last".into());
                    }
                    Ok((low, high))
                },
            )?,
            llama_server_path: self.parse("llama_server_path", || None, optional)?,
            vllm_path: self.parse("vllm_path", || None, optional)?,
            sglang_python: self.parse("sglang_python", || None, optional)?,
            stop_grace_period: self.parse(
                "stop_grace_period",
                || Duration::from_secs(30),
                parse_duration,
            )?,
            backend_ready_timeout: self.parse(
                "backend_ready_timeout",
                || None,
                |s| parse_duration(s).map(Some),
            )?,
        })
    }
}

/// `k=v,k2=v2`.
fn parse_labels(s: &str) -> Result<BTreeMap<String, String>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            pair.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .filter(|(k, _)| !k.is_empty())
                .ok_or_else(|| format!("{pair:?} is not key=value"))
        })
        .collect()
}

/// The hostname made into a valid worker name.
fn default_worker_name() -> String {
    let host = default_server_id().to_lowercase();
    let cleaned: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    let cleaned = cleaned.trim_start_matches(['-', '_', '.']).to_string();
    if cleaned.is_empty() {
        "worker".to_string()
    } else {
        cleaned
    }
}

fn scalar_text(value: &serde_norway::Value) -> Option<String> {
    use serde_norway::Value;
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Null => Some(String::new()),
        Value::Sequence(items) => items
            .iter()
            .map(|item| match item {
                Value::Sequence(_) | Value::Mapping(_) => None,
                other => scalar_text(other),
            })
            .collect::<Option<Vec<_>>>()
            .map(|parts| parts.join(",")),
        _ => None,
    }
}

/// `15s`, `2m`, `1h 30m`; a bare number is seconds. Must be positive.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let duration = match s.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => humantime::parse_duration(s)
            .map_err(|e| format!("{e}; write durations like 15s, 2m or 1h"))?,
    };
    if duration.is_zero() {
        return Err("must be longer than zero".into());
    }
    Ok(duration)
}

fn parse_bool(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err("must be true or false".into()),
    }
}

/// `1048576`, `512KiB`, `1MiB`, `10MB`.
fn parse_size(s: &str) -> Result<usize, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let number: usize = number
        .parse()
        .map_err(|_| "must be a size such as 1MiB".to_string())?;
    let multiplier = match unit.trim() {
        "" | "B" => 1,
        "KB" | "kB" => 1000,
        "KiB" => 1024,
        "MB" => 1_000_000,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        other => return Err(format!("unknown unit {other:?}; use B, KiB, MiB or GiB")),
    };
    let size = number.checked_mul(multiplier).ok_or("too large")?;
    if size < 1024 {
        return Err("must be at least 1KiB".into());
    }
    Ok(size)
}

fn parse_urls(s: &str) -> Result<Vec<String>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(|u| {
            if u.starts_with("http://") || u.starts_with("https://") {
                Ok(u.trim_end_matches('/').to_string())
            } else {
                Err(format!("{u:?} must start with http:// or https://"))
            }
        })
        .collect()
}

/// `/var/lib/gantry` for root, `~/.local/share/gantry` for everyone else.
pub fn default_data_dir() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/var/lib/gantry");
    }
    match std::env::var_os("HOME") {
        Some(home) => PathBuf::from(home).join(".local/share/gantry"),
        None => PathBuf::from(".gantry"),
    }
}

fn default_server_id() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "gantry-server".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layers() -> Layers {
        Layers::default()
    }

    #[test]
    fn defaults_apply_when_nothing_is_given() {
        let config = layers().resolve().unwrap();
        assert_eq!(config.port, 8080);
        assert_eq!(config.heartbeat_interval, Duration::from_secs(15));
        assert_eq!(config.server_timeout, Duration::from_secs(60));
        assert_eq!(config.lock_timeout, Duration::from_secs(30));
        assert_eq!(config.schedule_lock_timeout, Duration::from_secs(60));
        assert!(config.distributed_scheduling);
        assert_eq!(config.scheduling_mode, SchedulingMode::Auto);
        assert_eq!(config.max_request_body, 1 << 20);
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
        assert!(err.contains("GANTRY_HEARTBEAT_INTERVAL"), "{err}");
    }

    #[test]
    fn durations_and_sizes_parse() {
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert!(parse_duration("0s").is_err());
        assert_eq!(parse_size("2MiB").unwrap(), 2 << 20);
        assert!(parse_size("2XB").is_err());
    }

    #[test]
    fn unknown_file_keys_are_rejected_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gantry.yaml");
        std::fs::write(&path, "port: 9000\nheartbeat_intervall: 5s\n").unwrap();
        let err = layers().load_file(&path).unwrap_err().to_string();
        assert!(err.contains("heartbeat_intervall"), "{err}");
    }

    #[test]
    fn file_lists_become_comma_separated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gantry.yaml");
        std::fs::write(
            &path,
            "server_urls:\n  - http://a:8080\n  - http://b:8080/\nserver_timeout: 2m\n",
        )
        .unwrap();
        let mut l = layers();
        l.load_file(&path).unwrap();
        let config = l.resolve().unwrap();
        assert_eq!(config.server_urls, ["http://a:8080", "http://b:8080"]);
        assert_eq!(config.server_timeout, Duration::from_secs(120));
    }

    #[test]
    fn worker_keys_parse() {
        let mut l = layers();
        l.flags.insert("labels", "gpu=a100, zone=b".into());
        l.env
            .insert("GANTRY_PORT_RANGE".into(), "41000-41010".into());
        let worker = l.resolve().unwrap().worker;
        assert_eq!(worker.labels["gpu"], "a100");
        assert_eq!(worker.labels["zone"], "b");
        assert_eq!(worker.port_range, (41000, 41010));
        let mut bad = layers();
        bad.flags.insert("labels", "nokey".into());
        assert!(bad.resolve().unwrap_err().to_string().contains("labels"));
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
}
