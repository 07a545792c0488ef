//! What a new cloud machine runs at first boot (its cloud-init user data): fetch the
//! servers' own gantry binary (`GET /downloads/gantry`, so workers run the servers'
//! version), install it with a systemd unit, and start `gantry worker` with the cluster's
//! token, the machine's name and the pool's labels. The worker keeps its credential in
//! `/var/lib/gantry-worker` and drops the token after its first registration.

use crate::MachineRequest;

/// Quotes `text` for a POSIX shell: inside single quotes, with each `'` closed, escaped
/// and reopened.
pub fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The user data of a machine: a shell script cloud-init runs once, as root.
pub fn user_data(request: &MachineRequest) -> String {
    let download = request
        .server_urls
        .iter()
        .map(|url| format!("{}/downloads/gantry", url.trim_end_matches('/')))
        .map(|url| shell_quote(&url))
        .collect::<Vec<_>>()
        .join(" ");
    let labels = request
        .labels
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(",");
    let env = [
        ("GANTRY_SERVER_URLS", request.server_urls.join(",")),
        ("GANTRY_TOKEN", request.cluster_token.clone()),
        ("GANTRY_WORKER_NAME", request.name.clone()),
        ("GANTRY_LABELS", labels),
        ("GANTRY_DATA_DIR", "/var/lib/gantry-worker".to_owned()),
    ]
    .iter()
    .map(|(key, value)| format!("{key}={value}"))
    .collect::<Vec<_>>()
    .join("\n");
    format!(
        r#"#!/bin/sh
# gantry worker {name}: written by its pool; runs once at first boot.
set -eu
for url in {download}; do
  if curl -fsSL --retry 5 -o /usr/local/bin/gantry.download "$url"; then break; fi
done
mv /usr/local/bin/gantry.download /usr/local/bin/gantry
chmod 0755 /usr/local/bin/gantry
mkdir -p /etc/gantry /var/lib/gantry-worker
umask 077
cat > /etc/gantry/worker.env <<'GANTRY_ENV'
{env}
GANTRY_ENV
cat > /etc/systemd/system/gantry-worker.service <<'GANTRY_UNIT'
[Unit]
Description=gantry worker
After=network-online.target
Wants=network-online.target

[Service]
EnvironmentFile=/etc/gantry/worker.env
ExecStart=/usr/local/bin/gantry worker
Restart=always
RestartSec=5

[Install]
WantedBy=multi-user.target
GANTRY_UNIT
systemctl daemon-reload
systemctl enable --now gantry-worker.service
"#,
        name = request.name,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_quotes() {
        assert_eq!(shell_quote("a'b"), r"'a'\''b'");
    }

    #[test]
    fn the_script_joins_the_named_worker_to_its_cluster() {
        let request = MachineRequest {
            name: "h100-1".into(),
            cluster_token: "gantryreg_abc".into(),
            server_urls: vec![
                "https://a.example:8080/".into(),
                "https://b.example:8080".into(),
            ],
            instance_type: String::new(),
            image: String::new(),
            region: String::new(),
            gpus: "1x80GiB".into(),
            labels: [("gantry.dev/pool".to_owned(), "h100".to_owned())].into(),
        };
        let script = user_data(&request);
        assert!(script.starts_with("#!/bin/sh\n"));
        assert!(script.contains(
            "for url in 'https://a.example:8080/downloads/gantry' 'https://b.example:8080/downloads/gantry'; do"
        ));
        assert!(script.contains("GANTRY_TOKEN=gantryreg_abc\n"));
        assert!(script.contains("GANTRY_WORKER_NAME=h100-1\n"));
        assert!(script.contains("GANTRY_LABELS=gantry.dev/pool=h100\n"));
        assert!(script.contains("systemctl enable --now gantry-worker.service"));
    }
}
