//! The client commands of `gantry`: `login`, `logout`, `models`, `instances`, `workers`,
//! `clusters`, `pools`, `keys`, `providers`, `routes`, `chat` and `completions`. They talk to a
//! running gantry through `gantry-client` (the only place that knows the API's URLs) with
//! the token that `gantry login` saved (`config_file.rs`), print an aligned table or, with
//! `-o json`, the API's JSON (`output.rs`), and turn the server's error answers into one
//! plain line (`explain`). Each resource has its file.
//!
//! These commands are declared with clap's derive API and merged into the command line
//! that `config/cli.rs` builds from the key table; they read none of the keys.

mod chat;
mod clusters;
mod config_file;
mod instances;
mod keys;
mod login;
mod models;
mod output;
mod pools;
mod providers;
mod routes;
mod workers;

use anyhow::Context;
use clap::{Args, Subcommand};
use gantry_client::{Client, ClientError};
use gantry_types::ListResponse;

pub use output::OutputFormat;

/// The client commands, as parsed.
#[derive(Debug, Subcommand)]
pub enum ClientCommand {
    /// Log in to a cluster and save a token for the commands below.
    Login(login::LoginArgs),
    /// Forget the saved token (and delete the API key `gantry login` made for it).
    Logout,
    /// List, show, create, scale and delete models.
    Models(models::ModelsArgs),
    /// List model instances and read their backends' logs.
    Instances(instances::InstancesArgs),
    /// List the workers.
    Workers(workers::WorkersArgs),
    /// List, show, create, change and delete clusters, and print the command that joins
    /// a machine to one.
    Clusters(clusters::ClustersArgs),
    /// List, show, create, change and delete worker pools: machines a cluster creates and
    /// deletes through a provider as its models need them.
    Pools(pools::PoolsArgs),
    /// Create, list, limit and delete your API keys.
    Keys(keys::KeysArgs),
    /// Add, list, change and delete model providers: external OpenAI-compatible APIs
    /// (admins).
    Providers(providers::ProvidersArgs),
    /// Add, list, change and delete model routes: model names whose requests go to
    /// weighted, prioritised targets (admins).
    Routes(routes::RoutesArgs),
    /// Chat with a model through the OpenAI-compatible gateway; the answer streams as it
    /// is written.
    Chat(chat::ChatArgs),
    /// Print shell completions for gantry (bash, zsh, fish, elvish, powershell).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// The `--help` heading of the flags every client command of a group takes.
const GLOBAL_OPTIONS: &str = "Global options";

/// Which cluster to talk to and as whom; the saved login otherwise.
#[derive(Debug, Clone, Default, Args)]
pub struct Connection {
    /// The server's URL (default: the one `gantry login` saved).
    #[arg(
        long,
        global = true,
        env = "GANTRY_SERVER",
        hide_env_values = true,
        value_name = "URL",
        help_heading = GLOBAL_OPTIONS
    )]
    server: Option<String>,
    /// The bearer token: an API key or a session token (default: the saved one).
    #[arg(
        long,
        global = true,
        env = "GANTRY_API_KEY",
        hide_env_values = true,
        value_name = "TOKEN",
        help_heading = GLOBAL_OPTIONS
    )]
    token: Option<String>,
}

/// How a command prints what the API answered.
#[derive(Debug, Clone, Copy, Args)]
pub struct Output {
    /// `table`: aligned plain text; `json`: the API's JSON (an array for lists).
    #[arg(
        short = 'o',
        long = "output",
        global = true,
        value_enum,
        default_value = "table",
        help_heading = GLOBAL_OPTIONS
    )]
    format: OutputFormat,
}

/// Runs a client command; its error is the line `main` prints before exiting non-zero.
pub fn run(command: ClientCommand) -> anyhow::Result<()> {
    // One thread is enough for one request at a time, and lets a command read the
    // terminal between requests without holding up anything else.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    runtime.block_on(async move {
        match command {
            ClientCommand::Login(args) => login::login(args).await,
            ClientCommand::Logout => login::logout().await,
            ClientCommand::Models(args) => models::run(args).await,
            ClientCommand::Instances(args) => instances::run(args).await,
            ClientCommand::Workers(args) => workers::run(args).await,
            ClientCommand::Clusters(args) => clusters::run(args).await,
            ClientCommand::Pools(args) => pools::run(args).await,
            ClientCommand::Keys(args) => keys::run(args).await,
            ClientCommand::Providers(args) => providers::run(args).await,
            ClientCommand::Routes(args) => routes::run(args).await,
            ClientCommand::Chat(args) => chat::run(args).await,
            ClientCommand::Completions { shell } => {
                let mut gantry = crate::config::cli::command();
                clap_complete::generate(shell, &mut gantry, "gantry", &mut std::io::stdout());
                Ok(())
            }
        }
    })
}

/// What to say when there is no token or server to use.
const NOT_LOGGED_IN: &str =
    "not logged in: run gantry login SERVER first (or set GANTRY_SERVER and GANTRY_API_KEY)";

