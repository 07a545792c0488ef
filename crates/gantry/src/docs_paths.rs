//! Tests that keep the documentation pointing at things that exist: every file or
//! directory ARCHITECTURE.md names in backticks, and every relative link of README.md,
//! ARCHITECTURE.md, `docs/*.md` and `bench/results/README.md` (the file, and the heading
//! when the link names one). A code map that names a file no longer there sends a
//! newcomer looking for it; these fail instead, naming what is missing.
//!
//! Unit tests of the binary rather than an integration test, so they add no test binary.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// File endings that make a backticked word a path to check.
const EXTENSIONS: &[&str] = &[
    "rs", "sh", "md", "toml", "py", "json", "yaml", "yml", "js", "css", "html", "svg", "sql",
];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(repo_root().join(relative))
        .unwrap_or_else(|e| panic!("read {relative}: {e}"))
}

/// The lines of a Markdown text outside fenced code blocks, with their numbers (from 1).
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut in_fence = false;
    let mut lines = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if !in_fence {
            lines.push((index + 1, line));
        }
    }
    lines
}

/// The backticked spans of one line.
fn code_spans(line: &str) -> Vec<&str> {
    line.split('`').skip(1).step_by(2).collect()
}

/// Whether a backticked word names a file or directory of the repository: it contains `/`
/// (or is a bare `*.rs` module file) and ends in a known extension or in `/`. URL paths,
/// placeholders and patterns (`/api/v1/…`, `<data_dir>/…`, `*.gguf`, `$HOME/…`) are not.
fn is_repo_path(word: &str) -> bool {
    if word.is_empty()
        || word.starts_with('/')
        || (word.starts_with('.') && !word.starts_with(".ci/") && !word.starts_with(".config/"))
        || word.contains("://")
        || word
            .chars()
            .any(|c| c.is_whitespace() || "<>{}[]*$?=:…,;()'\"|".contains(c))
    {
        return false;
    }
    if word.ends_with('/') {
        return word.len() > 1;
    }
    let extension = word.rsplit_once('.').map(|(_, extension)| extension);
    let known = extension.is_some_and(|extension| EXTENSIONS.contains(&extension));
    known && (word.contains('/') || word.ends_with(".rs"))
}

/// The crate directory a `### `crates/NAME`` heading opens, if the line is one.
fn crate_of_heading(line: &str) -> Option<Option<String>> {
    let heading = line.strip_prefix('#')?.trim_start_matches('#');
    let crate_dir = code_spans(heading)
        .into_iter()
        .find(|span| span.starts_with("crates/") && span.matches('/').count() == 1)
        .map(str::to_owned);
    Some(crate_dir)
}

/// Where a path named in a section of the map may be: from the repository root when its
/// first part is there (`crates/…`, `scripts/…`), from `crates/` when it starts with a
/// crate's name (`gantry-store/src/notify.rs`), else within the section's crate — its
/// `src/` first (`controllers/placement.rs`), then the crate itself (`tests/`, `benches/`).
fn candidates(word: &str, section_crate: Option<&str>) -> Vec<String> {
    let root = repo_root();
    let first = word.split('/').next().unwrap_or(word);
    if word.contains('/') && root.join(first).exists() {
        return vec![word.to_owned()];
    }
    if first.starts_with("gantry") && root.join("crates").join(first).is_dir() {
        return vec![format!("crates/{word}")];
    }
    match section_crate {
        Some(crate_dir) => vec![
            format!("{crate_dir}/src/{word}"),
            format!("{crate_dir}/{word}"),
        ],
        None => vec![word.to_owned()],
    }
}

/// Whether `path` exists; a module file `x.rs` may also be the directory module
/// `x/mod.rs`, so that the map reads the same whichever way a module is laid out.
fn module_exists(root: &Path, path: &str) -> bool {
    root.join(path).exists()
        || path
            .strip_suffix(".rs")
            .is_some_and(|module| root.join(module).join("mod.rs").is_file())
}

/// Every path ARCHITECTURE.md names that is not in the repository, as "line N: `word`".
fn missing_architecture_paths(text: &str) -> Vec<String> {
    let root = repo_root();
    let mut section_crate: Option<String> = None;
    let mut missing = Vec::new();
    for (number, line) in prose_lines(text) {
        if let Some(opened) = crate_of_heading(line) {
            section_crate = opened;
        }
        for word in code_spans(line) {
            if !is_repo_path(word) {
                continue;
            }
            let tried = candidates(word, section_crate.as_deref());
            if !tried.iter().any(|path| module_exists(&root, path)) {
                missing.push(format!(
                    "line {number}: `{word}` (looked for {})",
                    tried.join(", ")
                ));
            }
        }
    }
    missing
}

