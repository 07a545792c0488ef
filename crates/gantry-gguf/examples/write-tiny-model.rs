//! Writes the tiny random-weight llama model to the path given as the only argument:
//! `cargo run -p gantry-gguf --example write-tiny-model -- OUT.gguf`.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(path), None) = (args.next(), args.next()) else {
        eprintln!("usage: write-tiny-model OUT.gguf");
        return ExitCode::from(2);
    };
    let path = PathBuf::from(path);
    if let Err(e) = gantry_gguf::write_tiny_llama(&path) {
        eprintln!("write-tiny-model: writing {}: {e}", path.display());
        return ExitCode::FAILURE;
    }
    match std::fs::metadata(&path) {
        Ok(meta) => println!("wrote {} ({} bytes)", path.display(), meta.len()),
        Err(_) => println!("wrote {}", path.display()),
    }
    ExitCode::SUCCESS
}
