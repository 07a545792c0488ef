//! What an installation reports while it runs: the phase, the percent of a build parsed
//! from cmake's output, download bytes, and the last lines of the running tool, published
//! on the caller's watch channel; every line also goes to the installation's log files.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;

use gantry_types::{InstallProgress, INSTALL_LOG_TAIL_LINES};
use tokio::sync::watch;

use crate::InstallError;

/// The phases an installation goes through (`InstallProgress::phase`).
pub(crate) mod phase {
    /// Another process or task holds the lock for the same version or destination.
    pub const WAITING: &str = "waiting";
    pub const DOWNLOADING: &str = "downloading";
    /// Unpacking sources and running cmake's configure step.
    pub const CONFIGURING: &str = "configuring";
    /// Compiling; `percent` follows cmake's `[ 42%]` lines.
    pub const BUILDING: &str = "building";
    /// pip or apt-get at work.
    pub const INSTALLING_PACKAGES: &str = "installing packages";
    /// Putting the result into the destination.
    pub const COPYING: &str = "copying";
}

/// The last lines of output, at most [`INSTALL_LOG_TAIL_LINES`].
#[derive(Debug, Default)]
pub(crate) struct LogTail {
    lines: VecDeque<String>,
}

impl LogTail {
    pub(crate) fn push(&mut self, line: String) {
        if self.lines.len() == INSTALL_LOG_TAIL_LINES {
            self.lines.pop_front();
        }
        self.lines.push_back(line);
    }

    pub(crate) fn lines(&self) -> Vec<String> {
        self.lines.iter().cloned().collect()
    }
}

/// The percent a build output line announces: cmake's Makefile generator prints
/// `[ 42%] Building CXX object …`, Ninja prints `[12/345] Building CXX object …`.
pub(crate) fn parse_build_percent(line: &str) -> Option<u8> {
    let line = strip_ansi(line);
    let rest = line.trim_start().strip_prefix('[')?;
    let (inside, _) = rest.split_once(']')?;
    let inside = inside.trim();
    if let Some(number) = inside.strip_suffix('%') {
        let percent: u8 = number.trim().parse().ok()?;
        return (percent <= 100).then_some(percent);
    }
    let (done, total) = inside.split_once('/')?;
    let done: u64 = done.trim().parse().ok()?;
    let total: u64 = total.trim().parse().ok()?;
    if total == 0 || done > total {
        return None;
    }
    u8::try_from(done * 100 / total).ok()
}

/// `line` without ANSI escape sequences (`ESC [ … letter`), which a tool that believes it
/// writes to a terminal puts around its progress.
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Publishes one installation's progress on the caller's watch channel and writes every
/// line of output to the log files it was given.
pub(crate) struct Reporter<'a> {
    sender: &'a watch::Sender<InstallProgress>,
    progress: InstallProgress,
    tail: LogTail,
    /// `dest/install.log`, and a build's own `build.log` while one runs. Best effort: the
    /// logs are for diagnosis, and a disk too full to write them makes the tool itself
    /// fail with a message of its own.
    logs: Vec<File>,
}

impl<'a> Reporter<'a> {
    pub(crate) fn new(
        sender: &'a watch::Sender<InstallProgress>,
        backend: &str,
        version: &str,
    ) -> Self {
        Self {
            sender,
            progress: InstallProgress {
                backend: backend.to_owned(),
                version: version.to_owned(),
                ..InstallProgress::default()
            },
            tail: LogTail::default(),
            logs: Vec::new(),
        }
    }

    pub(crate) fn backend(&self) -> &str {
        &self.progress.backend
    }

    pub(crate) fn version(&self) -> &str {
        &self.progress.version
    }

    /// Enters `phase` (a no-op when already in it): percent and bytes start afresh.
    pub(crate) fn phase(&mut self, phase: &str) {
        if self.progress.phase == phase {
            return;
        }
        tracing::info!(
            backend = %self.progress.backend,
            version = %self.progress.version,
            phase,
            "install phase"
        );
        self.progress.phase = phase.to_owned();
        self.progress.percent = None;
        self.progress.bytes_done = 0;
        self.progress.bytes_total = None;
        self.publish();
    }

    /// One line of a tool's output. A line redrawn with carriage returns (a progress bar)
    /// counts as its last drawing.
    pub(crate) fn line(&mut self, raw: &str) {
        let raw = raw.trim_end_matches(['\n', '\r']);
        self.write_logs(raw);
        let shown = raw.rsplit('\r').next().unwrap_or(raw);
        if self.progress.phase == phase::BUILDING {
            if let Some(percent) = parse_build_percent(shown) {
                self.progress.percent = Some(percent);
            }
        }
        self.tail.push(shown.to_owned());
        self.publish();
    }

