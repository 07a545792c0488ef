//! Split GGUF files (llama.cpp's `gguf-split`): `name-00001-of-00003.gguf` and its
//! siblings. The first part holds the metadata, every part holds some of the tensors and
//! says which part it is (`split.no`, from 0) of how many (`split.count`). A model's
//! tensor table is the union of its parts' tables.

use std::path::{Path, PathBuf};

use crate::{GgufError, GgufFile};

/// `split.count`: how many files the model is split into (1 when the key is absent).
pub const SPLIT_COUNT_KEY: &str = "split.count";

impl GgufFile {
    /// How many files hold this model's tensors.
    pub fn split_count(&self) -> u64 {
        self.get(SPLIT_COUNT_KEY)
            .and_then(|v| v.as_u64())
            .unwrap_or(1)
            .max(1)
    }

    /// Adds the tensors of another part of the same split model to this (first) part's
    /// table. A tensor named twice is an error naming it.
    pub fn absorb_split_part(&mut self, part: GgufFile) -> Result<(), GgufError> {
        for tensor in part.tensors {
            if self.tensor(&tensor.name).is_some() {
                return Err(GgufError::DuplicateTensor { name: tensor.name });
            }
            self.tensors.push(tensor);
        }
        Ok(())
    }
}

/// The paths of every part of the split model whose first part is `first`
/// (`…-00001-of-0000N.gguf`), in order; `None` when the name is not a first part.
pub fn split_paths(first: &Path) -> Option<Vec<PathBuf>> {
    let name = first.file_name()?.to_str()?;
    let stem = name.strip_suffix(".gguf")?;
    let (rest, total) = stem.rsplit_once("-of-")?;
    let (prefix, index) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(index) || !digits(total) || index != "00001" {
        return None;
    }
    let count: u32 = total.parse().ok()?;
    Some(
        (1..=count)
            .map(|i| first.with_file_name(format!("{prefix}-{i:05}-of-{total}.gguf")))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parts_of_a_first_part_are_named_in_order() {
        let parts = split_paths(Path::new("/m/qwen-Q4_K_M-00001-of-00003.gguf")).unwrap();
        assert_eq!(
            parts,
            vec![
                PathBuf::from("/m/qwen-Q4_K_M-00001-of-00003.gguf"),
                PathBuf::from("/m/qwen-Q4_K_M-00002-of-00003.gguf"),
                PathBuf::from("/m/qwen-Q4_K_M-00003-of-00003.gguf"),
            ]
        );
        assert_eq!(split_paths(Path::new("/m/qwen-00002-of-00003.gguf")), None);
        assert_eq!(split_paths(Path::new("/m/qwen.gguf")), None);
        assert_eq!(split_paths(Path::new("/m/qwen-1-of-3.gguf")), None);
    }
}
