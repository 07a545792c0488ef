//! gantry's llama.cpp memory estimate, held to what the real `llama-server` allocates.
//!
//! For every combination of the corpus (architecture × weight type × arguments), the test
//! writes the model with `gantry_gguf::corpus`, estimates it exactly as the server does
//! (`GgufModelFacts::from_gguf`, `llama_cpp::estimate_options`, `estimate_llama_cpp`),
//! starts `llama-server` on the CPU with the arguments gantry would give it (the user's plus
//! `placement_args`, and `-lv 4` so that it prints its buffers), reads the buffers it reports from its log
//! (`llama_cpp_memory::LlamaCppMemoryReport`) and compares part by part:
//!
//! * the total within ±10 %, and never under the measured total by more than 5 %;
//! * each part (weights, KV cache, compute buffer, output buffer) within ±15 %, or listed in
//!   [`EXCEPTIONS`] with the reason.
//!
//! Sizes printed by llama.cpp are rounded to 0.01 MiB, so differences below
//! [`ROUNDING_SLACK`] count as equal. Every model lives in a directory of its own that is
//! removed as soon as its combinations ran, so the disk holds one model at a time.
//!
//! Needs `GANTRY_LLAMA_SERVER` (scripts/test.sh sets it). The table it prints
//! (`cargo nextest run -p gantry-backends --test llama_cpp_accuracy --no-capture`) is the
//! README's accuracy table.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gantry_backends::llama_cpp::{default_context_size, estimate_options, LlamaCpp};
use gantry_backends::llama_cpp_memory::{LlamaCppMemoryReport, LlamaCppPart};
use gantry_backends::Backend;
use gantry_gguf::corpus::{CorpusArch, CorpusModel};
use gantry_gguf::{GgmlType, GgufFile};
use gantry_sched::estimate::gguf::{estimate_llama_cpp, GgufModelFacts, LlamaCppParts};
use gantry_types::{Placement, PlacementKind};

/// How long one `llama-server` may take to load a corpus model and report its buffers.
const LOAD_DEADLINE: Duration = Duration::from_secs(90);
/// Combinations run at once (each `llama-server` uses one thread).
const CONCURRENCY: usize = 2;
/// llama.cpp prints MiB with two decimals: ±0.005 MiB per line, a few lines per part.
const ROUNDING_SLACK: u64 = 16 * 1024;
/// The total may be this far above or below the measured total…
const TOTAL_TOLERANCE: f64 = 0.10;
/// …but never this far under it.
const TOTAL_UNDER_LIMIT: f64 = 0.05;
/// Each part may be this far off.
const PART_TOLERANCE: f64 = 0.15;

/// Parts allowed outside [`PART_TOLERANCE`], with the reason: (combination name prefix,
/// part, why).
const EXCEPTIONS: &[(&str, LlamaCppPart, &str)] = &[];

/// One model of the corpus and the argument sets it is run with.
struct Variant {
    name: String,
    model: CorpusModel,
    parts: u32,
    arg_sets: Vec<Vec<String>>,
}

fn args(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_owned).collect()
}

fn variant(arch: CorpusArch, weight_type: GgmlType, arg_sets: &[&str]) -> Variant {
    let model = CorpusModel {
        weight_type,
        ..CorpusModel::preset(arch)
    };
    Variant {
        name: format!("{arch}-{}", weight_type.name().to_ascii_lowercase()),
        model,
        parts: 1,
        arg_sets: arg_sets.iter().map(|line| args(line)).collect(),
    }
}

/// The argument sets every causal model runs with: the default, small and trained
/// contexts, KV cache types, slots, batch sizes and flash attention on and off.
const FULL: &[&str] = &[
    "",
    "-c 512",
    "-c 0",
    "-c 2048 -fa off",
    "-c 4096 -fa on",
    "-c 4096 -ctk q8_0 -ctv q8_0",
    "-c 2048 -ctk q4_0 -ctv q4_0 -fa on",
    "-np 1 -c 3000",
    "-np 4 -c 4096 -fa off",
    "-np 2 -c 2048 -ub 256",
    "-c 1024 -b 256 -ub 128 -fa off",
];
/// A shorter set for the other weight types of an architecture.
const SHORT: &[&str] = &["", "-c 1024 -fa off", "-np 1 -ctk q8_0 -ctv q8_0"];

