//! `gantry clusters list|show|create|update|delete|join-command`: the clusters, sets of
//! workers with a registration token each, into which models are deployed (admins; a
//! cluster's administrators list and show theirs).
//!
//! A cluster is named on the command line by its name or its id ([`resolve`]); the
//! models and workers commands use the same to take `--cluster`, and [`names`] to show
//! a CLUSTER column.

use std::collections::HashMap;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use gantry_client::Client;
use gantry_types::{Cluster, ClusterCreate, ClusterProvider, ClusterUpdate, Timestamp};

use super::output::{self, fields, print_json, OutputFormat, Table};
use super::{connect, explain, Connection, Output};

#[derive(Debug, Args)]
pub struct ClustersArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(flatten)]
    output: Output,
    #[command(subcommand)]
    command: ClustersCommand,
}

#[derive(Debug, Subcommand)]
enum ClustersCommand {
    /// List the clusters you may see, with their state, workers, GPUs and models.
    #[command(visible_alias = "ls")]
    List,
    /// Show a cluster.
    #[command(visible_alias = "get")]
    Show {
        /// The cluster's name or id.
        cluster: String,
    },
    /// Add a cluster with a registration token of its own (admins).
    Create(CreateArgs),
    /// Rename a cluster or change its description or provider; what is not given stays
    /// as it is (admins).
    Update(UpdateArgs),
    /// Delete a cluster that holds no worker and no model; never the default one
    /// (admins).
    #[command(visible_alias = "rm")]
    Delete {
        /// The cluster's name or id.
        cluster: String,
    },
    /// Print the `gantry worker` command that joins a machine to a cluster, or with
    /// --manifests the Kubernetes manifests that join a cluster's GPU nodes (admins: it
    /// holds the registration token).
    JoinCommand(JoinArgs),
}

/// `--provider`: where a cluster's machines come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ProviderArg {
    /// Machines you bring: each joins with the cluster's join command.
    Custom,
    /// The GPU nodes of a Kubernetes cluster, joined by a worker DaemonSet.
    Kubernetes,
}

impl From<ProviderArg> for ClusterProvider {
    fn from(provider: ProviderArg) -> Self {
        match provider {
            ProviderArg::Custom => ClusterProvider::Custom,
            ProviderArg::Kubernetes => ClusterProvider::Kubernetes,
        }
    }
}

#[derive(Debug, Args)]
struct CreateArgs {
    /// The cluster's name: lowercase letters, digits, `-`, `_` and `.`.
    name: String,
    /// What the cluster is, for people.
    #[arg(long, default_value = "")]
    description: String,
    /// Where its machines come from.
    #[arg(long, value_enum, default_value = "custom")]
    provider: ProviderArg,
}

#[derive(Debug, Args)]
struct UpdateArgs {
    /// The cluster's name or id.
    cluster: String,
    /// A new name.
    #[arg(long)]
    name: Option<String>,
    /// A new description.
    #[arg(long)]
    description: Option<String>,
    /// A new provider.
    #[arg(long, value_enum)]
    provider: Option<ProviderArg>,
}

#[derive(Debug, Args)]
struct JoinArgs {
    /// The cluster's name or id.
    cluster: String,
    /// Replace the registration token first: machines join with the new one from now
    /// on; workers already registered keep working.
    #[arg(long)]
    rotate: bool,
    /// The image the Kubernetes DaemonSet runs (default: gantry:<the server's version>).
    #[arg(long, value_name = "IMAGE")]
    image: Option<String>,
    /// Print the Kubernetes manifests (a namespace, the token as a Secret, a worker
    /// DaemonSet on the GPU nodes) instead of the command; for `kubernetes` clusters.
    #[arg(long)]
    manifests: bool,
}

