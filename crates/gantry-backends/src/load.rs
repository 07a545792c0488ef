//! How many requests a running backend is answering, read from one of its own endpoints,
//! so that a stop can let them finish first (the worker's drain, see
//! `gantry-worker`'s supervisor).
//!
//! * llama.cpp: `GET /slots` (on by default; `--no-slots` turns it off), busy slots are the
//!   ones with `"is_processing": true`;
//! * vLLM: `GET /metrics`, the gauges `vllm:num_requests_running` and
//!   `vllm:num_requests_waiting`;
//! * SGLang: `GET /metrics` (only with `--enable-metrics`), the gauges
//!   `sglang:num_running_reqs` and `sglang:num_queue_reqs`;
//! * a custom command: nothing is known.
//!
//! An answer that does not say (an endpoint turned off, another format) reads as `None`: the
//! worker then stops without waiting.

/// Where a backend tells its load, and how to read the answer.
#[derive(Debug, Clone, Copy)]
pub struct LoadProbe {
    /// The path to `GET`.
    pub path: &'static str,
    /// The number of requests in progress or queued in the answer's body, `None` when the
    /// body does not say.
    pub read: fn(&str) -> Option<u64>,
}

/// llama.cpp's slots.
pub const LLAMA_CPP: LoadProbe = LoadProbe {
    path: "/slots",
    read: busy_slots,
};

/// vLLM's scheduler gauges.
pub const VLLM: LoadProbe = LoadProbe {
    path: "/metrics",
    read: |text| {
        gauge_sum(
            text,
            &["vllm:num_requests_running", "vllm:num_requests_waiting"],
        )
    },
};

/// SGLang's scheduler gauges.
pub const SGLANG: LoadProbe = LoadProbe {
    path: "/metrics",
    read: |text| gauge_sum(text, &["sglang:num_running_reqs", "sglang:num_queue_reqs"]),
};

/// The slots of a llama.cpp `/slots` answer that are processing a request.
fn busy_slots(body: &str) -> Option<u64> {
    let slots: Vec<serde_json::Value> = serde_json::from_str(body).ok()?;
    let mut busy = 0;
    for slot in &slots {
        if slot.get("is_processing")?.as_bool()? {
            busy += 1;
        }
    }
    Some(busy)
}

/// The sum of every sample of the named gauges in a Prometheus text exposition; `None` when
/// none of them appears.
fn gauge_sum(text: &str, names: &[&str]) -> Option<u64> {
    let mut sum = 0.0;
    let mut found = false;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        if !names.contains(&&line[..name_end]) {
            continue;
        }
        // The value follows the labels; a timestamp may follow the value.
        let after_labels = match line[name_end..].find('}') {
            Some(close) if line[name_end..].starts_with('{') => &line[name_end + close + 1..],
            _ => &line[name_end..],
        };
        let value: f64 = after_labels.split_whitespace().next()?.parse().ok()?;
        sum += value;
        found = true;
    }
    // Gauges of request counts are whole numbers; round away float noise.
    found.then(|| sum.max(0.0).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_cpp_counts_the_slots_that_process_a_request() {
        let body = r#"[{"id":0,"is_processing":true,"n_ctx":256},
                       {"id":1,"is_processing":false,"n_ctx":256},
                       {"id":2,"is_processing":true,"n_ctx":256}]"#;
        assert_eq!((LLAMA_CPP.read)(body), Some(2));
        assert_eq!((LLAMA_CPP.read)("[]"), Some(0));
        // `--no-slots` answers an error object; an older shape has no flag.
        assert_eq!((LLAMA_CPP.read)(r#"{"error":{"code":501}}"#), None);
        assert_eq!((LLAMA_CPP.read)(r#"[{"id":0}]"#), None);
    }

    #[test]
    fn vllm_sums_running_and_waiting_requests_over_every_label_set() {
        let text =
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n\
            # TYPE vllm:num_requests_running gauge\n\
            vllm:num_requests_running{engine=\"0\",model_name=\"qwen\"} 3.0\n\
            vllm:num_requests_running{engine=\"1\",model_name=\"qwen\"} 1.0\n\
            vllm:num_requests_waiting{engine=\"0\",model_name=\"qwen\"} 2.0\n\
            vllm:num_requests_running_total_extra{model_name=\"qwen\"} 99.0\n\
            vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"qwen\"} 0.5\n";
        assert_eq!((VLLM.read)(text), Some(6));
        let idle = "vllm:num_requests_running{model_name=\"qwen\"} 0.0\n\
            vllm:num_requests_waiting{model_name=\"qwen\"} 0.0 1700000000000\n";
        assert_eq!((VLLM.read)(idle), Some(0));
        assert_eq!((VLLM.read)("other_metric 1\n"), None);
    }

    #[test]
    fn sglang_reads_its_own_gauge_names_with_or_without_labels() {
        let text = "sglang:num_running_reqs{model_name=\"m\"} 1.0\nsglang:num_queue_reqs 4\n";
        assert_eq!((SGLANG.read)(text), Some(5));
        assert_eq!(
            (SGLANG.read)("sglang:num_running_reqs{model_name=\"m\"} nope\n"),
            None
        );
    }
}
