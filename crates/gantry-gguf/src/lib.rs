//! GGUF format: read the header, metadata and tensor table; write GGUF files (used to make the tiny test model).
