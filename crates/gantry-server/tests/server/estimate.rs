//! `POST /api/v1/models/estimate` and the parts of an instance's reservation, against a real
//! server on SQLite and PostgreSQL: workers with simulated GPUs register through the API,
//! the tiny GGUF model (and a safetensors header claiming 500 GB) are estimated before any
//! model exists, every verdict is checked against the bytes it explains, and an instance
//! placed afterwards shows the same parts in `GET /api/v1/model-instances/{id}`.

use std::path::{Path, PathBuf};

use crate::common::{
    assert_raw_error, expect_error, huge_safetensors_dir, model, simulated_worker, user, Options,
    TestServer, GIB,
};
use gantry_testkit::{test_both_engines, TestEngine};
use gantry_types::{
    BackendKind, ErrorCode, InstanceState, ModelCreate, ModelEstimate, ModelMemory, ModelQuery,
    Placement, PlacementKind, ReservationParts, WorkerState,
};
use reqwest::{Method, StatusCode};
use serde_json::json;

/// Registers a worker with one simulated GPU of `gpu_bytes`.
async fn register(server: &TestServer, name: &str, gpu_bytes: u64) {
    let mut registration = simulated_worker(name, 1);
    registration.status.gpus[0].memory_total = gpu_bytes;
    server.register(&registration).await;
}

fn tiny_gguf(server: &TestServer) -> PathBuf {
    let path = server.data_dir.path().join("tiny.gguf");
    gantry_gguf::write_tiny_llama(&path).unwrap();
    path
}

/// The tiny model on llama.cpp, GPUs only unless `cpu_offload`.
fn tiny(path: &Path, replicas: u32, cpu_offload: bool) -> ModelCreate {
    let mut create = model("tiny", &path.display().to_string(), replicas);
    create.cpu_offload = cpu_offload;
    create
}

/// Every GPU's parts and RAM's parts add up to exactly the bytes `placement` reserves.
fn assert_parts_add_up(placement: &Placement, parts: &ReservationParts) {
    assert_eq!(parts.gpus.len(), placement.gpus.len(), "{parts:?}");
    for (gpu, share) in parts.gpus.iter().zip(&placement.gpus) {
        assert_eq!((gpu.index, gpu.total_bytes), (share.index, share.bytes));
        let sum = gpu.weights_bytes
            + gpu.kv_cache_bytes
            + gpu.extra_kv_cache_bytes
            + gpu.compute_buffer_bytes
            + gpu.overhead_bytes
            + gpu.declared_bytes;
        assert_eq!(sum, share.bytes, "GPU {}: {gpu:?}", share.index);
    }
    let ram = &parts.ram;
    let sum = ram.weights_bytes
        + ram.embedding_bytes
        + ram.kv_cache_bytes
        + ram.compute_buffer_bytes
        + ram.logits_bytes
        + ram.process_bytes;
    assert_eq!(ram.total_bytes, placement.ram_bytes);
    assert_eq!(sum, placement.ram_bytes, "RAM: {ram:?}");
}

