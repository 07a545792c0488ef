//! Requests over several instances of real backends: spread by the balancer, retried on
//! another instance when one is killed, loading (503) or frozen, and a frozen instance
//! ejected or left behind when it leaves routing.

use std::time::Duration;

use gantry_types::InstanceState;
use reqwest::StatusCode;

use crate::common::fake::unavailable_backend;
use crate::common::{assert_openai_error, metric, TestGateway};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_spread_over_instances_and_survive_a_killed_backend() {
    let gateway = TestGateway::start().await;
    let mut first = gateway.llama_server().await;
    let second = gateway.llama_server().await;
    gateway
        .deploy("tiny", &[first.address(), second.address()])
        .await;

    let mut served = std::collections::BTreeMap::<String, u32>::new();
    for _ in 0..6 {
        let (status, instance, reply) = gateway.chat("tiny").await;
        assert_eq!(status, StatusCode::OK, "{reply}");
        *served.entry(instance.unwrap()).or_default() += 1;
    }
    assert_eq!(served.len(), 2, "requests were not spread: {served:?}");
    assert!(
        served.values().all(|n| *n == 3),
        "ties should alternate: {served:?}"
    );

    // kill -9 one backend: every request still succeeds, on the other one.
    first.kill();
    let mut survivors = std::collections::BTreeSet::new();
    for _ in 0..6 {
        let (status, instance, reply) = gateway.chat("tiny").await;
        assert_eq!(status, StatusCode::OK, "{reply}");
        survivors.insert(instance.unwrap());
    }
    assert_eq!(survivors.len(), 1, "{survivors:?}");
    let text = gateway.metrics().await;
    let failed_tries = metric(
        &text,
        "gantry_gateway_errors_total{model=\"tiny\",kind=\"upstream_connect\"}",
    ) + metric(
        &text,
        "gantry_gateway_errors_total{model=\"tiny\",kind=\"upstream_request\"}",
    );
    assert!(
        failed_tries >= 1.0,
        "the dead backend was never tried:\n{text}"
    );
    assert_eq!(
        metric(
            &text,
            "gantry_gateway_errors_total{model=\"tiny\",kind=\"all_tries_failed\"}"
        ),
        0.0
    );

    drop(second);
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_from_an_instance_is_retried_on_another() {
    let gateway = TestGateway::start().await;
    let backend = gateway.llama_server().await;
    let loading = unavailable_backend().await;
    gateway.deploy("tiny", &[loading, backend.address()]).await;
    for _ in 0..4 {
        let (status, instance, reply) = gateway.chat("tiny").await;
        assert_eq!(status, StatusCode::OK, "{reply}");
        assert_eq!(
            instance.as_deref(),
            Some("tiny-1"),
            "served by the loading instance"
        );
    }
    let text = gateway.metrics().await;
    assert!(
        metric(
            &text,
            "gantry_gateway_errors_total{model=\"tiny\",kind=\"upstream_unavailable\"}"
        ) >= 1.0,
        "{text}"
    );
    drop(backend);
    gateway.shutdown().await;
}

/// The first-byte timeout the ejection test configures.
const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(2);
/// The failures in a row the ejection test configures.
const EJECT_AFTER: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_instance_is_ejected_and_every_request_is_served_by_the_other() {
    let gateway = TestGateway::start_with(|config| {
        config.first_byte_timeout = Some(FIRST_BYTE_TIMEOUT);
        config.ejection.eject_after = EJECT_AFTER;
        // Far longer than the test: the frozen instance must not come back during it.
        config.ejection.cooldown = Duration::from_secs(600);
    })
    .await;
    let frozen = gateway.llama_server().await;
    let healthy = gateway.llama_server().await;
    // tiny-0 is the frozen one; solo-0 is the same frozen server, alone in its model.
    gateway
        .deploy("tiny", &[frozen.address(), healthy.address()])
        .await;
    gateway.deploy("solo", &[frozen.address()]).await;
    frozen.freeze();

    let chatter = gateway.chatter();
    let timeouts = "gantry_gateway_errors_total{model=\"tiny\",kind=\"upstream_timeout\"}";
    let ejections =
        "gantry_gateway_instance_ejections_total{model=\"tiny\",model_instance=\"tiny-0\"}";
    let mut ejected_after = None;
    let mut slowest = Duration::ZERO;
    for i in 0..20 {
        let (status, instance, reply, took) = chatter.chat("tiny").await;
        assert_eq!(status, StatusCode::OK, "request {i}: {reply}");
        assert_eq!(instance.as_deref(), Some("tiny-1"), "request {i}");
        // At most one try waited out the timeout; generous for a busy machine.
        assert!(
            took < FIRST_BYTE_TIMEOUT + Duration::from_secs(8),
            "request {i} took {took:?}"
        );
        slowest = slowest.max(took);
        if ejected_after.is_none() && metric(&gateway.metrics().await, ejections) == 1.0 {
            ejected_after = Some(i + 1);
        }
    }
    let ejected_after = ejected_after.expect("the frozen instance was never ejected");
    let text = gateway.metrics().await;
    assert_eq!(metric(&text, timeouts), EJECT_AFTER as f64, "{text}");
    // Each request tries the frozen instance first while the balancer's turn falls on
    // it (every one, as the turns go with two instances): ejected after about as many.
    assert!(
        (EJECT_AFTER..=2 * EJECT_AFTER).contains(&ejected_after),
        "ejected after {ejected_after} requests:\n{text}"
    );
    assert_eq!(
        metric(
            &text,
            "gantry_gateway_instance_ejected{model=\"tiny\",model_instance=\"tiny-0\"}"
        ),
        1.0,
        "{text}"
    );

    // Concurrent requests after the ejection: none is sent to the frozen instance, even
    // though it is the least loaded.
    let concurrent: Vec<_> = (0..5)
        .map(|_| {
            let chatter = chatter.clone();
            tokio::spawn(async move { chatter.chat("tiny").await })
        })
        .collect();
    for request in concurrent {
        let (status, instance, reply, took) = request.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{reply}");
        assert_eq!(instance.as_deref(), Some("tiny-1"));
        slowest = slowest.max(took);
    }
    let text = gateway.metrics().await;
    assert_eq!(
        metric(&text, timeouts),
        EJECT_AFTER as f64,
        "an ejected instance got another try:\n{text}"
    );
    assert_eq!(metric(&text, ejections), 1.0, "{text}");
    assert_eq!(
        metric(
            &text,
            "gantry_gateway_errors_total{model=\"tiny\",kind=\"all_tries_failed\"}"
        ),
        0.0,
        "{text}"
    );
    eprintln!(
        "measured: frozen instance ejected after {ejected_after} requests; slowest of 25 requests {slowest:?}"
    );

    // A model whose only instance is frozen: 504 once the timeout runs out, naming it.
    let (status, _, reply, took) = chatter.chat("solo").await;
    let error = assert_openai_error(status, &reply, 504, "server_error", "upstream_timeout");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("gateway_first_byte_timeout"),
        "{reply}"
    );
    assert!(
        took >= FIRST_BYTE_TIMEOUT && took < FIRST_BYTE_TIMEOUT + Duration::from_secs(8),
        "the 504 took {took:?}"
    );
    eprintln!("measured: 504 from the frozen single instance after {took:?}");

    frozen.thaw();
    drop((frozen, healthy));
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_on_an_instance_that_leaves_routing_is_retried_at_once() {
    // No first-byte timeout: only the instance leaving routing can free the request.
    let gateway = TestGateway::start().await;
    let frozen = gateway.llama_server().await;
    let healthy = gateway.llama_server().await;
    let ids = gateway
        .deploy("tiny", &[frozen.address(), healthy.address()])
        .await;
    frozen.freeze();

    // Send requests until one waits on the frozen instance: the balancer takes turns
    // while both are idle.
    let chatter = gateway.chatter();
    let stuck_series =
        "gantry_gateway_instance_requests_in_flight{model=\"tiny\",model_instance=\"tiny-0\"}";
    let mut stuck = None;
    'send: for _ in 0..4 {
        let request = tokio::spawn({
            let chatter = chatter.clone();
            async move { chatter.chat("tiny").await }
        });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if metric(&gateway.metrics().await, stuck_series) == 1.0 {
                stuck = Some(request);
                break 'send;
            }
            if request.is_finished() {
                let (status, instance, reply, _) = request.await.unwrap();
                assert_eq!(status, StatusCode::OK, "{reply}");
                assert_eq!(instance.as_deref(), Some("tiny-1"));
                continue 'send;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "a request neither ended nor waited on tiny-0"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
    let stuck = stuck.expect("no request was sent to the frozen instance");
    // It stays stuck: nothing else frees it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !stuck.is_finished(),
        "the request on the frozen instance ended by itself"
    );

    // Its worker finds it failing its health probe.
    let reported = tokio::time::Instant::now();
    gateway.report(ids[0], InstanceState::Unhealthy, &frozen.address());
    let (status, instance, reply, took) = tokio::time::timeout(Duration::from_secs(10), stuck)
        .await
        .expect("the request on the instance that left routing was not retried")
        .unwrap();
    let retried_after = reported.elapsed();
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(instance.as_deref(), Some("tiny-1"));
    assert!(
        retried_after < Duration::from_secs(5),
        "retried only after {retried_after:?}"
    );
    eprintln!(
        "measured: request answered {retried_after:?} after tiny-0 was reported unhealthy ({took:?} in all)"
    );
    let text = gateway.wait_idle("tiny", "tiny-1").await;
    assert_eq!(
        metric(
            &text,
            "gantry_gateway_errors_total{model=\"tiny\",kind=\"instance_left_routing\"}"
        ),
        1.0,
        "{text}"
    );
    assert_eq!(
        metric(&text, "gantry_gateway_routable_instances{model=\"tiny\"}"),
        1.0,
        "{text}"
    );

    frozen.thaw();
    drop((frozen, healthy));
    gateway.shutdown().await;
}
