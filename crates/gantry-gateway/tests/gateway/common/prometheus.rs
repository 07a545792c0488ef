//! What Prometheus and Grafana make of `/metrics`: `promtool check metrics` on the
//! exposition, and the dashboard's queries checked against what it serves.

use serde_json::Value;

/// The PromQL queries of `packaging/grafana/gantry.json`, the dashboard's variables
/// filled in as Grafana would (`$model` as "all").
fn dashboard_queries() -> Vec<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../packaging/grafana/gantry.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    let mut queries: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|panel| panel["targets"].as_array().unwrap().iter())
        .map(|target| target["expr"].as_str().unwrap().to_owned())
        .collect();
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(definition) = variable["definition"].as_str() {
            // label_values(metric, label) is Grafana's, not PromQL: check the metric.
            let inner = definition
                .trim_start_matches("label_values(")
                .trim_end_matches(')');
            queries.push(inner.split(',').next().unwrap().trim().to_owned());
        }
    }
    assert!(queries.len() > 10, "{queries:?}");
    queries
        .into_iter()
        .map(|q| q.replace("$__rate_interval", "5m").replace("$model", ".*"))
        .collect()
}

/// Every query of the Grafana dashboard parses as PromQL (`promtool check rules`) and
/// names only metrics that `/metrics` serves, grouped by labels they carry.
pub fn dashboard_queries_fit(text: &str) {
    let queries = dashboard_queries();
    let series: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    for query in &queries {
        let metrics: Vec<&str> = query
            .match_indices("gantry_")
            .map(|(at, _)| {
                let rest = &query[at..];
                &rest[..rest.find(|c: char| !is_name(c)).unwrap_or(rest.len())]
            })
            .collect();
        assert!(
            !metrics.is_empty(),
            "a query without a gantry metric: {query}"
        );
        for metric in &metrics {
            let family = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|suffix| metric.strip_suffix(suffix))
                .unwrap_or(metric);
            assert!(
                text.contains(&format!("\n# TYPE {family} ")),
                "the dashboard asks for {metric}, which /metrics does not serve:\n{query}\n{text}"
            );
        }
        // Grouping labels, where the metrics have series to show them (a counter of
        // failures has none until something fails).
        let shown: Vec<&&str> = series
            .iter()
            .filter(|l| metrics.iter().any(|m| l.starts_with(&format!("{m}{{"))))
            .collect();
        for (at, _) in query.match_indices("by (") {
            let labels = &query[at + 4..];
            for label in labels[..labels.find(')').unwrap()]
                .split(',')
                .map(str::trim)
            {
                assert!(
                    shown.is_empty()
                        || shown.iter().any(|l| {
                            l.contains(&format!("{{{label}=\""))
                                || l.contains(&format!(",{label}=\""))
                        }),
                    "the dashboard groups {metrics:?} by {label}, a label they do not carry:\n{query}"
                );
            }
        }
    }
    // As recording rules, so that promtool parses each query.
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("dashboard.rules.yml");
    let mut yaml = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (n, query) in queries.iter().enumerate() {
        yaml.push_str(&format!(
            "      - record: dashboard:query_{n}\n        expr: '{}'\n",
            query.replace('\'', "''")
        ));
    }
    std::fs::write(&rules, yaml).unwrap();
    let promtool = std::env::var("GANTRY_PROMTOOL").unwrap_or_else(|_| "promtool".into());
    let output = std::process::Command::new(&promtool)
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {promtool}: {e}"));
    assert!(
        output.status.success(),
        "promtool check rules refused a dashboard query:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Runs `promtool check metrics` (Debian's package `prometheus`, which scripts/test.sh
/// installs; `GANTRY_PROMTOOL` names another) on an exposition: it must parse and follow
/// Prometheus' naming rules (units spelled out, `_total` on counters, …).
pub fn promtool_accepts(text: &str) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let promtool = std::env::var("GANTRY_PROMTOOL").unwrap_or_else(|_| "promtool".into());
    let mut child = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {promtool}: {e}; install Debian's prometheus package \
                 (scripts/test.sh does) or set GANTRY_PROMTOOL"
            )
        });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "promtool check metrics refused /metrics:\n{}{}\n--- the exposition ---\n{text}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
