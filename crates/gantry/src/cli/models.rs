//! `gantry models ls|get|create|scale|rm`. Models are named on the command line; the
//! name is turned into the model's id with the list's `name` filter. A model is deployed
//! into a cluster (`create --cluster`, the default cluster otherwise), which `ls` and `get`
//! show.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use gantry_client::Client;
use gantry_types::{
    BackendName, InstanceQuery, InstanceState, Model, ModelCreate, ModelQuery, ModelSource,
    ModelUpdate, OneOrMany, Timestamp,
};
use serde::Serialize;

use super::output::{self, fields, print_json, OutputFormat, Table};
use super::{clusters, connect, every_page, explain, instances, Connection, Output, PAGE_SIZE};

#[derive(Debug, Args)]
pub struct ModelsArgs {
    #[command(flatten)]
    pub(super) connection: Connection,
    #[command(flatten)]
    pub(super) output: Output,
    #[command(subcommand)]
    command: ModelsCommand,
}

#[derive(Debug, Subcommand)]
enum ModelsCommand {
    /// List the models, with their cluster and how many of their replicas are running.
    Ls {
        /// Only the models deployed into this cluster (its name or id).
        #[arg(long, value_name = "CLUSTER")]
        cluster: Option<String>,
    },
    /// Show a model and its instances.
    Get { name: String },
    /// Declare a model; the scheduler places its replicas.
    Create(CreateArgs),
    /// Change how many replicas a model runs.
    Scale { name: String, replicas: u32 },
    /// Delete a model; its instances stop.
    Rm { name: String },
}

#[derive(Debug, Args)]
struct CreateArgs {
    /// A whole `POST /api/v1/models` body (JSON), instead of the flags below; `-` reads it
    /// from standard input.
    #[arg(
        short = 'f',
        long = "file",
        value_name = "FILE.json",
        conflicts_with_all = ["name", "source", "backend", "backend_version", "replicas", "backend_args", "description"]
    )]
    file: Option<PathBuf>,
    /// The model's name, which clients of the gateway ask for.
    #[arg(long, required_unless_present = "file")]
    name: Option<String>,
    /// Where the weights come from: hf:OWNER/REPO[@REVISION][:FILE],
    /// ms:OWNER/REPO[@REVISION][:FILE] (ModelScope), s3://BUCKET/KEY, an http(s) URL,
    /// upload:ID, or a path on the workers (a relative one is made absolute here).
    #[arg(long, required_unless_present = "file", value_name = "SOURCE")]
    source: Option<String>,
    /// llama.cpp, vllm, sglang, or a defined backend's name.
    #[arg(long, default_value = "llama.cpp")]
    backend: String,
    /// Pin the backend version (installed on demand).
    #[arg(long, value_name = "VERSION")]
    backend_version: Option<String>,
    /// How many instances of the model run.
    #[arg(long, default_value_t = 1)]
    replicas: u32,
    /// The backend's extra arguments, split on whitespace: --backend-args "-c 4096 -np 2".
    #[arg(long, allow_hyphen_values = true, value_name = "ARGS")]
    backend_args: Option<String>,
    /// What the model is, for people.
    #[arg(long, default_value = "")]
    description: String,
    /// The cluster to deploy it into, by name or id (default: the default cluster; with
    /// --file, this replaces the file's `cluster_id`).
    #[arg(long, value_name = "CLUSTER")]
    cluster: Option<String>,
}

