//! The model catalog served at `GET /api/v1/model-catalog`: `catalog.yaml`, built into
//! the binary, or the file `model_catalog_file` names. Read and checked once at start-up —
//! every entry must make a model `POST /api/v1/models` would accept — so a bad file stops
//! the server with a message naming the entry, instead of failing a deploy later.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::Context;
use gantry_types::{CatalogEntry, ModelCatalog, Validate};

/// The catalog built into the binary.
pub const BUILT_IN: &str = include_str!("catalog.yaml");

/// The catalog from `file`, else the built-in one.
pub fn load(file: Option<&Path>) -> anyhow::Result<ModelCatalog> {
    match file {
        Some(file) => {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("read model_catalog_file {}", file.display()))?;
            parse(&text).with_context(|| format!("model_catalog_file {}", file.display()))
        }
        None => parse(BUILT_IN).context("the built-in model catalog"),
    }
}

/// Parses a catalog: a YAML list of entries, each checked, names unique.
pub fn parse(text: &str) -> anyhow::Result<ModelCatalog> {
    let items: Vec<CatalogEntry> = serde_norway::from_str(text)
        .context("not a list of catalog entries (name, title, source, backend, …)")?;
    let mut names = BTreeSet::new();
    for (index, entry) in items.iter().enumerate() {
        entry.validate().map_err(|e| {
            anyhow::anyhow!(
                "entry {} ({:?}): {}: {}",
                index + 1,
                entry.name,
                e.field,
                e.message
            )
        })?;
        anyhow::ensure!(
            names.insert(entry.name.as_str()),
            "entry {} ({:?}): a second entry of that name",
            index + 1,
            entry.name
        );
    }
    Ok(ModelCatalog { items })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_catalog_is_valid() {
        let catalog = load(None).unwrap();
        assert!(catalog.items.len() >= 5);
        assert!(catalog
            .items
            .iter()
            .any(|e| e.tags.iter().any(|t| t == "embedding")));
    }

    #[test]
    fn a_bad_entry_is_named() {
        let bad = "- name: Bad Name\n  title: x\n  source: {type: local_path, path: /m.gguf}\n  backend: llama.cpp\n";
        let error = format!("{:#}", parse(bad).unwrap_err());
        assert!(
            error.contains("entry 1") && error.contains("name"),
            "{error}"
        );
        let twice = "- {name: a, title: A, source: {type: local_path, path: /a.gguf}, backend: llama.cpp}\n\
                     - {name: a, title: B, source: {type: local_path, path: /b.gguf}, backend: llama.cpp}\n";
        let error = format!("{:#}", parse(twice).unwrap_err());
        assert!(
            error.contains("entry 2") && error.contains("second"),
            "{error}"
        );
        let error = format!("{:#}", parse("- {name: a, title: A}").unwrap_err());
        assert!(error.contains("not a list of catalog entries"), "{error}");
    }
}
