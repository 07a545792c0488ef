//! Running the tools an installation needs (tar, cmake, apt-get, python, pip): their
//! output line by line into the [`Reporter`], each in a process group of its own that is
//! killed as a whole when the installation is cancelled or dropped, so a cancelled build
//! leaves no compiler running.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use crate::progress::Reporter;
use crate::InstallError;

/// How long `<binary> --version` may take before the binary counts as broken.
const VERSION_CHECK_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `command` to completion, its stdout and stderr reported line by line. `what` names
/// the step in errors ("cmake build"); `hint` says what to do when it fails.
pub(crate) async fn run_tool(
    reporter: &mut Reporter<'_>,
    cancel: &CancellationToken,
    mut command: Command,
    what: &str,
    hint: &str,
) -> Result<(), InstallError> {
    reporter.note(&format!("running {}", command_line(&command)));
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let program = command
        .as_std()
        .get_program()
        .to_string_lossy()
        .into_owned();
    let mut child = command.spawn().map_err(|error| {
        reporter.fail(format!("cannot start {what} ({program}): {error}; {hint}"))
    })?;
    let mut group = GroupGuard(child.id().map(|id| Pid::from_raw(id as i32)));
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout is piped"));
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr is piped"));
    let (mut stdout_line, mut stderr_line) = (Vec::new(), Vec::new());
    let (mut stdout_open, mut stderr_open) = (true, true);
    // read_until keeps what it read in the buffer when another branch wins, so no output
    // is lost between iterations.
    while stdout_open || stderr_open {
        tokio::select! {
            _ = cancel.cancelled() => {
                group.kill();
                let _ = child.wait().await;
                group.0 = None;
                return Err(InstallError::cancelled(what));
            }
            read = stdout.read_until(b'\n', &mut stdout_line), if stdout_open => {
                stdout_open = forward_line(reporter, read, &mut stdout_line);
            }
            read = stderr.read_until(b'\n', &mut stderr_line), if stderr_open => {
                stderr_open = forward_line(reporter, read, &mut stderr_line);
            }
        }
    }
    let status = tokio::select! {
        status = child.wait() => status,
        _ = cancel.cancelled() => {
            group.kill();
            let _ = child.wait().await;
            group.0 = None;
            return Err(InstallError::cancelled(what));
        }
    };
    // The leader is reaped: its process group id may be reused from now on.
    group.0 = None;
    let status =
        status.map_err(|error| reporter.fail(format!("cannot wait for {what}: {error}")))?;
    if !status.success() {
        return Err(reporter.fail(format!("{what} failed ({status}); {hint}")));
    }
    Ok(())
}

/// Sends a complete line to the reporter; false once the stream has ended.
fn forward_line(
    reporter: &mut Reporter<'_>,
    read: std::io::Result<usize>,
    line: &mut Vec<u8>,
) -> bool {
    match read {
        Ok(0) | Err(_) => {
            if !line.is_empty() {
                reporter.line(&String::from_utf8_lossy(line));
                line.clear();
            }
            false
        }
        Ok(_) => {
            reporter.line(&String::from_utf8_lossy(line));
            line.clear();
            true
        }
    }
}

/// Kills a child's whole process group (make's and the compilers' processes with it) when
/// dropped while still armed, so dropping an installation's future stops its build too.
struct GroupGuard(Option<Pid>);

impl GroupGuard {
    fn kill(&mut self) {
        if let Some(group) = self.0 {
            let _ = killpg(group, Signal::SIGKILL);
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The program and its arguments as one line, for the log.
fn command_line(command: &Command) -> String {
    let command = command.as_std();
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(OsStr::to_string_lossy)
        .collect::<Vec<_>>()
        .join(" ")
}

/// What `<program> <args>` prints on stdout, if it runs and exits 0 in time.
pub(crate) async fn capture_stdout(program: &Path, args: &[&str]) -> Option<String> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(VERSION_CHECK_TIMEOUT, output).await {
        Ok(Ok(output)) if output.status.success() => {
            Some(String::from_utf8_lossy(&output.stdout).into_owned())
        }
        _ => None,
    }
}

/// Whether `binary` is an executable that answers `--version` (the script's
/// `binary_works`): a cached binary that does not is rebuilt.
pub(crate) async fn binary_works(binary: &Path) -> bool {
    if !is_executable(binary) {
        return false;
    }
    let status = Command::new(binary)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .status();
    matches!(
        tokio::time::timeout(VERSION_CHECK_TIMEOUT, status).await,
        Ok(Ok(status)) if status.success()
    )
}

/// `name` as the shell would find it on `PATH`.
pub(crate) fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

pub(crate) fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|metadata| metadata.is_file() && metadata.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Sleeps `duration` unless cancelled first (then an error naming `what`).
pub(crate) async fn sleep_or_cancel(
    duration: Duration,
    cancel: &CancellationToken,
    what: &str,
) -> Result<(), InstallError> {
    tokio::select! {
        _ = tokio::time::sleep(duration) => Ok(()),
        _ = cancel.cancelled() => Err(InstallError::cancelled(what)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_types::InstallProgress;
    use tokio::sync::watch;

    #[tokio::test]
    async fn run_tool_reports_both_streams_and_fails_with_the_tail() {
        let (sender, receiver) = watch::channel(InstallProgress::default());
        let mut reporter = Reporter::new(&sender, "test", "1");
        let mut command = Command::new("sh");
        command.args(["-c", "echo out; echo err >&2; printf 'no newline'; exit 3"]);
        let error = run_tool(
            &mut reporter,
            &CancellationToken::new(),
            command,
            "the test tool",
            "fix it",
        )
        .await
        .expect_err("the tool exits 3");
        assert!(
            error.message.starts_with("the test tool failed ("),
            "{error}"
        );
        assert!(error.message.ends_with("; fix it"), "{error}");
        for line in ["out", "err", "no newline"] {
            assert!(error.log_tail.iter().any(|l| l == line), "{error}");
        }
        assert_eq!(receiver.borrow().log_tail, error.log_tail);
    }

    #[tokio::test]
    async fn cancelling_kills_the_whole_process_group() {
        let (sender, _receiver) = watch::channel(InstallProgress::default());
        let mut reporter = Reporter::new(&sender, "test", "1");
        let marker = tempfile::tempdir().expect("temp dir");
        let pid_file = marker.path().join("grandchild.pid");
        // The grandchild is what must die too: a compiler under make under cmake.
        let script = format!(
            "sleep 300 & echo $! > {}; echo started; wait",
            pid_file.display()
        );
        let mut command = Command::new("sh");
        command.args(["-c", &script]);
        let cancel = CancellationToken::new();
        let canceller = cancel.clone();
        let pid_file_for_task = pid_file.clone();
        tokio::spawn(async move {
            while !pid_file_for_task.exists() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            canceller.cancel();
        });
        let error = run_tool(&mut reporter, &cancel, command, "sleeping", "")
            .await
            .expect_err("cancelled");
        assert_eq!(error.message, "sleeping was cancelled");
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .expect("pid file")
            .trim()
            .parse()
            .expect("a pid");
        // SIGKILL is asynchronous; the grandchild is gone (or a zombie of init) shortly.
        let mut alive = true;
        for _ in 0..100 {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().next());
            if stat.is_empty() || state == Some("Z") {
                alive = false;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!alive, "the grandchild {pid} survived the cancellation");
    }
}