    /// A line of the installer's own (what it is about to do), shown like a tool's line.
    pub(crate) fn note(&mut self, message: &str) {
        self.line(&format!("gantry-install: {message}"));
    }

    pub(crate) fn bytes(&mut self, done: u64, total: Option<u64>) {
        self.progress.bytes_done = done;
        self.progress.bytes_total = total;
        if let Some(total) = total.filter(|total| *total > 0) {
            let percent = (done.min(total) * 100 / total) as u8;
            self.progress.percent = Some(percent);
        }
        self.publish();
    }

    pub(crate) fn tail(&self) -> Vec<String> {
        self.tail.lines()
    }

    /// An error carrying the current log tail.
    pub(crate) fn fail(&self, message: impl Into<String>) -> InstallError {
        InstallError::with_tail(message, self.tail())
    }

    pub(crate) fn push_log(&mut self, file: File) {
        self.logs.push(file);
    }

    pub(crate) fn pop_log(&mut self) {
        self.logs.pop();
    }

    fn write_logs(&mut self, line: &str) {
        for log in &mut self.logs {
            let _ = writeln!(log, "{line}");
        }
    }

    fn publish(&self) {
        let mut progress = self.progress.clone();
        progress.log_tail = self.tail.lines();
        self.sender.send_replace(progress);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmake_makefile_percent_lines_parse() {
        assert_eq!(
            parse_build_percent("[ 42%] Building CXX object src/CMakeFiles/llama.dir/llama.cpp.o"),
            Some(42)
        );
        assert_eq!(
            parse_build_percent("[  3%] Built target ggml-base"),
            Some(3)
        );
        assert_eq!(
            parse_build_percent("[100%] Linking CXX executable ../../bin/llama-server"),
            Some(100)
        );
        assert_eq!(
            parse_build_percent("\u{1b}[32m[ 57%] \u{1b}[0mBuilding C object ggml.c.o"),
            Some(57)
        );
    }

    #[test]
    fn ninja_counter_lines_parse_as_percent() {
        assert_eq!(
            parse_build_percent("[12/48] Building CXX object x.o"),
            Some(25)
        );
        assert_eq!(
            parse_build_percent("[48/48] Linking CXX executable"),
            Some(100)
        );
    }

    #[test]
    fn other_lines_have_no_percent() {
        for line in [
            "",
            "-- Configuring done",
            "make[2]: Entering directory '/tmp/build'",
            "[101%] nonsense",
            "[x%] nonsense",
            "[3/0] nonsense",
            "[5/3] nonsense",
            "warning: [ 42%] in the middle of a line",
        ] {
            assert_eq!(parse_build_percent(line), None, "{line:?}");
        }
    }

    #[test]
    fn log_tail_keeps_the_last_lines_in_order() {
        let mut tail = LogTail::default();
        for index in 0..INSTALL_LOG_TAIL_LINES + 5 {
            tail.push(format!("line {index}"));
        }
        let lines = tail.lines();
        assert_eq!(lines.len(), INSTALL_LOG_TAIL_LINES);
        assert_eq!(lines[0], "line 5");
        assert_eq!(
            lines.last().map(String::as_str),
            Some(format!("line {}", INSTALL_LOG_TAIL_LINES + 4).as_str())
        );
    }

    #[test]
    fn reporter_tracks_build_percent_and_redrawn_lines() {
        let (sender, receiver) = watch::channel(InstallProgress::default());
        let mut reporter = Reporter::new(&sender, "llama.cpp", "1.0");
        reporter.phase(phase::CONFIGURING);
        reporter.line("[ 10%] ignored outside a build\n");
        assert_eq!(receiver.borrow().percent, None);
        reporter.phase(phase::BUILDING);
        reporter.line("[ 42%] Building CXX object a.o\n");
        assert_eq!(receiver.borrow().percent, Some(42));
        reporter.line("Collecting pkg\r 10%\r 55% done\n");
        let progress = receiver.borrow().clone();
        assert_eq!(progress.backend, "llama.cpp");
        assert_eq!(progress.phase, "building");
        assert_eq!(progress.percent, Some(42));
        assert_eq!(
            progress.log_tail.last().map(String::as_str),
            Some(" 55% done")
        );
        reporter.phase(phase::COPYING);
        assert_eq!(receiver.borrow().percent, None);
    }
}
