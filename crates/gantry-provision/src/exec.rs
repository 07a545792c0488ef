//! `exec`: a command of yours makes, finds and deletes one machine, so any cloud or
//! on-premise system plugs in with a script. gantry runs the command (split like a shell
//! would, run without one) with `create`, `find` or `delete` added as its last argument,
//! writes one JSON object on its stdin and reads one from its stdout:
//!
//! * `create`: stdin holds `name`, `cluster_token`, `server_urls`, `instance_type`,
//!   `image`, `region`, `gpus`, `labels` and `user_data` (the set-up script a cloud-init
//!   machine can run as it is); stdout answers `{"external_id": "…", "address": "…"}`
//!   (`address` optional).
//! * `find`: stdin `{"name": "…"}`; stdout the same answer, or `null` (or nothing) when
//!   there is no such machine.
//! * `delete`: stdin `{"name": "…", "external_id": "…" or null}`; exit 0 once it is gone
//!   (also when it was gone already).
//!
//! A non-zero exit is a failure; its last lines of stderr are the message. The pool's
//! credentials, when it has any, are in the environment as `GANTRY_POOL_CREDENTIALS`.

use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use tokio::io::AsyncWriteExt;

use crate::{setup, Machine, MachineRequest, ProviderError};

/// How long one run may take: creating a machine can take minutes.
const RUN_TIMEOUT: Duration = Duration::from_secs(600);
/// How much of stderr a failure quotes.
const STDERR_TAIL: usize = 2000;

#[derive(Debug)]
pub struct Exec {
    argv: Vec<String>,
    credentials: Option<String>,
}

impl Exec {
    /// `command` split like a shell would, its program a file in `dir`; an error when it
    /// does not split (an unclosed quote), is empty, or names a path rather than a file
    /// of `dir`.
    pub fn new(
        dir: &std::path::Path,
        command: &str,
        credentials: Option<&str>,
    ) -> Result<Self, ProviderError> {
        let mut argv = shlex::split(command)
            .filter(|argv| !argv.is_empty())
            .ok_or_else(|| {
                ProviderError(format!(
                    "the pool's command {command:?} does not split into words (an unclosed quote?)"
                ))
            })?;
        if argv[0].contains('/') || argv[0].starts_with('.') {
            return Err(ProviderError(format!(
                "the pool's program {:?} must be the name of a file in {}",
                argv[0],
                dir.display()
            )));
        }
        argv[0] = dir.join(&argv[0]).display().to_string();
        Ok(Self {
            argv,
            credentials: credentials.map(str::to_owned),
        })
    }

    /// The program this pool runs.
    pub fn program(&self) -> &str {
        &self.argv[0]
    }

    async fn run(
        &self,
        action: &str,
        input: serde_json::Value,
    ) -> Result<Option<serde_json::Value>, ProviderError> {
        let program = &self.argv[0];
        let mut command = tokio::process::Command::new(program);
        command
            .args(&self.argv[1..])
            .arg(action)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(credentials) = &self.credentials {
            command.env("GANTRY_POOL_CREDENTIALS", credentials);
        }
        let mut child = command
            .spawn()
            .map_err(|e| ProviderError(format!("cannot run the pool's command {program}: {e}")))?;
        if let Some(mut stdin) = child.stdin.take() {
            let text = input.to_string();
            // A command that does not read its stdin closes it early; that is its business.
            let _ = stdin.write_all(text.as_bytes()).await;
        }
        let output = tokio::time::timeout(RUN_TIMEOUT, child.wait_with_output())
            .await
            .map_err(|_| {
                ProviderError(format!(
                    "the pool's command `{program} {action}` did not finish within {} s",
                    RUN_TIMEOUT.as_secs()
                ))
            })?
            .map_err(|e| ProviderError(format!("the pool's command {program} failed: {e}")))?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let tail: String = stderr
                .trim()
                .chars()
                .rev()
                .take(STDERR_TAIL)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            return Err(ProviderError(format!(
                "`{program} {action}` exited with {}: {}",
                output.status,
                if tail.is_empty() {
                    "no message on stderr"
                } else {
                    &tail
                }
            )));
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stdout = stdout.trim();
        if stdout.is_empty() {
            return Ok(None);
        }
        serde_json::from_str(stdout).map(Some).map_err(|e| {
            ProviderError(format!(
                "`{program} {action}` printed {stdout:?}, not a JSON object: {e}"
            ))
        })
    }

    fn machine(
        action: &str,
        answer: Option<serde_json::Value>,
    ) -> Result<Option<Machine>, ProviderError> {
        match answer {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(value) => serde_json::from_value(value.clone()).map(Some).map_err(|e| {
                ProviderError(format!(
                    "`{action}` answered {value}, not {{\"external_id\": \"…\", \"address\": \"…\"}}: {e}"
                ))
            }),
        }
    }

    pub async fn find(&self, name: &str) -> Result<Option<Machine>, ProviderError> {
        let answer = self.run("find", json!({ "name": name })).await?;
        Self::machine("find", answer)
    }

    pub async fn create(&self, request: &MachineRequest) -> Result<Machine, ProviderError> {
        let mut input = serde_json::to_value(request)
            .map_err(|e| ProviderError(format!("cannot write the machine's request: {e}")))?;
        input["user_data"] = json!(setup::user_data(request));
        let answer = self.run("create", input).await?;
        Self::machine("create", answer)?.ok_or_else(|| {
            ProviderError("`create` printed nothing; it must print the machine it made".into())
        })
    }

    pub async fn delete(&self, name: &str, external_id: Option<&str>) -> Result<(), ProviderError> {
        self.run(
            "delete",
            json!({ "name": name, "external_id": external_id }),
        )
        .await?;
        Ok(())
    }
}
