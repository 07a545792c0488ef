//! `gantry instances ls [--model NAME]` and `gantry instances logs ID [-f] [--tail N]`.

use std::io::Write;

use anyhow::Context;
use clap::{Args, Subcommand};
use gantry_types::{LogQuery, ModelInstance};

use super::output::{self, Table};
use super::{connect, explain, models, Connection, Output};

#[derive(Debug, Args)]
pub struct InstancesArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(flatten)]
    output: Output,
    #[command(subcommand)]
    command: InstancesCommand,
}

#[derive(Debug, Subcommand)]
enum InstancesCommand {
    /// List model instances: where each runs and in which state.
    Ls {
        /// Only the instances of this model.
        #[arg(long, value_name = "NAME")]
        model: Option<String>,
    },
    /// Print an instance's backend output.
    Logs {
        /// The instance's id (gantry instances ls shows it).
        id: i64,
        /// Keep printing new lines as the backend writes them, until Ctrl-C.
        #[arg(short = 'f', long)]
        follow: bool,
        /// Start with the last N lines (the server's default: 100).
        #[arg(long, value_name = "N")]
        tail: Option<u32>,
    },
}

pub async fn run(args: InstancesArgs) -> anyhow::Result<()> {
    let client = connect(&args.connection)?;
    match args.command {
        InstancesCommand::Ls { model } => {
            let model_id = match model {
                Some(name) => Some(models::by_name(&client, &name).await?.id),
                None => None,
            };
            let instances = models::instances_of(&client, model_id).await?;
            output::print_list(args.output.format, &instances, table)
        }
        InstancesCommand::Logs { id, follow, tail } => {
            let query = LogQuery {
                tail,
                follow: follow.then_some(true),
                timeout_seconds: None,
            };
            let mut response = client
                .instance_logs(id, &query)
                .await
                .map_err(explain)
                .with_context(|| format!("read the logs of instance {id}"))?;
            let mut stdout = std::io::stdout();
            loop {
                let chunk = tokio::select! {
                    chunk = response.chunk() => chunk,
                    _ = tokio::signal::ctrl_c() => return Ok(()),
                };
                match chunk.with_context(|| format!("read the logs of instance {id}"))? {
                    Some(bytes) => {
                        // A closed pipe (`| head`) ends the command quietly.
                        if stdout
                            .write_all(&bytes)
                            .and_then(|()| stdout.flush())
                            .is_err()
                        {
                            return Ok(());
                        }
                    }
                    None => return Ok(()),
                }
            }
        }
    }
}

/// Instances as a table.
pub fn table(instances: &[ModelInstance]) -> Table {
    let mut table = Table::new(&[
        "ID", "NAME", "STATE", "WORKER", "GPUS", "ADDRESS", "RESTARTS", "MESSAGE",
    ]);
    for instance in instances {
        table.row(vec![
            instance.id.to_string(),
            instance.name.clone(),
            instance.state.as_str().to_owned(),
            output::or_none(instance.worker_name.as_ref()),
            output::list(&instance.gpu_indexes),
            output::or_none(instance.address.as_ref()),
            instance.restart_count.to_string(),
            first_line(&instance.state_message),
        ]);
    }
    table
}

/// The first line of a state message, shortened to fit a table.
fn first_line(message: &str) -> String {
    const MOST: usize = 60;
    let line = message.lines().next().unwrap_or_default().trim();
    if line.chars().count() > MOST {
        let short: String = line.chars().take(MOST - 1).collect();
        format!("{short}…")
    } else {
        line.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_message_shows_its_first_line_shortened() {
        assert_eq!(first_line("no fit\nworker w1: too small"), "no fit");
        let long = "x".repeat(100);
        let shown = first_line(&long);
        assert_eq!(shown.chars().count(), 60);
        assert!(shown.ends_with('…'));
        assert_eq!(first_line(""), "");
    }
}