pub async fn run(args: ClustersArgs) -> anyhow::Result<()> {
    let client = connect(&args.connection)?;
    let format = args.output.format;
    match args.command {
        ClustersCommand::List => {
            let clusters = client
                .list_clusters()
                .await
                .map_err(explain)
                .context("list clusters")?;
            let now = Timestamp::now();
            output::print_list(format, &clusters, |clusters| table(clusters, now))
        }
        ClustersCommand::Show { cluster } => {
            let cluster = resolve(&client, &cluster).await?;
            print_cluster(format, &cluster)
        }
        ClustersCommand::Create(create) => {
            let request = ClusterCreate {
                name: create.name,
                description: create.description,
                provider: create.provider.into(),
            };
            let cluster = client
                .create_cluster(&request)
                .await
                .map_err(explain)
                .with_context(|| format!("create cluster {}", request.name))?;
            print_cluster(format, &cluster)?;
            eprintln!(
                "to join a machine to it, run there the command that gantry clusters \
                 join-command {} prints",
                cluster.name
            );
            Ok(())
        }
        ClustersCommand::Update(update) => {
            let change = update.change()?;
            let cluster = resolve(&client, &update.cluster).await?;
            let cluster = client
                .update_cluster(cluster.id, &change)
                .await
                .map_err(explain)
                .with_context(|| format!("change cluster {}", cluster.name))?;
            print_cluster(format, &cluster)
        }
        ClustersCommand::Delete { cluster } => {
            let cluster = resolve(&client, &cluster).await?;
            client
                .delete_cluster(cluster.id)
                .await
                .map_err(explain)
                .with_context(|| format!("delete cluster {}", cluster.name))?;
            println!("cluster {} deleted", cluster.name);
            Ok(())
        }
        ClustersCommand::JoinCommand(join) => {
            let cluster = resolve(&client, &join.cluster).await?;
            if join.manifests && cluster.provider != ClusterProvider::Kubernetes {
                anyhow::bail!(
                    "cluster {} has no Kubernetes manifests: its provider is {} (gantry \
                     clusters update {} --provider kubernetes changes it)",
                    cluster.name,
                    cluster.provider.as_str(),
                    cluster.name
                );
            }
            let image = join.image.as_deref();
            let registration = if join.rotate {
                let rotated = client
                    .rotate_cluster_token(cluster.id, image)
                    .await
                    .map_err(explain)
                    .with_context(|| {
                        format!("rotate the registration token of cluster {}", cluster.name)
                    })?;
                eprintln!(
                    "rotated the registration token of cluster {}: machines join with the \
                     new one from now on; registered workers keep working",
                    cluster.name
                );
                rotated
            } else {
                client
                    .cluster_registration(cluster.id, image)
                    .await
                    .map_err(explain)
                    .with_context(|| {
                        format!("read the registration token of cluster {}", cluster.name)
                    })?
            };
            match format {
                OutputFormat::Json => print_json(&registration),
                OutputFormat::Table if join.manifests => {
                    let manifests = registration.kubernetes_manifests.with_context(|| {
                        format!("the server sent no manifests for cluster {}", cluster.name)
                    })?;
                    print!("{manifests}");
                    if !manifests.ends_with('\n') {
                        println!();
                    }
                    Ok(())
                }
                OutputFormat::Table => {
                    println!("{}", registration.command);
                    Ok(())
                }
            }
        }
    }
}

impl UpdateArgs {
    /// The change the flags ask for; an error when they ask for none.
    fn change(&self) -> anyhow::Result<ClusterUpdate> {
        if self.name.is_none() && self.description.is_none() && self.provider.is_none() {
            anyhow::bail!("nothing to change: give --name, --description or --provider");
        }
        Ok(ClusterUpdate {
            name: self.name.clone(),
            description: self.description.clone(),
            provider: self.provider.map(Into::into),
        })
    }
}

/// The cluster a command names: by its name, else by its id. (A name may be all
/// digits, so the name is tried first.)
pub async fn resolve(client: &Client, text: &str) -> anyhow::Result<Cluster> {
    let clusters = client
        .list_clusters()
        .await
        .map_err(explain)
        .context("list clusters")?;
    pick(clusters, text)
}

/// The cluster named `text`, or the one whose id it is, among `clusters`.
fn pick(clusters: Vec<Cluster>, text: &str) -> anyhow::Result<Cluster> {
    let id = text.parse::<i64>().ok();
    let mut by_id = None;
    for cluster in clusters {
        if cluster.name == text {
            return Ok(cluster);
        }
        if Some(cluster.id) == id {
            by_id = Some(cluster);
        }
    }
    by_id.with_context(|| {
        format!("no cluster named {text:?} or with that id (gantry clusters ls lists the ones you may see)")
    })
}

/// The names of the clusters the caller may see, by id, for a CLUSTER column. Empty when
/// the caller may see none (a user who administers no cluster): the column then shows
/// ids.
pub async fn names(client: &Client) -> anyhow::Result<HashMap<i64, String>> {
    let clusters = client
        .list_clusters()
        .await
        .map_err(explain)
        .context("list clusters")?;
    Ok(clusters.into_iter().map(|c| (c.id, c.name)).collect())
}

/// A cluster's name for a table, or its id when the caller may not see its name.
pub fn name_of(names: &HashMap<i64, String>, id: i64) -> String {
    names.get(&id).cloned().unwrap_or_else(|| id.to_string())
}

