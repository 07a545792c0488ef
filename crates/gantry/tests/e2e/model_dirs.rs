//! `local_path` models are read only from a worker's `model_dirs`, with real processes:
//! `gantry server`, `gantry worker --model-dirs <dir>/models` and a real `llama-server`.
//!
//! * A model under the directory runs.
//! * A model outside it, and one reached through a symlink inside it that points outside,
//!   end in `error` with a message naming the allowed directory and the flag to change.
//! * A path with `..` is refused when the model is created (422), before any worker sees
//!   it.

use std::time::Duration;

use crate::common::{tiny_model, tiny_model_create, Cluster};
use gantry_types::{InstanceState, ModelInstance};

/// The instance of a single-replica model once it is running or in error.
async fn settled(cluster: &Cluster, model: &gantry_types::ModelCreate) -> ModelInstance {
    let (_, ids) = cluster.create_model(model).await;
    cluster
        .wait_for(
            &format!("model {} to run or fail", model.name),
            Duration::from_secs(60),
            || cluster.client().get_instance(ids[0]),
            |i| matches!(i.state, InstanceState::Running | InstanceState::Error),
        )
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_paths_outside_the_model_directories_are_refused() {
    let cluster = Cluster::start(&[]).await;
    let root = cluster.dir.path();
    let models = root.join("models");
    let outside = root.join("outside");
    std::fs::create_dir_all(&models).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    let allowed = tiny_model(&models);
    let private = tiny_model(&outside);
    let escape = models.join("escape.gguf");
    std::os::unix::fs::symlink(&private, &escape).unwrap();

    let worker = cluster.worker(
        "w1",
        &[
            "--heartbeat-interval",
            "300ms",
            "--model-dirs",
            &models.display().to_string(),
        ],
    );
    cluster.worker_id("w1", &worker).await;

    let inside = settled(&cluster, &tiny_model_create("inside", &allowed, 1)).await;
    assert_eq!(
        inside.state,
        InstanceState::Running,
        "{:?}",
        inside.state_message
    );

    let refused = settled(&cluster, &tiny_model_create("outside", &private, 1)).await;
    assert_eq!(refused.state, InstanceState::Error);
    let message = refused.state_message;
    println!("outside: {message}");
    assert!(
        message.contains("outside worker w1's model directories"),
        "{message}"
    );
    assert!(message.contains(&models.display().to_string()), "{message}");
    assert!(message.contains("--model-dirs"), "{message}");

    let linked = settled(&cluster, &tiny_model_create("linked", &escape, 1)).await;
    assert_eq!(linked.state, InstanceState::Error);
    let message = linked.state_message;
    println!("through a symlink: {message}");
    assert!(message.contains("which resolves to"), "{message}");
    assert!(
        message.contains(&private.display().to_string()),
        "{message}"
    );

    let dotdot = models.join("../outside/tiny.gguf");
    let error = cluster
        .client()
        .create_model(&tiny_model_create("dotdot", &dotdot, 1))
        .await
        .unwrap_err();
    println!("with '..': {error}");
    let text = error.to_string();
    assert!(text.contains("422"), "{text}");
    assert!(text.contains("source.path"), "{text}");
}