pub async fn run(args: ModelsArgs) -> anyhow::Result<()> {
    let client = connect(&args.connection)?;
    let format = args.output.format;
    match args.command {
        ModelsCommand::Ls { cluster } => {
            let cluster_id = match cluster {
                Some(text) => Some(clusters::resolve(&client, &text).await?.id),
                None => None,
            };
            list(&client, format, cluster_id).await
        }
        ModelsCommand::Get { name } => {
            let model = by_name(&client, &name).await?;
            if format == OutputFormat::Json {
                return print_json(&model);
            }
            let instances = instances_of(&client, Some(model.id)).await?;
            let names = clusters::names(&client).await?;
            print!("{}", describe(&model, &names));
            println!();
            print!("{}", instances::table(&instances).render());
            Ok(())
        }
        ModelsCommand::Create(create) => {
            let cluster = match &create.cluster {
                Some(text) => Some(clusters::resolve(&client, text).await?),
                None => None,
            };
            let mut request = create.request()?;
            if let Some(cluster) = &cluster {
                request.cluster_id = Some(cluster.id);
            }
            let model = client
                .create_model(&request)
                .await
                .map_err(explain)
                .with_context(|| format!("create model {}", request.name))?;
            match format {
                OutputFormat::Json => print_json(&model),
                OutputFormat::Table => {
                    let names = match cluster {
                        Some(cluster) => HashMap::from([(cluster.id, cluster.name)]),
                        None => clusters::names(&client).await?,
                    };
                    print!("{}", describe(&model, &names));
                    Ok(())
                }
            }
        }
        ModelsCommand::Scale { name, replicas } => {
            let model = by_name(&client, &name).await?;
            let update = ModelUpdate {
                replicas: Some(replicas),
                ..ModelUpdate::default()
            };
            let model = client
                .update_model(model.id, &update)
                .await
                .map_err(explain)
                .with_context(|| format!("scale model {name}"))?;
            match format {
                OutputFormat::Json => print_json(&model),
                OutputFormat::Table => {
                    println!("model {} scaled to {} replicas", model.name, model.replicas);
                    Ok(())
                }
            }
        }
        ModelsCommand::Rm { name } => {
            let model = by_name(&client, &name).await?;
            client
                .delete_model(model.id)
                .await
                .map_err(explain)
                .with_context(|| format!("delete model {name}"))?;
            println!("model {name} deleted");
            Ok(())
        }
    }
}

/// The model of this name.
pub async fn by_name(client: &Client, name: &str) -> anyhow::Result<Model> {
    let query = ModelQuery {
        name: Some(name.to_owned()),
        ..ModelQuery::default()
    };
    let list = client.list_models(&query).await.map_err(explain)?;
    list.items
        .into_iter()
        .next()
        .with_context(|| format!("no model named {name:?} (gantry models ls lists them)"))
}

/// Every instance, or every instance of one model.
pub async fn instances_of(
    client: &Client,
    model_id: Option<i64>,
) -> anyhow::Result<Vec<gantry_types::ModelInstance>> {
    every_page(|page| {
        let query = InstanceQuery {
            model_id,
            page: Some(page),
            per_page: Some(PAGE_SIZE),
            ..InstanceQuery::default()
        };
        async move { client.list_instances(&query).await }
    })
    .await
}

/// `models ls`: every model, or those of cluster `cluster_id`.
async fn list(
    client: &Client,
    format: OutputFormat,
    cluster_id: Option<i64>,
) -> anyhow::Result<()> {
    let models = every_page(|page| {
        let query = ModelQuery {
            cluster_id,
            page: Some(page),
            per_page: Some(PAGE_SIZE),
            ..ModelQuery::default()
        };
        async move { client.list_models(&query).await }
    })
    .await?;
    let (instances, names) = match format {
        OutputFormat::Json => (Vec::new(), HashMap::new()),
        OutputFormat::Table => (
            instances_of(client, None).await?,
            clusters::names(client).await?,
        ),
    };
    let now = Timestamp::now();
    output::print_list(format, &models, |models| {
        let mut table = Table::new(&["ID", "NAME", "CLUSTER", "BACKEND", "READY", "SOURCE", "AGE"]);
        for model in models {
            let running = instances
                .iter()
                .filter(|i| i.model_id == model.id && i.state == InstanceState::Running)
                .count();
            table.row(vec![
                model.id.to_string(),
                model.name.clone(),
                clusters::name_of(&names, model.cluster_id),
                model.backend.to_string(),
                format!("{running}/{}", model.replicas),
                source_text(&model.source),
                output::age(model.created_at, now),
            ]);
        }
        table
    })
}

