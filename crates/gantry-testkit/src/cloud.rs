//! A cloud for the `exec` worker-pool provider, as a bash script that keeps its machines as
//! files: `create` records the call in `machines/created.log` and writes
//! `machines/<name>.json` with what it was given, `find` answers a machine whose file is
//! there, `delete` removes the file and records the name in `machines/deleted.log`. The
//! action is the script's last argument, as gantry passes it.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// How the cloud behaves.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cloud<'a> {
    /// `create` of a machine whose name starts with this fails with `failure` on stderr
    /// (exit 2), as a provider out of capacity would.
    pub fail_names_starting: Option<(&'a str, &'a str)>,
    /// Seconds `create` waits after it has made the machine, before it answers.
    pub create_delay_seconds: u32,
}

/// Writes the cloud's script to `path` (executable); its machines live beside it.
pub fn write_cloud_script(path: &Path, cloud: Cloud<'_>) {
    let fail = match cloud.fail_names_starting {
        Some((prefix, failure)) => {
            format!("    if [[ \"$name\" == {prefix}* ]]; then echo {failure:?} >&2; exit 2; fi\n")
        }
        None => String::new(),
    };
    let delay = cloud.create_delay_seconds;
    let script = format!(
        r#"#!/bin/bash
set -eu
dir="$(dirname "$0")/machines"
mkdir -p "$dir"
input=$(cat)
name=$(printf '%s' "$input" | sed -n 's/.*"name":"\([^"]*\)".*/\1/p')
case "${{@: -1}}" in
  create)
{fail}    echo "$name" >> "$dir/created.log"
    printf '%s' "$input" > "$dir/$name.json"
    printf '%s' "${{GANTRY_POOL_CREDENTIALS:-none}}" > "$dir/$name.credentials"
    sleep {delay}
    echo "{{\"external_id\": \"vm-$name\", \"address\": \"127.0.0.1\"}}"
    ;;
  find)
    if [[ -f "$dir/$name.json" ]]; then echo "{{\"external_id\": \"vm-$name\"}}"; else echo null; fi
    ;;
  delete)
    rm -f "$dir/$name.json"
    echo "$name" >> "$dir/deleted.log"
    ;;
esac
"#
    );
    std::fs::write(path, script).expect("write the cloud's script");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .expect("make the cloud's script executable");
}

/// The lines of one of the cloud's logs (`created.log`, `deleted.log`) beside `script`,
/// sorted; none when it has none yet.
pub fn cloud_log(script: &Path, log: &str) -> Vec<String> {
    let path = script
        .parent()
        .expect("the script is in a directory")
        .join("machines")
        .join(log);
    let mut lines: Vec<String> = std::fs::read_to_string(path)
        .map(|text| text.lines().map(str::to_owned).collect())
        .unwrap_or_default();
    lines.sort();
    lines
}
