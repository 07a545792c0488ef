//! The `custom` backend: a command template the model (or the worker's configuration)
//! brings, with the placeholders `{model_path}`, `{port}`, `{gpu_ids}` and `{host}`, followed
//! by the model's arguments. Healthy when the configured health path (default `/health`)
//! answers 200.
//!
//! A custom command is opaque to gantry, so it cannot estimate what it needs: the model
//! declares it in its environment ([`declared_claim`]). A placement adds no flags; the
//! command gets its GPUs through `{gpu_ids}` and `CUDA_VISIBLE_DEVICES`.

use std::collections::BTreeMap;

use gantry_types::{BackendKind, FixedMemory, ModelMemory, ResourceClaim};

use crate::command::{
    join_gpu_indexes, path_str, BackendError, BackendSettings, LaunchSpec, LaunchTarget,
};
use crate::Backend;

/// Environment variable of a `custom` model: GPUs one instance needs on one worker (default
/// 1; 0 for a CPU-only command).
pub const GPU_COUNT_ENV: &str = "GANTRY_GPU_COUNT";
/// Environment variable of a `custom` model: memory the process needs on each of its GPUs,
/// everything included, e.g. `20GiB`, `512MiB`, `16G`, or bytes (default 0).
pub const GPU_MEMORY_ENV: &str = "GANTRY_GPU_MEMORY";
/// Environment variable of a `custom` model: host RAM the process needs (default 0).
pub const RAM_ENV: &str = "GANTRY_RAM";

/// The placeholders a command template may use.
pub const PLACEHOLDERS: [&str; 4] = ["model_path", "port", "gpu_ids", "host"];

/// A command of the user's own.
#[derive(Debug, Clone, Copy)]
pub struct Custom;

impl Backend for Custom {
    fn kind(&self) -> BackendKind {
        BackendKind::Custom
    }

    /// No program of its own: the template is the command.
    fn default_program(&self) -> Vec<String> {
        Vec::new()
    }

    fn argv(
        &self,
        settings: &BackendSettings,
        spec: &LaunchSpec,
        target: &LaunchTarget<'_>,
    ) -> Result<Vec<String>, BackendError> {
        let template = spec
            .custom_command
            .as_deref()
            .or(settings.custom_command.as_deref())
            .ok_or(BackendError::MissingCustomCommand)?;
        fill_template(
            template,
            &PlaceholderValues {
                model_path: path_str(&spec.model_path)?,
                port: &target.port.to_string(),
                gpu_ids: &join_gpu_indexes(target.gpu_indexes),
                host: &target.bind_host.to_string(),
            },
        )
    }

    fn health_path<'a>(&self, settings: &'a BackendSettings) -> &'a str {
        &settings.custom_health_path
    }
}

/// The values substituted into a command template.
#[derive(Debug, Clone, Copy)]
pub struct PlaceholderValues<'a> {
    pub model_path: &'a str,
    pub port: &'a str,
    /// Comma-joined GPU indexes, empty for CPU.
    pub gpu_ids: &'a str,
    pub host: &'a str,
}

/// Splits `template` into words with POSIX shell quoting rules (no shell runs: no
/// variables, globs, pipes or redirections) and then replaces `{model_path}`, `{port}`,
/// `{gpu_ids}` and `{host}` inside each word. Substituting after splitting keeps a value
/// with spaces or quotes in one word. Any other `{identifier}` is an error, so a typo does
/// not reach the backend; braces that do not enclose an identifier (JSON, say) are kept.
pub fn fill_template(
    template: &str,
    values: &PlaceholderValues<'_>,
) -> Result<Vec<String>, BackendError> {
    let words = shlex::split(template).ok_or_else(|| BackendError::UnparsableTemplate {
        template: template.to_owned(),
    })?;
    if words.is_empty() {
        return Err(BackendError::EmptyTemplate);
    }
    words
        .iter()
        .map(|word| substitute_placeholders(word, values))
        .collect()
}

