//! `gantry pools list|show|create|update|delete|events`: a cluster's worker pools,
//! machines the leader creates and deletes through a provider (DigitalOcean, a command of
//! yours, or `gantry worker` processes on the server's machine) between `min` and `max`
//! as pending replicas need them. Admins make, change and delete pools; a cluster's
//! administrators list and show its pools.
//!
//! A pool is named by its cluster (name or id, as `gantry clusters` names one) and its own
//! name or id within that cluster ([`pick`]). Its credentials (DigitalOcean's API token,
//! or what an `exec` command gets as `GANTRY_POOL_CREDENTIALS`) are never an argument: an
//! argument stays in the shell's history and every user of the machine sees it in `ps`.
//! `--credentials-file` reads them from a file, or from standard input with `-`; the
//! server stores them sealed and never shows them again.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use gantry_client::Client;
use gantry_types::{
    Cluster, MachineState, PoolEvent, PoolMachine, PoolProvider, Timestamp, WorkerPool,
    WorkerPoolCreate, WorkerPoolUpdate, WorkerState,
};

use super::output::{self, fields, print_json, OutputFormat, Table};
use super::{clusters, connect, explain, Connection, Output};

#[derive(Debug, Args)]
pub struct PoolsArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(flatten)]
    output: Output,
    #[command(subcommand)]
    command: PoolsCommand,
}

#[derive(Debug, Subcommand)]
enum PoolsCommand {
    /// List the worker pools of every cluster you may see (or of one), with their
    /// machines ready of all.
    #[command(visible_alias = "ls")]
    List {
        /// Only this cluster's pools (its name or id).
        #[arg(long)]
        cluster: Option<String>,
    },
    /// Show a pool: its settings, its machines and its latest decisions.
    #[command(visible_alias = "get")]
    Show {
        /// The cluster's name or id.
        cluster: String,
        /// The pool's name or id.
        pool: String,
    },
    /// Add a worker pool to a cluster (admins).
    // Boxed: its many flags would make every client command as large.
    Create(Box<CreateArgs>),
    /// Change a pool's bounds, labels, idle time or credentials; what is not given stays
    /// as it is (admins).
    Update(UpdateArgs),
    /// Delete a pool: the leader deletes its machines at the provider, then the pool
    /// (admins).
    #[command(visible_alias = "rm")]
    Delete {
        /// The cluster's name or id.
        cluster: String,
        /// The pool's name or id.
        pool: String,
    },
    /// A pool's decisions with their reasons, newest first: machines asked for and why,
    /// created, registered, failed (with the provider's words), drained and deleted.
    Events {
        /// The cluster's name or id.
        cluster: String,
        /// The pool's name or id.
        pool: String,
    },
}

/// `--provider`: where a pool's machines come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ProviderArg {
    /// Droplets made through DigitalOcean's API: give --instance-type (the size slug),
    /// --image, --region and the API token with --credentials-file.
    Digitalocean,
    /// A program of yours in the servers' pool_commands_dir, run with create, find or
    /// delete: give --command.
    Exec,
    /// `gantry worker` processes with simulated GPUs on the server's own machine, for
    /// trying pools (at most 8 machines).
    Local,
}

impl From<ProviderArg> for PoolProvider {
    fn from(provider: ProviderArg) -> Self {
        match provider {
            ProviderArg::Digitalocean => PoolProvider::Digitalocean,
            ProviderArg::Exec => PoolProvider::Exec,
            ProviderArg::Local => PoolProvider::Local,
        }
    }
}