fn print_cluster(format: OutputFormat, cluster: &Cluster) -> anyhow::Result<()> {
    match format {
        OutputFormat::Json => print_json(cluster),
        OutputFormat::Table => {
            print!("{}", describe(cluster));
            Ok(())
        }
    }
}

/// Ready workers of all: `1/2`.
fn workers_text(cluster: &Cluster) -> String {
    format!(
        "{}/{}",
        cluster.counts.ready_workers, cluster.counts.workers
    )
}

fn table(clusters: &[Cluster], now: Timestamp) -> Table {
    let mut table = Table::new(&[
        "ID", "NAME", "PROVIDER", "STATE", "WORKERS", "GPUS", "MODELS", "DEFAULT", "AGE",
    ]);
    for cluster in clusters {
        table.row(vec![
            cluster.id.to_string(),
            cluster.name.clone(),
            cluster.provider.as_str().to_owned(),
            cluster.state.as_str().to_owned(),
            workers_text(cluster),
            cluster.counts.gpus.to_string(),
            cluster.counts.models.to_string(),
            if cluster.is_default {
                "yes"
            } else {
                output::NONE
            }
            .to_owned(),
            output::age(cluster.created_at, now),
        ]);
    }
    table
}

/// A cluster's fields, one per line.
fn describe(cluster: &Cluster) -> String {
    fields(&[
        ("ID", cluster.id.to_string()),
        ("NAME", cluster.name.clone()),
        (
            "DESCRIPTION",
            output::or_none(Some(&cluster.description).filter(|d| !d.is_empty())),
        ),
        ("PROVIDER", cluster.provider.as_str().to_owned()),
        (
            "DEFAULT",
            if cluster.is_default { "yes" } else { "no" }.to_owned(),
        ),
        ("STATE", cluster.state.as_str().to_owned()),
        ("MESSAGE", cluster.state_message.clone()),
        ("WORKERS", format!("{} ready", workers_text(cluster))),
        ("GPUS", cluster.counts.gpus.to_string()),
        ("MODELS", cluster.counts.models.to_string()),
        ("CREATED", cluster.created_at.to_string()),
        ("UPDATED", cluster.updated_at.to_string()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_types::{ClusterCounts, ClusterState};

    fn cluster(id: i64, name: &str) -> Cluster {
        Cluster {
            id,
            name: name.into(),
            description: String::new(),
            provider: ClusterProvider::Custom,
            is_default: id == 1,
            state: ClusterState::Pending,
            state_message: String::new(),
            counts: ClusterCounts::default(),
            created_at: Timestamp::from_millis(0),
            updated_at: Timestamp::from_millis(0),
        }
    }

    #[test]
    fn a_cluster_is_named_by_its_name_before_its_id() {
        let clusters = || vec![cluster(1, "default"), cluster(2, "east"), cluster(3, "2")];
        assert_eq!(pick(clusters(), "east").unwrap().id, 2);
        assert_eq!(pick(clusters(), "1").unwrap().name, "default");
        // "2" is the name of cluster 3 before it is the id of cluster 2.
        assert_eq!(pick(clusters(), "2").unwrap().id, 3);
        let error = pick(clusters(), "west").unwrap_err().to_string();
        assert!(error.contains("no cluster named \"west\""), "{error}");
    }

    #[test]
    fn an_update_without_a_change_names_the_flags() {
        let update = UpdateArgs {
            cluster: "east".into(),
            name: None,
            description: None,
            provider: None,
        };
        let error = update.change().unwrap_err().to_string();
        assert!(error.contains("nothing to change"), "{error}");
        let update = UpdateArgs {
            provider: Some(ProviderArg::Kubernetes),
            ..update
        };
        assert_eq!(
            update.change().unwrap().provider,
            Some(ClusterProvider::Kubernetes)
        );
    }

    #[test]
    fn the_list_shows_ready_of_all_workers_and_marks_the_default() {
        let mut east = cluster(2, "east");
        east.counts = ClusterCounts {
            workers: 2,
            ready_workers: 1,
            gpus: 4,
            models: 3,
            ..ClusterCounts::default()
        };
        east.state = ClusterState::Ready;
        let text = table(
            &[cluster(1, "default"), east],
            Timestamp::from_millis(60_000),
        )
        .render();
        let lines: Vec<Vec<&str>> = text
            .lines()
            .map(|line| line.split_whitespace().collect())
            .collect();
        assert_eq!(
            lines[1],
            ["1", "default", "custom", "pending", "0/0", "0", "0", "yes", "1m"]
        );
        assert_eq!(
            lines[2],
            ["2", "east", "custom", "ready", "1/2", "4", "3", "-", "1m"]
        );
    }
}