/// GitHub's anchor of a heading: lower case, spaces as `-`, punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .flat_map(char::to_lowercase)
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    prose_lines(text)
        .into_iter()
        .filter_map(|(_, line)| line.strip_prefix('#'))
        .map(|heading| anchor(heading.trim_start_matches('#')))
        .collect()
}

/// The targets of a line's inline links `[text](target)`.
fn link_targets(line: &str) -> Vec<&str> {
    let mut targets = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        targets.push(after[..end].trim());
        rest = &after[end..];
    }
    targets
}

/// Every relative link of a Markdown file (path relative to the root) whose file, or
/// whose heading in it, does not exist.
fn broken_links(file: &str) -> Vec<String> {
    let root = repo_root();
    let text = read(file);
    let dir = Path::new(file).parent().unwrap_or(Path::new(""));
    let mut broken = Vec::new();
    for (number, line) in prose_lines(&text) {
        for target in link_targets(line) {
            if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
                continue;
            }
            let (path, fragment) = match target.split_once('#') {
                Some((path, fragment)) => (path, Some(fragment)),
                None => (target, None),
            };
            let linked = if path.is_empty() {
                root.join(file)
            } else {
                root.join(dir).join(path)
            };
            if !linked.exists() {
                broken.push(format!("{file}:{number}: ({target}): no such file"));
                continue;
            }
            let Some(fragment) = fragment else { continue };
            if linked.extension().is_some_and(|e| e == "md") {
                let linked_text = std::fs::read_to_string(&linked).unwrap_or_default();
                if !anchors(&linked_text).contains(fragment) {
                    broken.push(format!("{file}:{number}: ({target}): no such heading"));
                }
            }
        }
    }
    broken
}

/// The Markdown files whose links are checked.
fn linked_pages() -> Vec<String> {
    let mut pages = vec![
        "README.md".to_owned(),
        "ARCHITECTURE.md".to_owned(),
        "bench/results/README.md".to_owned(),
    ];
    let docs = std::fs::read_dir(repo_root().join("docs")).expect("read docs/");
    let mut doc_pages: Vec<String> = docs
        .map(|entry| {
            entry
                .expect("read docs/")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    doc_pages.sort();
    pages.extend(doc_pages);
    pages
}

#[test]
fn every_path_architecture_md_names_exists() {
    let missing = missing_architecture_paths(&read("ARCHITECTURE.md"));
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names paths that do not exist (relative to the repository root; \
         a bare module path in a crate's section is looked for in that crate); fix the \
         map or the path:\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_relative_link_of_the_docs_resolves() {
    let broken: Vec<String> = linked_pages()
        .iter()
        .flat_map(|page| broken_links(page))
        .collect();
    assert!(
        broken.is_empty(),
        "links to files or headings that do not exist:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_checks_see_paths_and_links_where_the_docs_write_them() {
    assert!(is_repo_path("crates/gantry-store/src/lib.rs"));
    assert!(is_repo_path("scripts/test.sh"));
    assert!(is_repo_path("controllers/"));
    assert!(is_repo_path("notify.rs"));
    assert!(!is_repo_path("/api/v1/models"));
    assert!(!is_repo_path("<data_dir>/worker/backends/"));
    assert!(!is_repo_path("application/json"));
    assert!(!is_repo_path("config.json"));
    assert!(!is_repo_path("hf:OWNER/REPO[:FILE]"));

    let map = "### `crates/gantry-server`\n`api.rs` is `api/mod.rs`\n\
               ### `crates/gantry-store`\n`notify.rs` and `tests/` and `no_such_module.rs`\n\
               ```\n`crates/not-checked-in-a-fence.rs`\n```\n\
               ## Invariants\n`crates/gantry/src/no_such_file.rs`, `scripts/test.sh`\n";
    let missing = missing_architecture_paths(map);
    assert_eq!(missing.len(), 2, "{missing:?}");
    assert!(missing[0].contains("no_such_module.rs"), "{missing:?}");
    assert!(missing[1].contains("no_such_file.rs"), "{missing:?}");

    assert_eq!(
        link_targets("see [models](models.md#sources) and [x](https://a/b)"),
        ["models.md#sources", "https://a/b"]
    );
    assert_eq!(anchor(" When parts fail"), "when-parts-fail");
    assert_eq!(
        anchor(" Models from Hugging Face, ModelScope, S3 and URLs"),
        "models-from-hugging-face-modelscope-s3-and-urls"
    );
}
