//! How long a new model waits to be scheduled: `POST /api/v1/models` → its instance
//! `scheduled`, over many creations one after the other, against a running gantry.
//!
//! ```text
//! GANTRY_URL=http://127.0.0.1:8080 GANTRY_TOKEN=… BENCH_MODEL_PATH=/…/models/bench.bin \
//!   scheduling-latency [CREATIONS]
//! ```
//!
//! Each model is a CPU-only `custom` model running `sleep` (the worker starts it; it is
//! never asked to serve). The time is taken from just before the create request to the
//! instance-watch event that shows the model's instance `scheduled` (or any later state),
//! so it includes the API call, the store write, the leader's pass and the watch fan-out.
//! The model is deleted before the next creation. `scripts/bench-scheduling.sh` starts a
//! gantry and runs this.

use std::time::{Duration, Instant};

use gantry_client::Client;
use gantry_types::{InstanceQuery, InstanceState, ModelCreate, ModelInstance, WatchEvent};

/// The longest a single creation may wait before the run gives up.
const DEADLINE: Duration = Duration::from_secs(30);

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        eprintln!("scheduling-latency: set {name} (see the module documentation)");
        std::process::exit(2)
    })
}

fn placed(state: InstanceState) -> bool {
    !matches!(
        state,
        InstanceState::Pending | InstanceState::Analyzing | InstanceState::Error
    )
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let creations: usize = std::env::args()
        .nth(1)
        .map(|n| n.parse().expect("CREATIONS is a number"))
        .unwrap_or(100);
    let client = Client::new(env("GANTRY_URL")).with_token(env("GANTRY_TOKEN"));
    let model_path = env("BENCH_MODEL_PATH");
    let mut watch = client
        .watch_instances(&InstanceQuery::default())
        .await
        .expect("the instance watch opens");
    let mut latencies = Vec::with_capacity(creations);
    for i in 0..creations {
        let create: ModelCreate = serde_json::from_value(serde_json::json!({
            "name": format!("bench-{i}"),
            "source": {"type": "local_path", "path": model_path},
            "backend": "custom",
            "custom_command": "sleep 600",
            "env": {"GANTRY_GPU_COUNT": "0"},
            "replicas": 1,
        }))
        .expect("a valid model body");
        let started = Instant::now();
        let model = client
            .create_model(&create)
            .await
            .expect("the model is created");
        loop {
            let event =
                tokio::time::timeout(DEADLINE.saturating_sub(started.elapsed()), watch.next())
                    .await
                    .unwrap_or_else(|_| {
                        panic!("model {} not scheduled within {DEADLINE:?}", model.id)
                    })
                    .expect("the watch stays open")
                    .expect("a watch event decodes");
            let instance: ModelInstance = match event {
                WatchEvent::Created { object } | WatchEvent::Updated { object } => object,
                _ => continue,
            };
            if instance.model_id == model.id && placed(instance.state) {
                latencies.push(started.elapsed());
                break;
            }
        }
        client
            .delete_model(model.id)
            .await
            .expect("the model is deleted");
    }
    latencies.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "create → scheduled over {} creations: p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        latencies.len(),
        ms(percentile(&latencies, 50.0)),
        ms(percentile(&latencies, 90.0)),
        ms(percentile(&latencies, 99.0)),
        ms(*latencies.last().expect("at least one creation")),
    );
}