/// Where a pool's credentials are read from; never the credentials themselves.
#[derive(Debug, Args)]
struct CredentialsFlag {
    /// Read the pool's credentials (DigitalOcean's API token; for exec, what its program
    /// gets as GANTRY_POOL_CREDENTIALS) from this file, or from standard input with `-`.
    /// Never an argument: it would be kept in the shell's history and shown by ps.
    #[arg(long, value_name = "FILE")]
    credentials_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct CreateArgs {
    /// The cluster's name or id.
    cluster: String,
    /// The pool's name: lowercase letters, digits, `-`, `_` and `.`, at most 40
    /// characters; its machines are named <pool>-<n>.
    name: String,
    /// Where its machines come from.
    #[arg(long, value_enum)]
    provider: ProviderArg,
    /// What each machine has, COUNTxMEMORY, such as 1x80GiB or 8x80GiB: what the
    /// scheduler counts to decide whether a new machine would serve a pending replica.
    #[arg(long, value_name = "COUNTxMEMORY")]
    gpus: String,
    /// Each machine's system memory, such as 240GiB.
    #[arg(long, value_name = "SIZE")]
    memory: Option<String>,
    /// The provider's machine type (DigitalOcean's size slug, such as gpu-h100x1-80gb);
    /// handed to an exec program as it is.
    #[arg(long, default_value = "")]
    instance_type: String,
    /// The provider's image (a DigitalOcean image slug); handed to exec as it is.
    #[arg(long, default_value = "")]
    image: String,
    /// The provider's region or zone.
    #[arg(long, default_value = "")]
    region: String,
    /// A label every machine's worker carries, KEY=VALUE (repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// The fewest machines the pool keeps, busy or not.
    #[arg(long, default_value_t = 0)]
    min: u32,
    /// The most machines the pool makes (each costs money while it lives).
    #[arg(long, default_value_t = 1)]
    max: u32,
    /// How long a machine may host nothing before it is drained and deleted, down to
    /// --min (default 10m; at least 10s).
    #[arg(long, value_name = "DURATION")]
    scale_down_after: Option<String>,
    /// For exec: the command line, whose program is the name of an executable in the
    /// servers' pool_commands_dir (no path); create, find or delete is added as its last
    /// argument.
    #[arg(long)]
    command: Option<String>,
    /// For digitalocean: the API's base URL (default: DigitalOcean's own).
    #[arg(long, value_name = "URL")]
    api_url: Option<String>,
    #[command(flatten)]
    credentials: CredentialsFlag,
}

#[derive(Debug, Args)]
struct UpdateArgs {
    /// The cluster's name or id.
    cluster: String,
    /// The pool's name or id.
    pool: String,
    /// A new fewest machines.
    #[arg(long)]
    min: Option<u32>,
    /// A new most machines.
    #[arg(long)]
    max: Option<u32>,
    /// The labels of the machines' workers, KEY=VALUE (repeatable): they replace all the
    /// pool's labels; workers registered already keep theirs.
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// Remove all the pool's labels.
    #[arg(long, conflicts_with = "labels")]
    no_labels: bool,
    /// A new idle time before a machine is deleted, such as 30m.
    #[arg(long, value_name = "DURATION")]
    scale_down_after: Option<String>,
    #[command(flatten)]
    credentials: CredentialsFlag,
}

/// How many of a pool's latest events `show` prints.
const EVENTS_SHOWN: usize = 10;

pub async fn run(args: PoolsArgs) -> anyhow::Result<()> {
    let client = connect(&args.connection)?;
    let format = args.output.format;
    match args.command {
        PoolsCommand::List { cluster } => {
            let clusters = match cluster {
                Some(text) => vec![clusters::resolve(&client, &text).await?],
                None => client
                    .list_clusters()
                    .await
                    .map_err(explain)
                    .context("list clusters")?,
            };
            let mut listed = Vec::new();
            for cluster in clusters {
                let pools = client
                    .list_pools(cluster.id)
                    .await
                    .map_err(explain)
                    .with_context(|| {
                        format!("list the worker pools of cluster {}", cluster.name)
                    })?;
                listed.extend(pools.into_iter().map(|pool| (cluster.name.clone(), pool)));
            }
            match format {
                OutputFormat::Json => {
                    let pools: Vec<&WorkerPool> = listed.iter().map(|(_, pool)| pool).collect();
                    print_json(&pools)
                }
                OutputFormat::Table => {
                    print!("{}", table(&listed).render());
                    Ok(())
                }
            }
        }
        PoolsCommand::Show { cluster, pool } => {
            let (cluster, pool) = resolve(&client, &cluster, &pool).await?;
            match format {
                OutputFormat::Json => print_json(&pool),
                OutputFormat::Table => {
                    let events = client
                        .pool_events(cluster.id, pool.id)
                        .await
                        .map_err(explain)
                        .with_context(|| format!("read the events of worker pool {}", pool.name))?;
                    print!(
                        "{}",
                        describe_in_full(&cluster, &pool, &events, Timestamp::now())
                    );
                    Ok(())
                }
            }
        }
        PoolsCommand::Create(create) => {
            let cluster = clusters::resolve(&client, &create.cluster).await?;
            let request = create.request()?;
            let pool = client
                .create_pool(cluster.id, &request)
                .await
                .map_err(explain)
                .with_context(|| {
                    format!(
                        "create worker pool {} in cluster {}",
                        request.name, cluster.name
                    )
                })?;
            print_pool(format, &cluster, &pool)?;
            eprintln!(
                "the leader makes machines as pending replicas of cluster {} need them, \
                 between {} and {}; gantry pools show {} {} follows them",
                cluster.name, pool.min, pool.max, cluster.name, pool.name
            );
            Ok(())
        }
        PoolsCommand::Update(update) => {
            let change = update.change()?;
            let (cluster, pool) = resolve(&client, &update.cluster, &update.pool).await?;
            let pool = client
                .update_pool(cluster.id, pool.id, &change)
                .await
                .map_err(explain)
                .with_context(|| format!("change worker pool {}", pool.name))?;
            print_pool(format, &cluster, &pool)
        }
        PoolsCommand::Delete { cluster, pool } => {
            let (cluster, pool) = resolve(&client, &cluster, &pool).await?;
            let pool = client
                .delete_pool(cluster.id, pool.id)
                .await
                .map_err(explain)
                .with_context(|| format!("delete worker pool {}", pool.name))?;
            match format {
                OutputFormat::Json => print_json(&pool),
                OutputFormat::Table => {
                    println!("{}", deleting_text(&cluster, &pool));
                    Ok(())
                }
            }
        }
        PoolsCommand::Events { cluster, pool } => {
            let (cluster, pool) = resolve(&client, &cluster, &pool).await?;
            let events = client
                .pool_events(cluster.id, pool.id)
                .await
                .map_err(explain)
                .with_context(|| format!("read the events of worker pool {}", pool.name))?;
            output::print_list(format, &events, |events| {
                events_table(events, Timestamp::now())
            })
        }
    }
}

impl CreateArgs {
    /// The request the flags make, with the credentials read from where they say.
    fn request(self) -> anyhow::Result<WorkerPoolCreate> {
        Ok(WorkerPoolCreate {
            credentials: self.credentials.read()?,
            name: self.name,
            provider: self.provider.into(),
            instance_type: self.instance_type,
            image: self.image,
            region: self.region,
            gpus: self.gpus,
            memory: self.memory,
            labels: label_map(self.labels)?,
            min: self.min,
            max: self.max,
            scale_down_after: self.scale_down_after,
            command: self.command,
            api_url: self.api_url,
        })
    }
}

impl UpdateArgs {
    /// The change the flags ask for; an error when they ask for none.
    fn change(&self) -> anyhow::Result<WorkerPoolUpdate> {
        let labels = if self.no_labels {
            Some(BTreeMap::new())
        } else if self.labels.is_empty() {
            None
        } else {
            Some(label_map(self.labels.clone())?)
        };
        let update = WorkerPoolUpdate {
            min: self.min,
            max: self.max,
            labels,
            scale_down_after: self.scale_down_after.clone(),
            credentials: self.credentials.read()?,
        };
        let WorkerPoolUpdate {
            min,
            max,
            labels,
            scale_down_after,
            credentials,
        } = &update;
        if min.is_none()
            && max.is_none()
            && labels.is_none()
            && scale_down_after.is_none()
            && credentials.is_none()
        {
            anyhow::bail!(
                "nothing to change: give --min, --max, --label, --no-labels, \
                 --scale-down-after or --credentials-file"
            );
        }
        Ok(update)
    }
}

impl CredentialsFlag {
    /// The credentials from the file named (standard input for `-`), or none when no
    /// file is named.
    fn read(&self) -> anyhow::Result<Option<String>> {
        match &self.credentials_file {
            None => Ok(None),
            Some(path) => read_credentials(path, std::io::stdin().lock()).map(Some),
        }
    }
}

/// The credentials in `path` (in `stdin` for `-`), without the space around them; an
/// error when there are none.
fn read_credentials(path: &Path, mut stdin: impl Read) -> anyhow::Result<String> {
    let (text, from) = if path == Path::new("-") {
        let mut text = String::new();
        stdin
            .read_to_string(&mut text)
            .context("--credentials-file -: read the credentials from standard input")?;
        (text, "standard input".to_owned())
    } else {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--credentials-file: read {}", path.display()))?;
        (text, path.display().to_string())
    };
    let credentials = text.trim();
    if credentials.is_empty() {
        anyhow::bail!("--credentials-file: {from} holds no credentials");
    }
    Ok(credentials.to_owned())
}

/// A `--label KEY=VALUE`.
fn parse_label(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => {
            Ok((key.trim().to_owned(), value.trim().to_owned()))
        }
        _ => Err("give the label as KEY=VALUE".to_owned()),
    }
}

