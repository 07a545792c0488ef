//! Worker filters: which workers may receive an instance at all, before any fit is checked.
//!
//! A worker is eligible when it is ready, carries every label of the request's selector with
//! the same value, and lists the request's backend. The manual GPU selection and the memory
//! fit are checked later, by placement.

use std::collections::BTreeMap;

use crate::request::PlacementRequest;
use crate::snapshot::WorkerView;

/// Whether `worker` carries every `key=value` of `selector`.
pub(crate) fn matches_selector(worker: &WorkerView, selector: &BTreeMap<String, String>) -> bool {
    selector
        .iter()
        .all(|(key, value)| worker.labels.get(key) == Some(value))
}

/// Whether `worker` can run `backend`.
pub(crate) fn runs_backend(worker: &WorkerView, backend: &str) -> bool {
    worker.backends.contains(backend)
}

/// Whether `worker` passes every filter of `request`.
pub(crate) fn eligible(worker: &WorkerView, request: &PlacementRequest) -> bool {
    worker.ready
        && runs_backend(worker, &request.backend)
        && matches_selector(worker, &request.selector)
        && request
            .only_installed
            .as_ref()
            .is_none_or(|installed| worker.installed.contains(installed))
}

/// A selector as `key=value,key=value`, in key order.
pub(crate) fn format_selector(selector: &BTreeMap<String, String>) -> String {
    selector
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{llama_request, worker};

    #[test]
    fn selector_needs_every_label_with_its_value() {
        let w = worker(1, "w1")
            .label("zone", "a")
            .label("tier", "gpu")
            .build();
        let mut selector = BTreeMap::new();
        assert!(
            matches_selector(&w, &selector),
            "the empty selector matches all"
        );
        selector.insert("zone".to_owned(), "a".to_owned());
        assert!(matches_selector(&w, &selector));
        selector.insert("tier".to_owned(), "cpu".to_owned());
        assert!(!matches_selector(&w, &selector));
        assert_eq!(format_selector(&selector), "tier=cpu,zone=a");
    }

    #[test]
    fn eligibility_needs_ready_backend_and_selector() {
        let request = llama_request(1, 1_000);
        assert!(eligible(&worker(1, "w1").build(), &request));
        assert!(!eligible(&worker(1, "w1").not_ready().build(), &request));
        assert!(!eligible(
            &worker(1, "w1").backends(&["vllm"]).build(),
            &request
        ));
        let mut selective = request.clone();
        selective.selector.insert("app".to_owned(), "x".to_owned());
        assert!(!eligible(&worker(1, "w1").build(), &selective));
        assert!(eligible(
            &worker(1, "w1").label("app", "x").build(),
            &selective
        ));
    }
}
