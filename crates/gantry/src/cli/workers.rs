//! `gantry workers ls`.

use clap::{Args, Subcommand};
use gantry_types::{Timestamp, Worker, WorkerQuery};

use super::output::{self, Table};
use super::{connect, every_page, Connection, Output, PAGE_SIZE};

#[derive(Debug, Args)]
pub struct WorkersArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(flatten)]
    output: Output,
    #[command(subcommand)]
    command: WorkersCommand,
}

#[derive(Debug, Subcommand)]
enum WorkersCommand {
    /// List the workers: their state, GPUs and last heartbeat.
    Ls,
}

pub async fn run(args: WorkersArgs) -> anyhow::Result<()> {
    let client = connect(&args.connection)?;
    match args.command {
        WorkersCommand::Ls => {
            let workers = every_page(|page| {
                let query = WorkerQuery {
                    page: Some(page),
                    per_page: Some(PAGE_SIZE),
                    ..WorkerQuery::default()
                };
                let client = &client;
                async move { client.list_workers(&query).await }
            })
            .await?;
            let now = Timestamp::now();
            output::print_list(args.output.format, &workers, |workers| table(workers, now))
        }
    }
}

fn table(workers: &[Worker], now: Timestamp) -> Table {
    let mut table = Table::new(&[
        "ID",
        "NAME",
        "STATE",
        "GPUS",
        "ADDRESS",
        "HEARTBEAT",
        "LABELS",
    ]);
    for worker in workers {
        table.row(vec![
            worker.id.to_string(),
            worker.name.clone(),
            worker.state.as_str().to_owned(),
            gpus(worker),
            worker.address.clone(),
            worker.last_heartbeat_at.map_or_else(
                || output::NONE.to_owned(),
                |at| format!("{} ago", output::age(at, now)),
            ),
            output::labels(&worker.labels),
        ]);
    }
    table
}

/// How many GPUs a worker has and their memory: `2 (160.0GiB)`, `1 (8.0GiB, simulated)`.
fn gpus(worker: &Worker) -> String {
    let gpus = &worker.status.gpus;
    if gpus.is_empty() {
        return output::NONE.to_owned();
    }
    let memory: u64 = gpus.iter().map(|gpu| gpu.memory_total).sum();
    let simulated = if gpus.iter().any(|gpu| gpu.simulated) {
        ", simulated"
    } else {
        ""
    };
    format!("{} ({}{simulated})", gpus.len(), output::gib(memory))
}