/// The `--label`s as a map; a key given twice is an error.
fn label_map(labels: Vec<(String, String)>) -> anyhow::Result<BTreeMap<String, String>> {
    let mut map = BTreeMap::new();
    for (key, value) in labels {
        if map.insert(key.clone(), value).is_some() {
            anyhow::bail!("--label {key} is given twice");
        }
    }
    Ok(map)
}

/// The cluster and the pool a command names: each by its name, else by its id.
async fn resolve(
    client: &Client,
    cluster: &str,
    pool: &str,
) -> anyhow::Result<(Cluster, WorkerPool)> {
    let cluster = clusters::resolve(client, cluster).await?;
    let pools = client
        .list_pools(cluster.id)
        .await
        .map_err(explain)
        .with_context(|| format!("list the worker pools of cluster {}", cluster.name))?;
    let pool = pick(pools, pool, &cluster.name)?;
    Ok((cluster, pool))
}

/// The pool named `text`, or the one whose id it is, among `pools` (of cluster
/// `cluster`). A name may be all digits, so the name is tried first.
fn pick(pools: Vec<WorkerPool>, text: &str, cluster: &str) -> anyhow::Result<WorkerPool> {
    let id = text.parse::<i64>().ok();
    let mut by_id = None;
    for pool in pools {
        if pool.name == text {
            return Ok(pool);
        }
        if Some(pool.id) == id {
            by_id = Some(pool);
        }
    }
    by_id.with_context(|| {
        format!(
            "cluster {cluster} has no worker pool named {text:?} or with that id (gantry \
             pools ls --cluster {cluster} lists them)"
        )
    })
}