fn substitute_placeholders(
    word: &str,
    values: &PlaceholderValues<'_>,
) -> Result<String, BackendError> {
    let mut out = String::with_capacity(word.len());
    let mut rest = word;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let name_len = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        let name = &after[..name_len];
        let closes = after[name_len..].starts_with('}');
        if closes && !name.is_empty() {
            let value = match name {
                "model_path" => values.model_path,
                "port" => values.port,
                "gpu_ids" => values.gpu_ids,
                "host" => values.host,
                _ => {
                    return Err(BackendError::UnknownPlaceholder {
                        name: name.to_owned(),
                    })
                }
            };
            out.push_str(value);
            rest = &after[name_len + 1..];
        } else {
            out.push('{');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// What a `custom` model declares it needs, from its environment: [`GPU_COUNT_ENV`] GPUs
/// (default 1) with [`GPU_MEMORY_ENV`] each (default 0: the scheduler then only checks that
/// the GPUs exist), and [`RAM_ENV`] of RAM (default 0). The error names the variable.
pub fn declared_claim(env: &BTreeMap<String, String>) -> Result<ResourceClaim, String> {
    let gpu_count = match env.get(GPU_COUNT_ENV) {
        None => 1,
        Some(text) => text
            .trim()
            .parse::<u32>()
            .map_err(|_| format!("env.{GPU_COUNT_ENV}: {text:?} is not a GPU count"))?,
    };
    let size = |key: &str| -> Result<u64, String> {
        match env.get(key) {
            None => Ok(0),
            Some(text) => {
                gantry_types::units::parse_size(text).map_err(|e| format!("env.{key}: {e}"))
            }
        }
    };
    Ok(ResourceClaim {
        per_gpu_overhead_bytes: 0,
        base_ram_bytes: size(RAM_ENV)?,
        memory: ModelMemory::Fixed(FixedMemory {
            gpu_count,
            bytes_per_gpu: size(GPU_MEMORY_ENV)?,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::backend_command;
    use crate::command::tests::{argv, spec, target};

    const GIB: u64 = 1 << 30;

    #[test]
    fn the_template_is_split_without_a_shell_and_filled_in() {
        let mut spec = spec(BackendKind::Custom, "/models/my model.bin");
        spec.args = vec!["--extra".into()];
        let settings = BackendSettings {
            custom_command: Some(
                r#"/usr/bin/env python3 "/srv/my server.py" --model={model_path} --listen '{host}:{port}' --gpus {gpu_ids} --json '{"a": 1}' $HOME"#
                    .into(),
            ),
            ..BackendSettings::default()
        };
        let command = backend_command(&spec, &settings, &target(&[0, 2])).unwrap();
        assert_eq!(
            argv(&command),
            [
                "/usr/bin/env",
                "python3",
                "/srv/my server.py",
                "--model=/models/my model.bin",
                "--listen",
                "127.0.0.1:40001",
                "--gpus",
                "0,2",
                "--json",
                r#"{"a": 1}"#,
                "$HOME",
                "--extra"
            ]
        );
        assert_eq!(command.health_path, "/health");
    }

    #[test]
    fn the_models_template_and_health_path_win_over_the_workers() {
        let mut spec = spec(BackendKind::Custom, "/m");
        spec.custom_command = Some("serve --port {port}".into());
        spec.health_path = Some("/ready".into());
        let settings = BackendSettings {
            custom_command: Some("other".into()),
            custom_health_path: "/healthz".into(),
            ..BackendSettings::default()
        };
        let command = backend_command(&spec, &settings, &target(&[])).unwrap();
        assert_eq!(argv(&command), ["serve", "--port", "40001"]);
        assert_eq!(command.health_path, "/ready");
        spec.health_path = None;
        let command = backend_command(&spec, &settings, &target(&[])).unwrap();
        assert_eq!(command.health_path, "/healthz");
    }

    #[test]
    fn template_errors_name_the_problem() {
        let spec = spec(BackendKind::Custom, "/m");
        let with = |template: &str| BackendSettings {
            custom_command: Some(template.into()),
            ..BackendSettings::default()
        };
        assert_eq!(
            backend_command(&spec, &BackendSettings::default(), &target(&[])).unwrap_err(),
            BackendError::MissingCustomCommand
        );
        assert!(matches!(
            backend_command(&spec, &with("serve 'unbalanced"), &target(&[])),
            Err(BackendError::UnparsableTemplate { .. })
        ));
        assert_eq!(
            backend_command(&spec, &with("  "), &target(&[])).unwrap_err(),
            BackendError::EmptyTemplate
        );
        assert_eq!(
            backend_command(&spec, &with("serve {model}"), &target(&[])).unwrap_err(),
            BackendError::UnknownPlaceholder {
                name: "model".into()
            }
        );
    }

    #[test]
    fn claims_are_declared_in_the_environment() {
        let mut env = BTreeMap::new();
        let claim = declared_claim(&env).expect("defaults");
        assert_eq!(
            claim.memory,
            ModelMemory::Fixed(FixedMemory {
                gpu_count: 1,
                bytes_per_gpu: 0
            })
        );
        env.insert(GPU_COUNT_ENV.to_owned(), "2".to_owned());
        env.insert(GPU_MEMORY_ENV.to_owned(), "20GiB".to_owned());
        env.insert(RAM_ENV.to_owned(), "512 MiB".to_owned());
        let claim = declared_claim(&env).expect("declared");
        assert_eq!(
            claim.memory,
            ModelMemory::Fixed(FixedMemory {
                gpu_count: 2,
                bytes_per_gpu: 20 * GIB
            })
        );
        assert_eq!(claim.base_ram_bytes, 512 * 1024 * 1024);
        env.insert(GPU_MEMORY_ENV.to_owned(), "lots".to_owned());
        let e = declared_claim(&env).expect_err("not a size");
        assert!(e.contains(GPU_MEMORY_ENV), "{e}");
    }
}