async fn estimate_says_where_a_model_fits_and_why_not(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = server.client();
    register(&server, "big", 80 * GIB).await;
    // Smaller than a CUDA context: nothing llama.cpp runs fits on it.
    register(&server, "small", 256 << 20).await;
    let path = tiny_gguf(&server);

    let estimate = admin.estimate_model(&tiny(&path, 2, false)).await.unwrap();
    println!(
        "estimate of the tiny model:\n{}",
        serde_json::to_string_pretty(&estimate).unwrap()
    );
    assert_eq!(estimate.backend, BackendKind::LlamaCpp);
    assert_eq!(estimate.context_size, Some(256), "the trained context");
    let ModelMemory::Layers(layers) = &estimate.claim.memory else {
        panic!("llama.cpp claims are layered: {:?}", estimate.claim);
    };
    assert_eq!(layers.block_bytes.len(), 2);
    assert_eq!(
        layers.block_kv_bytes.len(),
        2,
        "the claim records its parts"
    );
    let parts = &estimate.parts;
    assert!(
        parts.weights_bytes > 0 && parts.kv_cache_bytes > 0,
        "{parts:?}"
    );
    assert_eq!(
        parts.per_gpu_overhead_bytes + parts.per_gpu_compute_buffer_bytes,
        estimate.claim.per_gpu_overhead_bytes
    );

    // Both replicas fit, on the big worker.
    assert_eq!(estimate.replicas.len(), 2);
    for replica in &estimate.replicas {
        assert!(replica.fits, "{replica:?}");
        let placement = replica.placement.as_ref().unwrap();
        assert_eq!(placement.worker_name, "big");
        assert_eq!(placement.kind, PlacementKind::SingleGpu);
        assert_parts_add_up(placement, replica.parts.as_ref().unwrap());
    }

    // Each worker's verdict on one instance.
    let names: Vec<&str> = estimate
        .workers
        .iter()
        .map(|w| w.worker_name.as_str())
        .collect();
    assert_eq!(names, ["big", "small"]);
    let big = &estimate.workers[0];
    assert!(big.fits && big.reason.is_none(), "{big:?}");
    assert!(big.simulated_gpus);
    assert_eq!(big.worker_state, WorkerState::Ready);
    let placement = big.placement.as_ref().unwrap();
    let big_parts = big.parts.as_ref().unwrap();
    assert_parts_add_up(placement, big_parts);
    let gpu = &big_parts.gpus[0];
    assert!(gpu.weights_bytes > 0 && gpu.kv_cache_bytes > 0 && gpu.compute_buffer_bytes > 0);
    assert_eq!(gpu.overhead_bytes, 512 << 20, "the CUDA context");
    let layers_on_gpu = gpu.layers.unwrap();
    assert_eq!(
        (layers_on_gpu.blocks, layers_on_gpu.output_layer),
        (2, true)
    );
    let small = &estimate.workers[1];
    assert!(!small.fits && small.placement.is_none() && small.parts.is_none());
    let reason = small.reason.as_deref().unwrap();
    assert!(
        reason.starts_with("no ready worker has 1 GPU with") && reason.contains("best: small"),
        "the scheduler's words for a pending instance: {reason}"
    );

    // With CPU offload the small worker runs it on the CPU: RAM holds every part.
    let estimate = admin.estimate_model(&tiny(&path, 1, true)).await.unwrap();
    let small = &estimate.workers[1];
    let placement = small.placement.as_ref().unwrap();
    assert_eq!(placement.kind, PlacementKind::CpuOnly, "{small:?}");
    let small_parts = small.parts.as_ref().unwrap();
    assert_parts_add_up(placement, small_parts);
    assert!(small_parts.ram.weights_bytes > 0 && small_parts.ram.compute_buffer_bytes > 0);
    assert_eq!(small_parts.ram.layers.unwrap().blocks, 2);

    // A model that fits nowhere: 500 GB of weights on vLLM.
    let mut huge = model(
        "huge",
        &huge_safetensors_dir(&server).display().to_string(),
        1,
    );
    huge.backend = BackendKind::Vllm.into();
    let estimate = admin.estimate_model(&huge).await.unwrap();
    assert_eq!(estimate.context_size, None);
    assert!(matches!(estimate.claim.memory, ModelMemory::Engine(_)));
    assert_eq!(estimate.parts.weights_bytes, 500_000_000_000);
    let replica = &estimate.replicas[0];
    assert!(!replica.fits && replica.placement.is_none());
    let reason = replica.reason.as_deref().unwrap();
    assert!(reason.contains("of memory free"), "{reason}");
    assert!(estimate
        .workers
        .iter()
        .all(|w| !w.fits && w.reason.is_some()));

    // Nothing was stored.
    let models = admin.list_models(&ModelQuery::default()).await.unwrap();
    assert!(models.items.is_empty(), "{models:?}");
    server.shutdown().await;
}