/// A model's fields, one per line; `cluster_names` names its cluster.
fn describe(model: &Model, cluster_names: &HashMap<i64, String>) -> String {
    fields(&[
        ("ID", model.id.to_string()),
        ("NAME", model.name.clone()),
        (
            "CLUSTER",
            clusters::name_of(cluster_names, model.cluster_id),
        ),
        (
            "DESCRIPTION",
            output::or_none(Some(&model.description).filter(|d| !d.is_empty())),
        ),
        ("SOURCE", source_text(&model.source)),
        ("BACKEND", model.backend.to_string()),
        (
            "BACKEND VERSION",
            output::or_none(model.backend_version.as_ref()),
        ),
        (
            "BACKEND ARGS",
            output::or_none(Some(model.backend_args.join(" ")).filter(|a| !a.is_empty())),
        ),
        ("REPLICAS", model.replicas.to_string()),
        ("WORKER SELECTOR", output::labels(&model.worker_selector)),
        ("LABELS", output::labels(&model.labels)),
        ("CREATED", model.created_at.to_string()),
    ])
}

impl CreateArgs {
    /// The creation request: the file's body, or the flags with the API's defaults for
    /// everything else.
    fn request(self) -> anyhow::Result<ModelCreate> {
        if let Some(file) = &self.file {
            let text = if file.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin())
                    .context("read the model from standard input")?
            } else {
                std::fs::read_to_string(file).with_context(|| format!("read {}", file.display()))?
            };
            return serde_json::from_str(&text)
                .with_context(|| format!("{} is not a model creation body", file.display()));
        }
        /// What the flags declare; the rest of [`ModelCreate`] takes its defaults from the
        /// type's own deserialisation, so they are the API's.
        #[derive(Serialize)]
        struct Declared {
            name: String,
            description: String,
            source: ModelSource,
            backend: BackendName,
            backend_version: Option<String>,
            backend_args: Vec<String>,
            replicas: u32,
        }
        let declared = Declared {
            name: self.name.context("--name is required")?,
            description: self.description,
            source: parse_source(&self.source.context("--source is required")?)?,
            backend: BackendName::new(self.backend),
            backend_version: self.backend_version,
            backend_args: self
                .backend_args
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_owned)
                .collect(),
            replicas: self.replicas,
        };
        let value = serde_json::to_value(declared).context("encode the model")?;
        serde_json::from_value(value).context("build the model creation body")
    }
}

/// A model source as written on the command line (see `--source`).
fn parse_source(text: &str) -> anyhow::Result<ModelSource> {
    let hub = |rest: &str| -> anyhow::Result<(String, Option<String>, Option<String>)> {
        let (repo, file) = match rest.split_once(':') {
            Some((repo, file)) => (repo, Some(file.to_owned())),
            None => (rest, None),
        };
        let (repo, revision) = match repo.split_once('@') {
            Some((repo, revision)) => (repo, Some(revision.to_owned())),
            None => (repo, None),
        };
        if repo.is_empty() {
            anyhow::bail!("{text:?}: give the repository as OWNER/NAME");
        }
        Ok((repo.to_owned(), file.filter(|f| !f.is_empty()), revision))
    };
    if let Some(rest) = text.strip_prefix("hf:") {
        let (repo_id, file, revision) = hub(rest)?;
        return Ok(ModelSource::Huggingface {
            repo_id,
            file,
            revision,
        });
    }
    if let Some(rest) = text.strip_prefix("ms:") {
        let (repo_id, file, revision) = hub(rest)?;
        return Ok(ModelSource::Modelscope {
            repo_id,
            file,
            revision,
        });
    }
    if let Some(rest) = text.strip_prefix("s3://") {
        let (bucket, key) = rest
            .split_once('/')
            .with_context(|| format!("{text:?}: give the source as s3://BUCKET/KEY"))?;
        return Ok(ModelSource::S3 {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
        });
    }
    if text.starts_with("http://") || text.starts_with("https://") {
        return Ok(ModelSource::Url {
            url: OneOrMany::One(text.to_owned()),
            sha256: None,
        });
    }
    if let Some(id) = text.strip_prefix("upload:") {
        let id = id
            .parse()
            .with_context(|| format!("{text:?}: give the upload as upload:ID"))?;
        return Ok(ModelSource::Upload { id });
    }
    if text.is_empty() {
        anyhow::bail!("--source is empty");
    }
    let path = std::path::absolute(text).with_context(|| format!("make {text:?} absolute"))?;
    Ok(ModelSource::LocalPath {
        path: path.display().to_string(),
    })
}

