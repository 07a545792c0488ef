//! Backend log files and the in-memory stderr tail.
//!
//! Every start of an instance writes the stdout and stderr of its process(es) to a new file
//! `<data_dir>/logs/<key>/<start-n>.log`, where `<key>` is the instance key made safe for a
//! file name ([`sanitize_key`]) and `n` counts up from 1 across restarts and across worker
//! runs (the next number is one past the highest on disk). Only the newest
//! [`LogConfig::files_kept`] files are kept. A file stops growing at
//! [`LogConfig::max_file_bytes`]; one marker line says where it was cut, so a chatty backend
//! can never fill the disk. Lines of a data-parallel group share one file, each prefixed with
//! `[rank r] `.
//!
//! Writes are plain blocking writes of whole lines to a local file under a mutex: they land
//! in the page cache in microseconds, which is cheaper than a hop to the blocking pool for
//! each line.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Log settings of the supervisor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// A log file stops growing at this size (default 16 MiB).
    pub max_file_bytes: u64,
    /// How many log files (starts) are kept per instance, newest first (default 5).
    pub files_kept: usize,
    /// How many stderr lines are kept in memory for error messages (default 20).
    pub stderr_tail_lines: usize,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            max_file_bytes: 16 * 1024 * 1024,
            files_kept: 5,
            stderr_tail_lines: 20,
        }
    }
}

/// The longest key part of a log directory name.
const MAX_KEY_LEN: usize = 120;

/// Makes an instance key such as `qwen-7b#0` safe as one path component: every byte other
/// than ASCII letters, digits, `-`, `_` and `.` becomes `_`, a leading `.` becomes `_` (no
/// hidden files, no `..`), and the result is at most 120 bytes and never empty.
pub fn sanitize_key(key: &str) -> String {
    let mut out: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.starts_with('.') {
        out.replace_range(0..1, "_");
    }
    out.truncate(MAX_KEY_LEN);
    if out.is_empty() {
        out.push('_');
    }
    out
}

/// One log file of an instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogFile {
    /// The start number `n` of `<n>.log`.
    pub start: u64,
    pub path: PathBuf,
    pub bytes: u64,
}

/// The log directory of one instance key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogDir {
    dir: PathBuf,
}