fn corpus() -> Vec<Variant> {
    use CorpusArch::*;
    let mut variants = vec![
        variant(Llama, GgmlType::F16, FULL),
        variant(Llama, GgmlType::F32, SHORT),
        variant(Llama, GgmlType::Q8_0, SHORT),
        variant(Llama, GgmlType::Q4_K, SHORT),
        variant(Qwen2, GgmlType::Q8_0, SHORT),
        variant(Qwen3, GgmlType::F16, SHORT),
        variant(Gemma2, GgmlType::F16, FULL),
        variant(Gemma3, GgmlType::Q4_K, FULL),
        variant(Phi3, GgmlType::F16, SHORT),
        variant(Qwen3Moe, GgmlType::Q8_0, FULL),
        variant(Qwen3Moe, GgmlType::Q4_K, SHORT),
        variant(Qwen2, GgmlType::F16, SHORT),
        variant(Phi3, GgmlType::Q4_K, SHORT),
        variant(
            Gemma2,
            GgmlType::Q8_0,
            &["--swa-full -c 4096", "-np 3 -c 3000 -fa off"],
        ),
        variant(
            Bert,
            GgmlType::F16,
            &["--embedding", "--embedding -c 256 -fa off"],
        ),
        variant(Bert, GgmlType::Q8_0, &["--embedding -ub 256"]),
    ];
    // Tied embeddings on an architecture that usually has its own output layer.
    let mut tied = variant(Llama, GgmlType::Q8_0, &["", "-c 2048 -fa off"]);
    tied.name = "llama-q8_0-tied".to_owned();
    tied.model.tied_embeddings = true;
    variants.push(tied);
    // A model split in three files, loaded from the first.
    let mut split = variant(Qwen3, GgmlType::Q8_0, &["", "-c 1024 -fa off"]);
    split.name = "qwen3-q8_0-split3".to_owned();
    split.parts = 3;
    variants.push(split);
    variants
}

/// One run's outcome.
struct Outcome {
    name: String,
    arch: String,
    estimated: LlamaCppParts,
    measured: LlamaCppMemoryReport,
}

fn llama_server_binary() -> PathBuf {
    let Some(path) = std::env::var_os("GANTRY_LLAMA_SERVER") else {
        panic!(
            "GANTRY_LLAMA_SERVER is not set. This test runs the real llama-server: run it \
             with scripts/test.sh, or set GANTRY_LLAMA_SERVER=$(scripts/build-llama-server.sh \
             | tail -1)."
        );
    };
    let path = PathBuf::from(path);
    assert!(
        path.is_file(),
        "GANTRY_LLAMA_SERVER={} is not a file; run scripts/build-llama-server.sh",
        path.display()
    );
    path
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free loopback port")
        .port()
}

fn cpu_placement() -> Placement {
    Placement {
        instance_id: 1,
        worker_id: 1,
        worker_name: "cpu".to_owned(),
        gpus: Vec::new(),
        ram_bytes: 0,
        kind: PlacementKind::CpuOnly,
        tensor_parallel_size: 1,
        data_parallel_size: 1,
        llama: None,
    }
}

fn open_model(first: &Path, parts: &[PathBuf]) -> GgufFile {
    let mut file = GgufFile::open(first).expect("the corpus model parses");
    for part in parts.iter().skip(1) {
        file.absorb_split_part(GgufFile::open(part).expect("a split part parses"))
            .expect("the parts fit together");
    }
    file
}