fn print_pool(format: OutputFormat, cluster: &Cluster, pool: &WorkerPool) -> anyhow::Result<()> {
    match format {
        OutputFormat::Json => print_json(pool),
        OutputFormat::Table => {
            print!("{}", describe(cluster, pool));
            Ok(())
        }
    }
}

/// Whether a machine's worker is registered and ready to take instances.
fn is_ready(machine: &PoolMachine) -> bool {
    machine.state == MachineState::Registered && machine.worker_state == Some(WorkerState::Ready)
}

/// Ready machines of all: `1/2`.
fn machines_text(pool: &WorkerPool) -> String {
    let ready = pool.machines.iter().filter(|m| is_ready(m)).count();
    format!("{ready}/{}", pool.machines.len())
}

/// What `delete` says: the pool goes once its machines are deleted.
fn deleting_text(cluster: &Cluster, pool: &WorkerPool) -> String {
    match pool.machines.len() {
        0 => format!(
            "worker pool {} of cluster {} deleted: it has no machines, so it goes at the \
             leader's next pass",
            pool.name, cluster.name
        ),
        count => format!(
            "worker pool {} of cluster {} deleted: its {count} machine(s) are being deleted \
             at the provider, then the pool goes (gantry pools show {} {} follows them)",
            pool.name, cluster.name, cluster.name, pool.name
        ),
    }
}