async fn estimate_refuses_what_model_creation_refuses(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = server.client();
    let path = tiny_gguf(&server);

    // A file that does not exist on the server: 422 naming the field and the path, the
    // same answer as creating the model.
    let missing = server.data_dir.path().join("nowhere.gguf");
    let missing_model = model("m", &missing.display().to_string(), 1);
    let message = expect_error(
        admin.estimate_model(&missing_model).await,
        422,
        ErrorCode::ValidationFailed,
    );
    assert!(
        message.starts_with("source.path:")
            && message.contains(&missing.display().to_string())
            && message.contains("does not exist on the server"),
        "{message}"
    );
    let created = expect_error(
        admin.create_model(&missing_model).await,
        422,
        ErrorCode::ValidationFailed,
    );
    assert_eq!(message, created);
    // A file that is not a model.
    let not_gguf = server.data_dir.path().join("notes.gguf");
    std::fs::write(&not_gguf, b"hello, not a model").unwrap();
    let message = expect_error(
        admin
            .estimate_model(&model("m", &not_gguf.display().to_string(), 1))
            .await,
        422,
        ErrorCode::ValidationFailed,
    );
    assert!(message.contains("not a usable GGUF file"), "{message}");
    // Arguments the estimate cannot read name the field.
    let mut bad_args = tiny(&path, 1, false);
    bad_args.backend_args = vec!["--ctx-size".into(), "many".into()];
    let message = expect_error(
        admin.estimate_model(&bad_args).await,
        422,
        ErrorCode::ValidationFailed,
    );
    assert!(message.contains("backend_args"), "{message}");

    // The body's own rules: the same answer as creating the model.
    let relative = model("m", "models/tiny.gguf", 1);
    let estimated = expect_error(
        admin.estimate_model(&relative).await,
        422,
        ErrorCode::ValidationFailed,
    );
    let created = expect_error(
        admin.create_model(&relative).await,
        422,
        ErrorCode::ValidationFailed,
    );
    assert_eq!(estimated, created);
    assert!(estimated.contains("source.path"), "{estimated}");
    let mut undefined = tiny(&path, 1, false);
    undefined.backend = gantry_types::BackendName::new("no-such-backend");
    let message = expect_error(
        admin.estimate_model(&undefined).await,
        422,
        ErrorCode::ValidationFailed,
    );
    assert!(message.starts_with("backend:"), "{message}");
    let mut upload = tiny(&path, 1, false);
    upload.source = gantry_types::ModelSource::Upload { id: 42 };
    let message = expect_error(
        admin.estimate_model(&upload).await,
        422,
        ErrorCode::ValidationFailed,
    );
    assert!(message.contains("source.id"), "{message}");

    // The wire: unknown fields, bad JSON, the wrong method.
    let token = admin.token().unwrap();
    let (status, body) = server
        .raw(
            Method::POST,
            "/api/v1/models/estimate",
            Some(&token),
            Some(
                json!({"name": "m", "source": {"type": "local_path", "path": "/m.gguf"},
                        "backend": "llama.cpp", "gpus": 2}),
            ),
        )
        .await;
    let message = assert_raw_error(status, &body, 422, ErrorCode::ValidationFailed);
    assert!(message.contains("gpus"), "{message}");
    let (status, body) = server
        .raw_bytes(
            Method::POST,
            "/api/v1/models/estimate",
            Some(&token),
            "application/json",
            b"{not json".to_vec(),
        )
        .await;
    assert_raw_error(status, &body, 400, ErrorCode::InvalidRequest);
    let (status, body) = server
        .raw(Method::GET, "/api/v1/models/estimate", Some(&token), None)
        .await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{body}");

    // The permission of creating a model: admins only.
    expect_error(
        server
            .anonymous()
            .estimate_model(&tiny(&path, 1, false))
            .await,
        401,
        ErrorCode::Unauthorized,
    );
    admin
        .create_user(&user("bob", "bob-password"))
        .await
        .unwrap();
    let bob = server.login("bob", "bob-password").await;
    expect_error(
        bob.estimate_model(&tiny(&path, 1, false)).await,
        403,
        ErrorCode::Forbidden,
    );

    // The OpenAPI document describes it.
    let (_, spec) = server
        .raw(Method::GET, "/api/openapi.json", None, None)
        .await;
    let operation = &spec["paths"]["/api/v1/models/estimate"]["post"];
    assert_eq!(
        operation["requestBody"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/ModelCreate"
    );
    assert_eq!(
        operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/ModelEstimate"
    );
    for schema in [
        "ModelEstimate",
        "WorkerVerdict",
        "ReservationParts",
        "GpuParts",
    ] {
        assert!(
            spec["components"]["schemas"].get(schema).is_some(),
            "spec lacks {schema}"
        );
    }
    server.shutdown().await;
}

async fn an_instance_shows_the_parts_of_its_reservation(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = server.client();
    register(&server, "big", 80 * GIB).await;
    let path = tiny_gguf(&server);
    let create = tiny(&path, 1, false);
    let estimate: ModelEstimate = admin.estimate_model(&create).await.unwrap();

    let model = admin.create_model(&create).await.unwrap();
    let instances = server
        .wait_for_instances(model.id, "scheduled", |instances| {
            instances.len() == 1 && instances[0].state == InstanceState::Scheduled
        })
        .await;
    let instance = admin.get_instance(instances[0].id).await.unwrap();
    let reservation = instance
        .placement
        .as_ref()
        .and_then(|record| record.reservation.as_ref())
        .unwrap();
    let parts = reservation.parts.as_ref().expect("the reservation's parts");
    assert_parts_add_up(&reservation.placement, parts);
    assert!(parts.gpus[0].kv_cache_bytes > 0 && parts.gpus[0].compute_buffer_bytes > 0);

    // The estimate said exactly this, before the model existed.
    let predicted = &estimate.replicas[0];
    let predicted_placement = predicted.placement.as_ref().unwrap();
    assert_eq!(
        predicted_placement.worker_name,
        reservation.placement.worker_name
    );
    assert_eq!(predicted_placement.gpus, reservation.placement.gpus);
    assert_eq!(
        predicted_placement.ram_bytes,
        reservation.placement.ram_bytes
    );
    assert_eq!(predicted.parts.as_ref(), Some(parts));
    assert_eq!(estimate.claim, reservation.claim);

    // The wire shows them too, under placement.reservation.parts.
    let token = admin.token().unwrap();
    let (status, body) = server
        .raw(
            Method::GET,
            &format!("/api/v1/model-instances/{}", instance.id),
            Some(&token),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let gpu = &body["placement"]["reservation"]["parts"]["gpus"][0];
    for field in [
        "weights_bytes",
        "kv_cache_bytes",
        "compute_buffer_bytes",
        "overhead_bytes",
        "total_bytes",
    ] {
        assert!(gpu[field].is_u64(), "{field} in {body}");
    }
    server.shutdown().await;
}

/// A hub the server cannot reach is said so in words, naming the host and what to check,
/// not in the resolver's or the socket's.
async fn an_estimate_from_a_hub_the_server_cannot_reach_says_so(engine: TestEngine) {
    let server = TestServer::start_with(
        engine,
        Options {
            // Nothing listens on port 1 of the loopback.
            configure: |config| config.sources.hf_endpoint = "http://127.0.0.1:1".into(),
            ..Options::default()
        },
    )
    .await;
    let admin = server.client();
    let mut from_hub = model("m", "/unused.gguf", 1);
    from_hub.source = gantry_types::ModelSource::Huggingface {
        repo_id: "org/model-GGUF".into(),
        file: Some("*Q4_K_M.gguf".into()),
        revision: None,
    };
    let message = expect_error(
        admin.estimate_model(&from_hub).await,
        422,
        ErrorCode::ValidationFailed,
    );
    assert!(
        message.contains(
            "the server cannot reach 127.0.0.1 (it refuses connections), so it cannot read \
             the model's headers"
        ) && message.contains("hf_endpoint"),
        "{message}"
    );
    for backend_text in [
        "error sending request",
        "tcp connect",
        "os error",
        "retried",
    ] {
        assert!(!message.contains(backend_text), "{message}");
    }
    server.shutdown().await;
}

test_both_engines!(
    an_estimate_from_a_hub_the_server_cannot_reach_says_so,
    estimate_says_where_a_model_fits_and_why_not,
    estimate_refuses_what_model_creation_refuses,
    an_instance_shows_the_parts_of_its_reservation,
);