/// Starts `llama-server` and reads its log until the server listens (every buffer is
/// allocated by then), it exits, or [`LOAD_DEADLINE`] passes.
fn run_llama_server(binary: &Path, argv: &[String]) -> Result<String, String> {
    let mut child: Child = Command::new(binary)
        .args(argv)
        .env("LLAMA_ARG_THREADS", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
    let (lines_tx, lines_rx) = mpsc::channel::<String>();
    for stream in [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let tx = lines_tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
    }
    drop(lines_tx);
    let started = Instant::now();
    let mut log = String::new();
    let outcome = loop {
        let left = LOAD_DEADLINE.saturating_sub(started.elapsed());
        match lines_rx.recv_timeout(left) {
            Ok(line) => {
                let listening = line.contains(" listening on http");
                log.push_str(&line);
                log.push('\n');
                if listening {
                    break Ok(());
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                break Err(format!("no 'listening on http' within {LOAD_DEADLINE:?}"))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                break Err("llama-server exited before listening".to_owned())
            }
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    outcome.map(|()| log.clone()).map_err(|why| {
        let tail: Vec<&str> = log.lines().rev().take(15).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!("{why}; last lines:\n{}", tail.join("\n"))
    })
}

/// Estimates one combination and runs it.
fn run_combination(
    binary: &Path,
    variant_name: &str,
    arch: &str,
    paths: &[PathBuf],
    user_args: &[String],
) -> Result<Outcome, String> {
    let name = if user_args.is_empty() {
        format!("{variant_name} (defaults)")
    } else {
        format!("{variant_name} {}", user_args.join(" "))
    };
    let file = open_model(&paths[0], paths);
    let facts = GgufModelFacts::from_gguf(&file).map_err(|e| format!("{name}: facts: {e}"))?;
    let options = estimate_options(user_args).map_err(|e| format!("{name}: options: {e}"))?;
    let estimate =
        estimate_llama_cpp(&facts, &options).map_err(|e| format!("{name}: estimate: {e}"))?;
    let context = default_context_size(&options, &facts);
    let mut argv = vec![
        "-m".to_owned(),
        paths[0].display().to_string(),
        "--host".to_owned(),
        "127.0.0.1".to_owned(),
        "--port".to_owned(),
        free_port().to_string(),
    ];
    argv.extend(user_args.iter().cloned());
    argv.extend(LlamaCpp.placement_args(user_args, &cpu_placement(), context));
    // Not gantry's: llama.cpp prints its buffer sizes only from verbosity 4 on.
    argv.extend(["-lv".to_owned(), "4".to_owned()]);
    // The free port may be taken by another test's process before llama-server binds it
    // (seen once in a full run): then another port.
    let mut attempts = 0;
    let log = loop {
        attempts += 1;
        match run_llama_server(binary, &argv) {
            Err(e) if e.contains("couldn't bind HTTP server socket") && attempts < 3 => {
                argv[5] = free_port().to_string();
            }
            outcome => break outcome.map_err(|e| format!("{name}: {e}"))?,
        }
    };
    Ok(Outcome {
        name,
        arch: arch.to_owned(),
        estimated: estimate.parts,
        measured: LlamaCppMemoryReport::from_log(&log),
    })
}

fn estimated_part(parts: &LlamaCppParts, part: LlamaCppPart) -> u64 {
    match part {
        LlamaCppPart::Model => parts.weights_bytes,
        LlamaCppPart::KvCache => parts.kv_cache_bytes,
        LlamaCppPart::Compute => parts.compute_bytes,
        LlamaCppPart::Output => parts.output_bytes,
    }
}

/// Relative error of `estimated` against `measured`, 0 when both are within the rounding.
fn error(estimated: u64, measured: u64) -> f64 {
    if estimated.abs_diff(measured) <= ROUNDING_SLACK {
        return 0.0;
    }
    (estimated as f64 - measured as f64) / (measured.max(1) as f64)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// The verdicts of one outcome: `(what, error, failure)`.
fn judge(outcome: &Outcome) -> Vec<String> {
    let mut failures = Vec::new();
    for part in LlamaCppPart::ALL {
        let estimated = estimated_part(&outcome.estimated, part);
        let measured = outcome.measured.bytes(part);
        let e = error(estimated, measured);
        let excepted = EXCEPTIONS
            .iter()
            .any(|(prefix, p, _)| *p == part && outcome.name.starts_with(prefix));
        if e.abs() > PART_TOLERANCE && !excepted {
            failures.push(format!(
                "{}: {} estimated {:.2} MiB, llama.cpp {:.2} MiB ({:+.1} %)",
                outcome.name,
                part.name(),
                mib(estimated),
                mib(measured),
                e * 100.0
            ));
        }
    }
    let estimated_total = outcome.estimated.total_bytes();
    let measured_total = outcome.measured.total_bytes();
    let e = error(estimated_total, measured_total);
    if e.abs() > TOTAL_TOLERANCE || e < -TOTAL_UNDER_LIMIT {
        failures.push(format!(
            "{}: total estimated {:.2} MiB, llama.cpp {:.2} MiB ({:+.1} %)",
            outcome.name,
            mib(estimated_total),
            mib(measured_total),
            e * 100.0
        ));
    }
    failures
}

fn print_table(outcomes: &[Outcome]) {
    println!(
        "{:<52} {:>19} {:>19} {:>19} {:>17} {:>19}",
        "combination", "weights MiB", "kv MiB", "compute MiB", "output MiB", "total MiB"
    );
    for o in outcomes {
        let cell =
            |e: u64, m: u64| format!("{:.2}/{:.2} {:+.0}%", mib(e), mib(m), error(e, m) * 100.0);
        println!(
            "{:<52} {:>19} {:>19} {:>19} {:>17} {:>19}",
            o.name,
            cell(
                o.estimated.weights_bytes,
                o.measured.bytes(LlamaCppPart::Model)
            ),
            cell(
                o.estimated.kv_cache_bytes,
                o.measured.bytes(LlamaCppPart::KvCache)
            ),
            cell(
                o.estimated.compute_bytes,
                o.measured.bytes(LlamaCppPart::Compute)
            ),
            cell(
                o.estimated.output_bytes,
                o.measured.bytes(LlamaCppPart::Output)
            ),
            cell(o.estimated.total_bytes(), o.measured.total_bytes()),
        );
    }
    // Per architecture and part: median and worst error (by magnitude), as in the README.
    let mut by_arch: BTreeMap<(&str, &str), Vec<f64>> = BTreeMap::new();
    for o in outcomes {
        for part in LlamaCppPart::ALL {
            let e = error(estimated_part(&o.estimated, part), o.measured.bytes(part));
            by_arch
                .entry((o.arch.as_str(), part.name()))
                .or_default()
                .push(e);
        }
        let e = error(o.estimated.total_bytes(), o.measured.total_bytes());
        by_arch
            .entry((o.arch.as_str(), "total"))
            .or_default()
            .push(e);
    }
    println!(
        "\n{:<10} {:<8} {:>5} {:>9} {:>9}",
        "arch", "part", "runs", "median", "worst"
    );
    for ((arch, part), mut errors) in by_arch {
        errors.sort_by(|a, b| a.total_cmp(b));
        let median = errors[errors.len() / 2];
        let worst = errors
            .iter()
            .copied()
            .max_by(|a, b| a.abs().total_cmp(&b.abs()))
            .unwrap_or(0.0);
        println!(
            "{arch:<10} {part:<8} {:>5} {:>+8.1}% {:>+8.1}%",
            errors.len(),
            median * 100.0,
            worst * 100.0
        );
    }
}

#[test]
fn the_estimate_matches_what_llama_server_allocates_across_the_corpus() {
    let binary = llama_server_binary();
    let variants = corpus();
    let combinations: usize = variants.iter().map(|v| v.arg_sets.len()).sum();
    assert!(
        combinations >= 50,
        "the corpus has {combinations} combinations"
    );
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let errors = Arc::new(Mutex::new(Vec::new()));
    for variant in &variants {
        // One directory per model, gone once its combinations ran.
        let dir = tempfile::tempdir().expect("a temporary directory");
        let paths = match variant
            .model
            .write(dir.path(), &variant.name, variant.parts)
        {
            Ok(paths) => paths,
            Err(e) => {
                errors
                    .lock()
                    .unwrap()
                    .push(format!("{}: cannot write: {e}", variant.name));
                continue;
            }
        };
        let queue = Arc::new(Mutex::new(variant.arg_sets.clone()));
        std::thread::scope(|scope| {
            for _ in 0..CONCURRENCY {
                let queue = Arc::clone(&queue);
                let (binary, paths, outcomes, errors) = (&binary, &paths, &outcomes, &errors);
                scope.spawn(move || loop {
                    let Some(user_args) = queue.lock().unwrap().pop() else {
                        break;
                    };
                    let arch = variant.model.arch.name();
                    match run_combination(binary, &variant.name, arch, paths, &user_args) {
                        Ok(outcome) => outcomes.lock().unwrap().push(outcome),
                        Err(e) => errors.lock().unwrap().push(e),
                    }
                });
            }
        });
    }
    let mut outcomes = std::mem::take(&mut *outcomes.lock().unwrap());
    outcomes.sort_by(|a, b| a.name.cmp(&b.name));
    print_table(&outcomes);
    let mut failures = std::mem::take(&mut *errors.lock().unwrap());
    failures.extend(outcomes.iter().flat_map(judge));
    assert!(
        failures.is_empty(),
        "{} of {combinations} combinations off:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(outcomes.len(), combinations);
}
