//! Reading parts of remote files with HTTP range requests: what the scheduler needs to
//! estimate memory, without the weights. A GGUF header (metadata and tensor table) is read
//! from the first megabytes, asking for more only when it is longer; a safetensors header
//! is its 8-byte length, then the JSON.

use bytes::Bytes;
use gantry_gguf::{GgufError, GgufFile};

use crate::error::unavailable;
use crate::{RemoteFile, SourceError, Sources, META_TIMEOUT};

/// The first read of a GGUF header; most fit, tokenizer vocabularies included.
const GGUF_FIRST_READ: u64 = 4 << 20;
/// The most read for one GGUF header before giving up.
const GGUF_MAX_HEADER: u64 = 256 << 20;
/// The largest safetensors header accepted (the format's own limit is 100 MB).
const SAFETENSORS_MAX_HEADER: u64 = 100 << 20;
/// The largest whole file read with [`Sources::read_small`] (`config.json` and the like).
const SMALL_FILE_MAX: u64 = 16 << 20;

impl Sources {
    /// `len` bytes of `file` from `start` (fewer at its end). A server that ignores the
    /// range and sends the whole file is cut off after `len` bytes.
    pub async fn read_range(
        &self,
        file: &RemoteFile,
        start: u64,
        len: u64,
    ) -> Result<Bytes, SourceError> {
        if len == 0 {
            return Ok(Bytes::new());
        }
        let end = start + len - 1;
        let response = self
            .get(&file.url, file.hub_auth)
            .header(reqwest::header::RANGE, format!("bytes={start}-{end}"))
            .timeout(META_TIMEOUT)
            .send()
            .await
            .map_err(|e| unavailable(&file.url, &e))?;
        let status = response.status();
        if status == reqwest::StatusCode::RANGE_NOT_SATISFIABLE {
            return Ok(Bytes::new());
        }
        let mut response = self.check_file_status(response, file).await?;
        let whole = status == reqwest::StatusCode::OK;
        let mut out = Vec::with_capacity(usize::try_from(len.min(64 << 20)).unwrap_or(0));
        let mut skipped = 0u64;
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| unavailable(&file.url, &e))?
        {
            let mut chunk = &chunk[..];
            if whole && skipped < start {
                let skip = usize::try_from((start - skipped).min(chunk.len() as u64)).unwrap_or(0);
                skipped += skip as u64;
                chunk = &chunk[skip..];
            }
            let room = usize::try_from(len).unwrap_or(usize::MAX) - out.len();
            out.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if out.len() as u64 >= len {
                break;
            }
        }
        Ok(Bytes::from(out))
    }

    /// A whole small file (`config.json`, an index).
    pub async fn read_small(&self, file: &RemoteFile) -> Result<Bytes, SourceError> {
        let bytes = self.read_range(file, 0, SMALL_FILE_MAX + 1).await?;
        if bytes.len() as u64 > SMALL_FILE_MAX {
            return Err(SourceError::Invalid(format!(
                "{} is larger than {SMALL_FILE_MAX} bytes, too large for a metadata file",
                file.path
            )));
        }
        Ok(bytes)
    }

    /// The GGUF header of `file` (metadata and tensor table), read from its first bytes.
    pub async fn gguf_header(&self, file: &RemoteFile) -> Result<GgufFile, SourceError> {
        let mut want = GGUF_FIRST_READ;
        loop {
            let bytes = self.read_range(file, 0, want).await?;
            match GgufFile::parse(&bytes) {
                Ok(header) => return Ok(header),
                Err(e) if is_truncation(&e) && (bytes.len() as u64) == want => {
                    if want >= GGUF_MAX_HEADER {
                        return Err(SourceError::Invalid(format!(
                            "{}: the GGUF header is longer than {GGUF_MAX_HEADER} bytes",
                            file.path
                        )));
                    }
                    want *= 4;
                }
                Err(e) => {
                    return Err(SourceError::Invalid(format!(
                        "{} is not a usable GGUF file: {e}",
                        file.path
                    )))
                }
            }
        }
    }

    /// The JSON header of a safetensors file: its 8-byte little-endian length, then the
    /// header itself.
    pub async fn safetensors_header(&self, file: &RemoteFile) -> Result<Bytes, SourceError> {
        let prefix = self.read_range(file, 0, 8).await?;
        let length: [u8; 8] = prefix[..].try_into().map_err(|_| {
            SourceError::Invalid(format!(
                "{} is shorter than a safetensors header",
                file.path
            ))
        })?;
        let length = u64::from_le_bytes(length);
        if length > SAFETENSORS_MAX_HEADER {
            return Err(SourceError::Invalid(format!(
                "{}: a safetensors header of {length} bytes is past the format's limit",
                file.path
            )));
        }
        let header = self.read_range(file, 8, length).await?;
        if (header.len() as u64) < length {
            return Err(SourceError::Invalid(format!(
                "{}: the safetensors header is cut short",
                file.path
            )));
        }
        Ok(header)
    }
}

/// Whether a parse failed only because the bytes ended early.
fn is_truncation(error: &GgufError) -> bool {
    matches!(error, GgufError::Truncated { .. })
}