impl LogDir {
    /// `<data_dir>/logs/<sanitised key>`; nothing is created yet.
    pub fn new(data_dir: &Path, key: &str) -> Self {
        Self {
            dir: data_dir.join("logs").join(sanitize_key(key)),
        }
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The log files on disk, oldest first. A missing directory is an empty list.
    pub fn files(&self) -> io::Result<Vec<LogFile>> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name();
            let Some(start) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".log"))
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            let bytes = entry.metadata().map(|m| m.len()).unwrap_or(0);
            files.push(LogFile {
                start,
                path: entry.path(),
                bytes,
            });
        }
        files.sort_by_key(|f| f.start);
        Ok(files)
    }

    /// The newest log file, if any.
    pub fn latest(&self) -> io::Result<Option<LogFile>> {
        Ok(self.files()?.pop())
    }

    /// Creates the file of the next start and deletes the oldest files so that at most
    /// `config.files_kept` remain (the new one included).
    pub fn create_next(&self, config: &LogConfig) -> io::Result<CappedLog> {
        fs::create_dir_all(&self.dir)?;
        let existing = self.files()?;
        let mut start = existing.last().map_or(1, |f| f.start + 1);
        let keep_old = config.files_kept.saturating_sub(1);
        if existing.len() > keep_old {
            for old in &existing[..existing.len() - keep_old] {
                match fs::remove_file(&old.path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
        }
        // create_new: never append to a file another writer (a second worker on the same
        // data dir, say) just created; take the next number instead.
        loop {
            let path = self.dir.join(format!("{start}.log"));
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(file) => {
                    return Ok(CappedLog {
                        file,
                        path,
                        start,
                        written: 0,
                        max_bytes: config.max_file_bytes,
                        truncated: false,
                    })
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => start += 1,
                Err(e) => return Err(e),
            }
        }
    }
}

/// A log file that stops growing at a size cap.
#[derive(Debug)]
pub struct CappedLog {
    file: File,
    path: PathBuf,
    start: u64,
    written: u64,
    max_bytes: u64,
    truncated: bool,
}

impl CappedLog {
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn start(&self) -> u64 {
        self.start
    }

    /// Writes one line (a newline is added when missing). Past the cap the line is dropped
    /// and, the first time, a marker line is written instead. Write errors are returned
    /// once; the caller logs them and keeps the backend running.
    pub fn write_line(&mut self, line: &[u8]) -> io::Result<()> {
        if self.truncated {
            return Ok(());
        }
        let needs_newline = !line.ends_with(b"\n");
        let len = line.len() as u64 + u64::from(needs_newline);
        if self.written + len > self.max_bytes {
            self.truncated = true;
            let marker = format!(
                "[gantry: log file reached its cap of {} bytes; further output is dropped]\n",
                self.max_bytes
            );
            return self.file.write_all(marker.as_bytes());
        }
        if needs_newline {
            let mut owned = Vec::with_capacity(line.len() + 1);
            owned.extend_from_slice(line);
            owned.push(b'\n');
            self.file.write_all(&owned)?;
        } else {
            self.file.write_all(line)?;
        }
        self.written += len;
        Ok(())
    }

    /// Whether the cap was reached.
    pub fn is_truncated(&self) -> bool {
        self.truncated
    }
}

/// The last lines a backend wrote to stderr, for error messages.
#[derive(Debug, Clone)]
pub struct StderrTail {
    lines: VecDeque<String>,
    capacity: usize,
}

impl StderrTail {
    pub fn new(capacity: usize) -> Self {
        Self {
            lines: VecDeque::with_capacity(capacity),
            capacity,
        }
    }

    /// Keeps `line` (lossily decoded, trailing newline and carriage return removed).
    pub fn push(&mut self, line: &[u8]) {
        if self.capacity == 0 {
            return;
        }
        let text = String::from_utf8_lossy(line);
        let text = text.trim_end_matches(['\n', '\r']);
        if self.lines.len() == self.capacity {
            self.lines.pop_front();
        }
        self.lines.push_back(text.to_owned());
    }

    pub fn lines(&self) -> impl Iterator<Item = &str> {
        self.lines.iter().map(String::as_str)
    }

    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    /// The lines joined with newlines.
    pub fn joined(&self) -> String {
        self.lines().collect::<Vec<_>>().join("\n")
    }
}

/// The last `lines` lines of the file at `path` (all of it if shorter), read backwards in
/// blocks so a capped 16 MiB file costs only the blocks the tail needs. Blocking: call it
/// from `spawn_blocking`.
pub fn read_tail_lines(path: &Path, lines: usize) -> io::Result<String> {
    const BLOCK: u64 = 64 * 1024;
    if lines == 0 {
        return Ok(String::new());
    }
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    let mut start = len;
    let mut buffer: Vec<u8> = Vec::new();
    loop {
        // Count newlines, not counting one that ends the file.
        let body = buffer.strip_suffix(b"\n").unwrap_or(&buffer);
        let newlines = body.iter().filter(|b| **b == b'\n').count();
        if newlines >= lines || start == 0 {
            break;
        }
        let read_from = start.saturating_sub(BLOCK);
        let mut block = vec![0u8; (start - read_from) as usize];
        file.seek(SeekFrom::Start(read_from))?;
        file.read_exact(&mut block)?;
        block.extend_from_slice(&buffer);
        buffer = block;
        start = read_from;
    }
    let body = buffer.strip_suffix(b"\n").unwrap_or(&buffer);
    let mut cut = 0;
    let mut seen = 0;
    for (i, byte) in body.iter().enumerate().rev() {
        if *byte == b'\n' {
            seen += 1;
            if seen == lines {
                cut = i + 1;
                break;
            }
        }
    }
    Ok(String::from_utf8_lossy(&buffer[cut..]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitize_key_keeps_names_safe() {
        assert_eq!(sanitize_key("qwen-7b#0"), "qwen-7b_0");
        assert_eq!(sanitize_key("../etc/passwd"), "_._etc_passwd");
        assert_eq!(sanitize_key(".hidden"), "_hidden");
        assert_eq!(sanitize_key(""), "_");
        assert_eq!(sanitize_key("modèle#1"), "mod_le_1");
        assert_eq!(sanitize_key(&"x".repeat(500)).len(), MAX_KEY_LEN);
    }

    #[test]
    fn files_are_numbered_per_start_and_only_the_newest_are_kept() {
        let temp = tempfile::tempdir().unwrap();
        let dir = LogDir::new(temp.path(), "m#0");
        let config = LogConfig {
            files_kept: 3,
            ..LogConfig::default()
        };
        assert!(dir.files().unwrap().is_empty());
        for expected in 1..=5u64 {
            let mut log = dir.create_next(&config).unwrap();
            assert_eq!(log.start(), expected);
            log.write_line(format!("start {expected}").as_bytes())
                .unwrap();
        }
        let starts: Vec<u64> = dir.files().unwrap().iter().map(|f| f.start).collect();
        assert_eq!(starts, [3, 4, 5]);
        assert_eq!(dir.path(), temp.path().join("logs").join("m_0"));
        let latest = dir.latest().unwrap().unwrap();
        assert_eq!(fs::read_to_string(latest.path).unwrap(), "start 5\n");
    }

    #[test]
    fn a_log_stops_at_its_cap_with_one_marker_line() {
        let temp = tempfile::tempdir().unwrap();
        let dir = LogDir::new(temp.path(), "m#0");
        let config = LogConfig {
            max_file_bytes: 20,
            ..LogConfig::default()
        };
        let mut log = dir.create_next(&config).unwrap();
        log.write_line(b"0123456789\n").unwrap();
        log.write_line(b"abcdefgh").unwrap();
        assert!(!log.is_truncated());
        log.write_line(b"this one is too long").unwrap();
        log.write_line(b"and so is this").unwrap();
        assert!(log.is_truncated());
        let text = fs::read_to_string(log.path()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(&lines[..2], ["0123456789", "abcdefgh"]);
        assert!(lines[2].contains("cap of 20 bytes"));
    }

    #[test]
    fn stderr_tail_keeps_the_last_lines() {
        let mut tail = StderrTail::new(2);
        assert!(tail.is_empty());
        tail.push(b"one\n");
        tail.push(b"two\r\n");
        tail.push(b"three");
        assert_eq!(tail.joined(), "two\nthree");
    }

    #[test]
    fn read_tail_lines_reads_from_the_end() {
        let temp = tempfile::tempdir().unwrap();
        let path = temp.path().join("1.log");
        let text: String = (0..20_000).map(|i| format!("line {i}\n")).collect();
        fs::write(&path, &text).unwrap();
        assert_eq!(
            read_tail_lines(&path, 3).unwrap(),
            "line 19997\nline 19998\nline 19999\n"
        );
        assert_eq!(read_tail_lines(&path, 0).unwrap(), "");
        assert_eq!(read_tail_lines(&path, 50_000).unwrap(), text);
        fs::write(&path, "a\nb").unwrap();
        assert_eq!(read_tail_lines(&path, 1).unwrap(), "b");
        assert_eq!(read_tail_lines(&path, 5).unwrap(), "a\nb");
        fs::write(&path, "").unwrap();
        assert_eq!(read_tail_lines(&path, 5).unwrap(), "");
    }
}