/// A model source as `--source` writes it.
fn source_text(source: &ModelSource) -> String {
    let hub = |scheme: &str, repo: &str, file: &Option<String>, revision: &Option<String>| {
        let mut text = format!("{scheme}:{repo}");
        if let Some(revision) = revision {
            text.push('@');
            text.push_str(revision);
        }
        if let Some(file) = file {
            text.push(':');
            text.push_str(file);
        }
        text
    };
    match source {
        ModelSource::LocalPath { path } => path.clone(),
        ModelSource::Huggingface {
            repo_id,
            file,
            revision,
        } => hub("hf", repo_id, file, revision),
        ModelSource::Modelscope {
            repo_id,
            file,
            revision,
        } => hub("ms", repo_id, file, revision),
        ModelSource::S3 { bucket, key } => format!("s3://{bucket}/{key}"),
        ModelSource::Url { url, .. } => url.items().join(" "),
        ModelSource::Upload { id } => format!("upload:{id}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_read_as_written_and_write_back_the_same() {
        for (text, source) in [
            (
                "hf:Qwen/Qwen3-0.6B-GGUF:*Q8_0.gguf",
                ModelSource::Huggingface {
                    repo_id: "Qwen/Qwen3-0.6B-GGUF".into(),
                    file: Some("*Q8_0.gguf".into()),
                    revision: None,
                },
            ),
            (
                "hf:Qwen/Qwen3-0.6B@v1.0",
                ModelSource::Huggingface {
                    repo_id: "Qwen/Qwen3-0.6B".into(),
                    file: None,
                    revision: Some("v1.0".into()),
                },
            ),
            (
                "ms:qwen/Qwen2-0.5B@master:model.gguf",
                ModelSource::Modelscope {
                    repo_id: "qwen/Qwen2-0.5B".into(),
                    file: Some("model.gguf".into()),
                    revision: Some("master".into()),
                },
            ),
            (
                "s3://models/llama/q4.gguf",
                ModelSource::S3 {
                    bucket: "models".into(),
                    key: "llama/q4.gguf".into(),
                },
            ),
            (
                "https://host/m.gguf",
                ModelSource::Url {
                    url: OneOrMany::One("https://host/m.gguf".into()),
                    sha256: None,
                },
            ),
            ("upload:12", ModelSource::Upload { id: 12 }),
            (
                "/srv/models/tiny.gguf",
                ModelSource::LocalPath {
                    path: "/srv/models/tiny.gguf".into(),
                },
            ),
        ] {
            assert_eq!(parse_source(text).unwrap(), source, "{text}");
            assert_eq!(source_text(&source), text);
        }
    }

    #[test]
    fn a_relative_path_is_made_absolute_here() {
        let ModelSource::LocalPath { path } = parse_source("models/tiny.gguf").unwrap() else {
            panic!("a local path");
        };
        let expected = std::env::current_dir().unwrap().join("models/tiny.gguf");
        assert_eq!(PathBuf::from(path), expected);
    }

    #[test]
    fn malformed_sources_are_refused_with_the_form_to_use() {
        for text in ["s3://bucket-only", "upload:x", "hf:", ""] {
            assert!(parse_source(text).is_err(), "{text}");
        }
    }

    #[test]
    fn the_flags_make_a_request_with_the_apis_defaults() {
        let args = CreateArgs {
            file: None,
            name: Some("tiny".into()),
            source: Some("/m/tiny.gguf".into()),
            backend: "llama.cpp".into(),
            backend_version: None,
            replicas: 2,
            backend_args: Some(" -c 256  -np 1".into()),
            description: String::new(),
            cluster: None,
        };
        let request = args.request().unwrap();
        assert_eq!(request.name, "tiny");
        assert_eq!(request.replicas, 2);
        assert_eq!(request.backend_args, ["-c", "256", "-np", "1"]);
        let defaults: ModelCreate = serde_json::from_str(
            r#"{"name":"x","source":{"type":"local_path","path":"/m"},"backend":"llama.cpp"}"#,
        )
        .unwrap();
        assert_eq!(request.cpu_offload, defaults.cpu_offload);
        assert_eq!(request.placement_strategy, defaults.placement_strategy);
    }
}