/// `pools ls`: each pool with the name of its cluster.
fn table(pools: &[(String, WorkerPool)]) -> Table {
    let mut table = Table::new(&[
        "NAME", "CLUSTER", "PROVIDER", "GPUS", "MIN", "MAX", "MACHINES",
    ]);
    for (cluster, pool) in pools {
        table.row(vec![
            if pool.deleting {
                format!("{} (deleting)", pool.name)
            } else {
                pool.name.clone()
            },
            cluster.clone(),
            pool.provider.as_str().to_owned(),
            pool.gpus.clone(),
            pool.min.to_string(),
            pool.max.to_string(),
            machines_text(pool),
        ]);
    }
    table
}

/// A pool's settings, one per line; those its provider does not use are left out.
fn describe(cluster: &Cluster, pool: &WorkerPool) -> String {
    let not_empty = |text: &str| output::or_none(Some(text).filter(|t| !t.is_empty()));
    let mut lines = vec![
        ("ID", pool.id.to_string()),
        ("NAME", pool.name.clone()),
        ("CLUSTER", cluster.name.clone()),
        ("PROVIDER", pool.provider.as_str().to_owned()),
    ];
    if pool.provider != PoolProvider::Local {
        lines.extend([
            ("INSTANCE TYPE", not_empty(&pool.instance_type)),
            ("IMAGE", not_empty(&pool.image)),
            ("REGION", not_empty(&pool.region)),
        ]);
    }
    if let Some(command) = &pool.command {
        lines.push(("COMMAND", command.clone()));
    }
    if let Some(url) = &pool.api_url {
        lines.push(("API URL", url.clone()));
    }
    lines.extend([
        ("GPUS", pool.gpus.clone()),
        ("MEMORY", output::or_none(pool.memory.as_deref())),
        ("LABELS", output::labels(&pool.labels)),
        ("MIN", pool.min.to_string()),
        ("MAX", pool.max.to_string()),
        ("SCALE DOWN AFTER", pool.scale_down_after.clone()),
        (
            "CREDENTIALS",
            if pool.has_credentials {
                "set"
            } else {
                output::NONE
            }
            .to_owned(),
        ),
        ("MACHINES", format!("{} ready", machines_text(pool))),
    ]);
    if pool.deleting {
        lines.push((
            "DELETING",
            "yes: its machines are being deleted, then the pool goes".to_owned(),
        ));
    }
    lines.extend([
        ("CREATED", pool.created_at.to_string()),
        ("UPDATED", pool.updated_at.to_string()),
    ]);
    fields(&lines)
}

/// `pools show`: the settings, the machines, and the latest events.
fn describe_in_full(
    cluster: &Cluster,
    pool: &WorkerPool,
    events: &[PoolEvent],
    now: Timestamp,
) -> String {
    let mut text = describe(cluster, pool);
    text.push('\n');
    if pool.machines.is_empty() {
        text.push_str("No machines.\n");
    } else {
        text.push_str(&machines_table(&pool.machines, now).render());
    }
    text.push('\n');
    if events.is_empty() {
        text.push_str("No events yet.\n");
    } else {
        let latest = &events[..events.len().min(EVENTS_SHOWN)];
        text.push_str(&events_table(latest, now).render());
        if events.len() > latest.len() {
            text.push_str(&format!(
                "(the latest {EVENTS_SHOWN} of {}: gantry pools events {} {} lists them all)\n",
                events.len(),
                cluster.name,
                pool.name
            ));
        }
    }
    text
}

