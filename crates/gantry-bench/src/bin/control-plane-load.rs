//! The control-plane load benchmark: N simulated workers (test doubles of the worker
//! agent) against one real `gantry server`, then M instances deployed, list endpoints,
//! create/delete churn and worker flips, each phase printing its figures
//! (`gantry_bench::control_plane`). `scripts/bench-control-plane.sh` starts the server
//! and runs this; by hand:
//!
//! ```text
//! BENCH_URL=http://127.0.0.1:8080 BENCH_ADMIN_PASSWORD=… BENCH_REGISTRATION_TOKEN=… \
//!   BENCH_SERVER_PID=… BENCH_WORKERS=1000 BENCH_INSTANCES=10000 control-plane-load
//! ```

use gantry_bench::control_plane::{run, Config};

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BENCH_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let config = match Config::from_env() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("control-plane-load: {e:#}");
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime builds");
    if let Err(e) = runtime.block_on(run(config)) {
        eprintln!("control-plane-load: {e:#}");
        std::process::exit(1);
    }
}
