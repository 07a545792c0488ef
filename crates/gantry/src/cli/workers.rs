//! `gantry workers ls [--cluster NAME|ID]`.

use std::collections::HashMap;

use clap::{Args, Subcommand};
use gantry_types::{Timestamp, Worker, WorkerQuery};

use super::output::{self, OutputFormat, Table};
use super::{clusters, connect, every_page, Connection, Output, PAGE_SIZE};

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
    /// List the workers: their cluster, state, GPUs and last heartbeat.
    Ls {
        /// Only the workers of this cluster (its name or id).
        #[arg(long, value_name = "CLUSTER")]
        cluster: Option<String>,
    },
}

pub async fn run(args: WorkersArgs) -> anyhow::Result<()> {
    let client = connect(&args.connection)?;
    match args.command {
        WorkersCommand::Ls { cluster } => {
            let cluster_id = match cluster {
                Some(text) => Some(clusters::resolve(&client, &text).await?.id),
                None => None,
            };
            let workers = every_page(|page| {
                let query = WorkerQuery {
                    cluster_id,
                    page: Some(page),
                    per_page: Some(PAGE_SIZE),
                    ..WorkerQuery::default()
                };
                let client = &client;
                async move { client.list_workers(&query).await }
            })
            .await?;
            let names = match args.output.format {
                OutputFormat::Json => HashMap::new(),
                OutputFormat::Table => clusters::names(&client).await?,
            };
            let now = Timestamp::now();
            output::print_list(args.output.format, &workers, |workers| {
                table(workers, &names, now)
            })
        }
    }
}

/// Workers as a table; `cluster_names` names their clusters (by id).
fn table(workers: &[Worker], cluster_names: &HashMap<i64, String>, now: Timestamp) -> Table {
    let mut table = Table::new(&[
        "ID",
        "NAME",
        "CLUSTER",
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
            clusters::name_of(cluster_names, worker.cluster_id),
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