/// A client of the cluster the flags, the environment or the saved login name, with its
/// token.
fn connect(connection: &Connection) -> anyhow::Result<Client> {
    let saved = match connection {
        Connection {
            server: Some(_),
            token: Some(_),
        } => None,
        _ => config_file::SavedLogin::load()?,
    };
    let server = connection
        .server
        .clone()
        .or_else(|| saved.as_ref().map(|s| s.server.clone()))
        .context(NOT_LOGGED_IN)?;
    let token = connection
        .token
        .clone()
        .or_else(|| saved.map(|s| s.token))
        .filter(|token| !token.is_empty())
        .context(NOT_LOGGED_IN)?;
    Ok(Client::new(server_url(&server)?).with_token(token))
}

/// A server URL as given on the command line: with its scheme, without a trailing `/`.
fn server_url(text: &str) -> anyhow::Result<String> {
    let url = text.trim().trim_end_matches('/');
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        anyhow::bail!(
            "{text:?} is not a server URL: give it with its scheme, such as http://HOST:8080 \
             or https://HOST"
        );
    }
    Ok(url.to_owned())
}

/// A failed call as one line for people: the server's own message where it sent one.
fn explain(error: ClientError) -> anyhow::Error {
    match &error {
        ClientError::Api { error: detail, .. } => {
            let hint = match detail.code {
                gantry_types::ErrorCode::Unauthorized => {
                    "; the saved token may be expired or deleted: run gantry login SERVER again"
                }
                gantry_types::ErrorCode::PasswordChangeRequired => {
                    "; run gantry login SERVER on a terminal to change it"
                }
                _ => "",
            };
            anyhow::anyhow!("{} ({}){hint}", detail.message, detail.code)
        }
        ClientError::Status { status, body, .. } => match openai_message(body) {
            Some(message) => anyhow::anyhow!("{message} (HTTP {status})"),
            None => anyhow::anyhow!("{error}"),
        },
        ClientError::Unreachable { last, .. } => {
            anyhow::anyhow!("cannot reach the server: {last}")
        }
        ClientError::Decode { .. } => anyhow::anyhow!("{error}"),
    }
}

/// The message of an OpenAI-shaped error body (`{"error": {"message": …}}`), which the
/// gateway answers with.
fn openai_message(body: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Body {
        error: Detail,
    }
    #[derive(serde::Deserialize)]
    struct Detail {
        message: String,
    }
    serde_json::from_str::<Body>(body)
        .ok()
        .map(|body| body.error.message)
}

/// Every item of a list, page by page.
async fn every_page<T, F, Fut>(mut page: F) -> anyhow::Result<Vec<T>>
where
    F: FnMut(u32) -> Fut,
    Fut: std::future::Future<Output = Result<ListResponse<T>, ClientError>>,
{
    let mut items = Vec::new();
    for number in 1.. {
        let answer = page(number).await.map_err(explain)?;
        let empty = answer.items.is_empty();
        items.extend(answer.items);
        if empty || items.len() as u64 >= answer.pagination.total {
            break;
        }
    }
    Ok(items)
}

/// The largest page a list command asks for.
const PAGE_SIZE: u32 = gantry_types::query::MAX_PER_PAGE;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::cli::{parse_from, Invocation};

    fn client_command(args: &[&str]) -> ClientCommand {
        match parse_from(std::iter::once("gantry").chain(args.iter().copied())) {
            Ok(Invocation::Client(command)) => command,
            other => panic!("{args:?} should be a client command: {other:?}"),
        }
    }

    #[test]
    fn connection_and_output_flags_work_before_and_after_the_subcommand() {
        let ClientCommand::Models(args) = client_command(&[
            "models",
            "--server",
            "http://a:8080",
            "ls",
            "-o",
            "json",
            "--token",
            "t",
        ]) else {
            panic!("models");
        };
        assert_eq!(args.connection.server.as_deref(), Some("http://a:8080"));
        assert_eq!(args.connection.token.as_deref(), Some("t"));
        assert_eq!(args.output.format, OutputFormat::Json);
    }

    #[test]
    fn client_commands_hide_the_server_keys_but_parse_as_before() {
        let help = crate::config::cli::command()
            .try_get_matches_from(["gantry", "models", "ls", "--help"])
            .expect_err("--help ends parsing")
            .to_string();
        assert!(!help.contains("--data-dir"), "{help}");
        assert!(help.contains("--output"), "{help}");
        assert!(matches!(
            parse_from(["gantry", "--data-dir", "/x", "start"]),
            Ok(Invocation::Run { .. })
        ));
    }

    #[test]
    fn a_server_url_needs_its_scheme() {
        assert_eq!(
            server_url("http://127.0.0.1:8080/").unwrap(),
            "http://127.0.0.1:8080"
        );
        assert!(server_url("127.0.0.1:8080").is_err());
    }

    #[test]
    fn the_gateways_error_message_is_shown() {
        let error = ClientError::Status {
            url: "http://a/v1/chat/completions".into(),
            status: 404,
            body: r#"{"error":{"message":"model nope not found","type":"invalid_request_error","param":"model","code":"model_not_found"}}"#.into(),
        };
        assert_eq!(
            explain(error).to_string(),
            "model nope not found (HTTP 404)"
        );
    }
}