/// A pool's machines: their state, their worker's, how long they have hosted nothing,
/// and what the provider or the leader last said of them.
fn machines_table(machines: &[PoolMachine], now: Timestamp) -> Table {
    let mut table = Table::new(&[
        "MACHINE", "STATE", "WORKER", "IDLE", "ADDRESS", "AGE", "MESSAGE",
    ]);
    for machine in machines {
        table.row(vec![
            machine.name.clone(),
            machine.state.as_str().to_owned(),
            output::or_none(machine.worker_state.map(WorkerState::as_str)),
            output::or_none(machine.idle_since.map(|since| output::age(since, now))),
            output::or_none(machine.address.as_deref()),
            output::age(machine.created_at, now),
            output::or_none(Some(&machine.state_message).filter(|m| !m.is_empty())),
        ]);
    }
    table
}

fn events_table(events: &[PoolEvent], now: Timestamp) -> Table {
    let mut table = Table::new(&["AGE", "EVENT", "MESSAGE"]);
    for event in events {
        table.row(vec![
            output::age(event.at, now),
            event.kind.clone(),
            event.message.clone(),
        ]);
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_types::{ClusterCounts, ClusterProvider, ClusterState};

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_millis(seconds * 1000)
    }

    fn cluster() -> Cluster {
        Cluster {
            id: 2,
            name: "east".into(),
            description: String::new(),
            provider: ClusterProvider::Custom,
            is_default: false,
            state: ClusterState::Ready,
            state_message: String::new(),
            counts: ClusterCounts::default(),
            created_at: at(0),
            updated_at: at(0),
        }
    }

    fn machine(name: &str, state: MachineState, worker: Option<WorkerState>) -> PoolMachine {
        PoolMachine {
            id: 1,
            pool_id: 7,
            name: name.into(),
            state,
            state_message: String::new(),
            external_id: None,
            address: None,
            worker_id: None,
            worker_state: worker,
            idle_since: None,
            created_at: at(0),
            updated_at: at(0),
        }
    }

    fn pool(id: i64, name: &str) -> WorkerPool {
        WorkerPool {
            id,
            cluster_id: 2,
            name: name.into(),
            provider: PoolProvider::Exec,
            instance_type: "gpu-80g".into(),
            image: String::new(),
            region: "lab-1".into(),
            gpus: "1x80GiB".into(),
            memory: None,
            labels: BTreeMap::new(),
            min: 0,
            max: 3,
            scale_down_after: "10m".into(),
            command: Some("cloud.sh --region lab-1".into()),
            api_url: None,
            has_credentials: true,
            deleting: false,
            machines: Vec::new(),
            created_at: at(0),
            updated_at: at(0),
        }
    }

    #[test]
    fn a_pool_is_named_by_its_name_before_its_id() {
        let pools = || vec![pool(1, "h100"), pool(2, "a100"), pool(3, "1")];
        assert_eq!(pick(pools(), "a100", "east").unwrap().id, 2);
        assert_eq!(pick(pools(), "2", "east").unwrap().name, "a100");
        // "1" is the name of pool 3 before it is the id of pool 1.
        assert_eq!(pick(pools(), "1", "east").unwrap().id, 3);
        let error = pick(pools(), "l4", "east").unwrap_err().to_string();
        assert!(
            error.contains("cluster east has no worker pool named \"l4\""),
            "{error}"
        );
    }

    #[test]
    fn the_list_counts_ready_machines_of_all() {
        let mut burst = pool(1, "burst");
        burst.machines = vec![
            machine(
                "burst-1",
                MachineState::Registered,
                Some(WorkerState::Ready),
            ),
            machine(
                "burst-2",
                MachineState::Registered,
                Some(WorkerState::NotReady),
            ),
            machine("burst-3", MachineState::Provisioning, None),
        ];
        let mut going = pool(2, "old");
        going.deleting = true;
        let text = table(&[("east".into(), burst), ("east".into(), going)]).render();
        let lines: Vec<Vec<&str>> = text
            .lines()
            .map(|line| line.split_whitespace().collect())
            .collect();
        assert_eq!(
            lines[0],
            ["NAME", "CLUSTER", "PROVIDER", "GPUS", "MIN", "MAX", "MACHINES"]
        );
        assert_eq!(
            lines[1],
            ["burst", "east", "exec", "1x80GiB", "0", "3", "1/3"]
        );
        assert_eq!(
            lines[2],
            [
                "old",
                "(deleting)",
                "east",
                "exec",
                "1x80GiB",
                "0",
                "3",
                "0/0"
            ]
        );
    }

    #[test]
    fn show_has_the_settings_the_machines_with_their_messages_and_the_latest_events() {
        let mut burst = pool(1, "burst");
        let mut failing = machine("burst-1", MachineState::Provisioning, None);
        failing.state_message = "creating machine failed (1 time(s)): out of capacity".into();
        burst.machines = vec![failing];
        let events: Vec<PoolEvent> = (0..12)
            .map(|n| PoolEvent {
                id: 12 - n,
                pool_id: 1,
                at: at(60 - n),
                kind: "failed".into(),
                message: format!("creating machine burst-1 failed: try {}", 12 - n),
            })
            .collect();
        let text = describe_in_full(&cluster(), &burst, &events, at(120));
        assert!(
            text.contains("COMMAND           cloud.sh --region lab-1"),
            "{text}"
        );
        assert!(text.contains("CREDENTIALS       set"), "{text}");
        assert!(text.contains("MACHINES          0/1 ready"), "{text}");
        // Settings an exec pool does not use are left out; an empty one shows a dash.
        assert!(!text.contains("API URL"), "{text}");
        assert!(text.contains("IMAGE             -"), "{text}");
        let machine = text.lines().find(|l| l.starts_with("burst-1")).unwrap();
        assert!(
            machine.ends_with("creating machine failed (1 time(s)): out of capacity"),
            "{text}"
        );
        assert!(
            text.contains("failed  creating machine burst-1 failed: try 12"),
            "{text}"
        );
        assert!(
            !text.contains("try 2\n"),
            "only the latest are shown: {text}"
        );
        assert!(
            text.contains("(the latest 10 of 12: gantry pools events east burst lists them all)"),
            "{text}"
        );
    }

    #[test]
    fn labels_are_key_equals_value_and_credentials_come_from_a_file_or_stdin() {
        assert_eq!(
            parse_label("tier=burst").unwrap(),
            ("tier".to_owned(), "burst".to_owned())
        );
        assert!(parse_label("tier").is_err());
        assert!(parse_label("=x").is_err());
        let twice = label_map(vec![("a".into(), "1".into()), ("a".into(), "2".into())]);
        assert!(twice.unwrap_err().to_string().contains("--label a"));

        assert_eq!(
            read_credentials(Path::new("-"), &b"dop_v1_x\n"[..]).unwrap(),
            "dop_v1_x"
        );
        let error = read_credentials(Path::new("-"), &b" \n"[..]).unwrap_err();
        assert!(error
            .to_string()
            .contains("standard input holds no credentials"));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "dop_v1_y\n").unwrap();
        assert_eq!(read_credentials(&file, &b""[..]).unwrap(), "dop_v1_y");
        let error = read_credentials(&dir.path().join("missing"), &b""[..]).unwrap_err();
        assert!(error.to_string().contains("--credentials-file"), "{error}");
    }

    #[test]
    fn an_update_without_a_change_names_the_flags() {
        let update = UpdateArgs {
            cluster: "east".into(),
            pool: "burst".into(),
            min: None,
            max: None,
            labels: Vec::new(),
            no_labels: false,
            scale_down_after: None,
            credentials: CredentialsFlag {
                credentials_file: None,
            },
        };
        let error = update.change().unwrap_err().to_string();
        assert!(error.contains("nothing to change"), "{error}");
        let update = UpdateArgs {
            no_labels: true,
            ..update
        };
        assert_eq!(update.change().unwrap().labels, Some(BTreeMap::new()));
    }
}
