//! `gantry providers list|show|add|edit|delete|models`: the model providers, external
//! OpenAI-compatible APIs that routes can send requests to (admins only).
//!
//! A provider's API key is never an argument: it would stay in the shell's history and
//! be shown to every user of the machine by `ps`. It is read from an environment
//! variable that `--api-key-env` names, or from standard input with `--api-key-stdin`;
//! the server stores it sealed and never shows it again.

use std::collections::BTreeMap;
use std::io::BufRead;

use anyhow::Context;
use clap::{Args, Subcommand};
use gantry_types::route::DEFAULT_PROVIDER_TIMEOUT_SECONDS;
use gantry_types::{ModelProvider, ModelProviderCreate, ModelProviderUpdate, Timestamp};

use super::output::{self, fields, print_json, OutputFormat, Table};
use super::{connect, explain, Connection, Output};

#[derive(Debug, Args)]
pub struct ProvidersArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(flatten)]
    output: Output,
    #[command(subcommand)]
    command: ProvidersCommand,
}

#[derive(Debug, Subcommand)]
enum ProvidersCommand {
    /// List the model providers (never their API keys).
    #[command(visible_alias = "ls")]
    List,
    /// Show a model provider.
    #[command(visible_alias = "get")]
    Show { name: String },
    /// Add a model provider: an OpenAI-compatible API that routes can send requests to.
    Add(AddArgs),
    /// Change a model provider; what is not given stays as it is.
    Edit(EditArgs),
    /// Delete a model provider that no route uses.
    #[command(visible_alias = "rm")]
    Delete { name: String },
    /// Ask a model provider which models it offers (its GET /models), now.
    Models { name: String },
}

/// Where the provider's API key is read from; never the key itself.
#[derive(Debug, Args)]
struct KeyFlags {
    /// Read the provider's API key from this environment variable (the key itself is
    /// never an argument: it would be kept in the shell's history and shown by ps).
    #[arg(long, value_name = "VAR", conflicts_with = "api_key_stdin")]
    api_key_env: Option<String>,
    /// Read the provider's API key from the first line of standard input.
    #[arg(long)]
    api_key_stdin: bool,
}

#[derive(Debug, Args)]
struct AddArgs {
    /// The provider's name, which route targets give as PROVIDER/MODEL.
    name: String,
    /// The API's base URL with its version path: https://api.example.com/v1 (requests go
    /// to URL/chat/completions, URL/models, …).
    #[arg(long, value_name = "URL")]
    base_url: String,
    #[command(flatten)]
    key: KeyFlags,
    /// An extra request header sent to the provider, NAME=VALUE (repeatable). Headers are
    /// not secret: give credentials as the API key.
    #[arg(long = "header", value_name = "NAME=VALUE", value_parser = parse_header)]
    headers: Vec<(String, String)>,
    /// Seconds the provider has to start answering before a request falls through to
    /// the route's next target (1 to 3600).
    #[arg(
        long = "timeout",
        value_name = "SECS",
        default_value_t = DEFAULT_PROVIDER_TIMEOUT_SECONDS,
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    timeout_seconds: u64,
    /// A model id the provider offers (repeatable); routes may then name only these.
    /// Without it, routes may name any model of the provider.
    #[arg(long = "model", value_name = "ID")]
    models: Vec<String>,
    /// What the provider is, for people.
    #[arg(long, default_value = "")]
    description: String,
}

#[derive(Debug, Args)]
struct EditArgs {
    /// The provider's name.
    name: String,
    /// A new base URL, with its version path.
    #[arg(long, value_name = "URL")]
    base_url: Option<String>,
    #[command(flatten)]
    key: KeyFlags,
    /// Remove the provider's API key.
    #[arg(long, conflicts_with_all = ["api_key_env", "api_key_stdin"])]
    remove_api_key: bool,
    /// The extra request headers, NAME=VALUE (repeatable): they replace all the
    /// provider's headers.
    #[arg(long = "header", value_name = "NAME=VALUE", value_parser = parse_header)]
    headers: Vec<(String, String)>,
    /// Remove all the provider's extra headers.
    #[arg(long, conflicts_with = "headers")]
    no_headers: bool,
    /// Seconds the provider has to start answering (1 to 3600).
    #[arg(
        long = "timeout",
        value_name = "SECS",
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    timeout_seconds: Option<u64>,
    /// The model ids the provider offers (repeatable): they replace the list.
    #[arg(long = "model", value_name = "ID")]
    models: Vec<String>,
    /// Let routes name any model of the provider (empties the list).
    #[arg(long, conflicts_with = "models")]
    any_model: bool,
    /// A new description.
    #[arg(long)]
    description: Option<String>,
}

pub async fn run(args: ProvidersArgs) -> anyhow::Result<()> {
    let client = connect(&args.connection)?;
    let format = args.output.format;
    match args.command {
        ProvidersCommand::List => {
            let providers = client
                .list_providers()
                .await
                .map_err(explain)
                .context("list model providers")?;
            let now = Timestamp::now();
            output::print_list(format, &providers, |providers| table(providers, now))
        }
        ProvidersCommand::Show { name } => {
            let provider = client
                .get_provider(&name)
                .await
                .map_err(explain)
                .with_context(|| format!("show model provider {name}"))?;
            print_provider(format, &provider)
        }
        ProvidersCommand::Add(add) => {
            let name = add.name.clone();
            let request = add.request()?;
            let provider = client
                .create_provider(&request)
                .await
                .map_err(explain)
                .with_context(|| format!("add model provider {name}"))?;
            print_provider(format, &provider)
        }
        ProvidersCommand::Edit(edit) => {
            let name = edit.name.clone();
            let update = edit.update()?;
            let provider = client
                .update_provider(&name, &update)
                .await
                .map_err(explain)
                .with_context(|| format!("change model provider {name}"))?;
            print_provider(format, &provider)
        }
        ProvidersCommand::Delete { name } => {
            client
                .delete_provider(&name)
                .await
                .map_err(explain)
                .with_context(|| format!("delete model provider {name}"))?;
            println!("model provider {name} deleted");
            Ok(())
        }
        ProvidersCommand::Models { name } => {
            let found = client
                .provider_models(&name)
                .await
                .map_err(explain)
                .with_context(|| format!("ask model provider {name} for its models"))?;
            match format {
                OutputFormat::Json => print_json(&found),
                OutputFormat::Table => {
                    let mut table = Table::new(&["MODEL"]);
                    for model in &found.models {
                        table.row(vec![model.clone()]);
                    }
                    print!("{}", table.render());
                    Ok(())
                }
            }
        }
    }
}

impl AddArgs {
    fn request(self) -> anyhow::Result<ModelProviderCreate> {
        Ok(ModelProviderCreate {
            api_key: self.key.read()?,
            name: self.name,
            description: self.description,
            base_url: self.base_url,
            headers: header_map(self.headers)?,
            timeout_seconds: self.timeout_seconds,
            models: self.models,
        })
    }
}

impl EditArgs {
    /// The change the flags ask for; an error when they ask for none.
    fn update(self) -> anyhow::Result<ModelProviderUpdate> {
        let api_key = if self.remove_api_key {
            Some(None)
        } else {
            self.key.read()?.map(Some)
        };
        let headers = if self.no_headers {
            Some(BTreeMap::new())
        } else if self.headers.is_empty() {
            None
        } else {
            Some(header_map(self.headers)?)
        };
        let models = if self.any_model {
            Some(Vec::new())
        } else {
            Some(self.models).filter(|models| !models.is_empty())
        };
        let update = ModelProviderUpdate {
            description: self.description,
            base_url: self.base_url,
            api_key,
            headers,
            timeout_seconds: self.timeout_seconds,
            models,
        };
        let ModelProviderUpdate {
            description,
            base_url,
            api_key,
            headers,
            timeout_seconds,
            models,
        } = &update;
        if description.is_none()
            && base_url.is_none()
            && api_key.is_none()
            && headers.is_none()
            && timeout_seconds.is_none()
            && models.is_none()
        {
            anyhow::bail!(
                "nothing to change: give --base-url, --api-key-env, --api-key-stdin, \
                 --remove-api-key, --header, --no-headers, --timeout, --model, --any-model or \
                 --description"
            );
        }
        Ok(update)
    }
}

impl KeyFlags {
    /// The API key from where the flags say, or none when they name no place.
    fn read(&self) -> anyhow::Result<Option<String>> {
        self.read_from(|variable| std::env::var(variable), std::io::stdin().lock())
    }

    /// [`KeyFlags::read`] with the environment and standard input given.
    fn read_from(
        &self,
        env: impl Fn(&str) -> Result<String, std::env::VarError>,
        mut stdin: impl BufRead,
    ) -> anyhow::Result<Option<String>> {
        if let Some(variable) = &self.api_key_env {
            let key = env(variable).map_err(|e| match e {
                std::env::VarError::NotPresent => {
                    anyhow::anyhow!("--api-key-env {variable}: the variable is not set")
                }
                std::env::VarError::NotUnicode(_) => {
                    anyhow::anyhow!("--api-key-env {variable}: the variable is not UTF-8")
                }
            })?;
            let key = key.trim();
            if key.is_empty() {
                anyhow::bail!("--api-key-env {variable}: the variable is empty");
            }
            return Ok(Some(key.to_owned()));
        }
        if self.api_key_stdin {
            let mut line = String::new();
            stdin
                .read_line(&mut line)
                .context("--api-key-stdin: read the API key from standard input")?;
            let key = line.trim();
            if key.is_empty() {
                anyhow::bail!("--api-key-stdin: standard input held no API key");
            }
            return Ok(Some(key.to_owned()));
        }
        Ok(None)
    }
}

/// A `--header NAME=VALUE`.
fn parse_header(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, value)) if !name.trim().is_empty() => {
            Ok((name.trim().to_owned(), value.to_owned()))
        }
        _ => Err("give the header as NAME=VALUE".to_owned()),
    }
}

/// The `--header`s as a map; a name given twice is an error.
fn header_map(headers: Vec<(String, String)>) -> anyhow::Result<BTreeMap<String, String>> {
    let mut map = BTreeMap::new();
    for (name, value) in headers {
        if map.insert(name.clone(), value).is_some() {
            anyhow::bail!("--header {name} is given twice");
        }
    }
    Ok(map)
}

fn print_provider(format: OutputFormat, provider: &ModelProvider) -> anyhow::Result<()> {
    match format {
        OutputFormat::Json => print_json(provider),
        OutputFormat::Table => {
            print!("{}", describe(provider));
            Ok(())
        }
    }
}

/// Whether a key is set: the key itself is never shown.
fn key_text(provider: &ModelProvider) -> String {
    if provider.has_api_key {
        "set"
    } else {
        output::NONE
    }
    .to_owned()
}

/// The models a provider offers: `any` for an empty list.
fn models_text(provider: &ModelProvider) -> String {
    if provider.models.is_empty() {
        "any".to_owned()
    } else {
        provider.models.join(",")
    }
}

fn table(providers: &[ModelProvider], now: Timestamp) -> Table {
    let mut table = Table::new(&["NAME", "BASE URL", "API KEY", "MODELS", "TIMEOUT", "AGE"]);
    for provider in providers {
        table.row(vec![
            provider.name.clone(),
            provider.base_url.clone(),
            key_text(provider),
            models_text(provider),
            format!("{}s", provider.timeout_seconds),
            output::age(provider.created_at, now),
        ]);
    }
    table
}

/// A provider's fields, one per line.
fn describe(provider: &ModelProvider) -> String {
    fields(&[
        ("NAME", provider.name.clone()),
        (
            "DESCRIPTION",
            output::or_none(Some(&provider.description).filter(|d| !d.is_empty())),
        ),
        ("BASE URL", provider.base_url.clone()),
        ("API KEY", key_text(provider)),
        ("HEADERS", output::labels(&provider.headers)),
        ("TIMEOUT", format!("{}s", provider.timeout_seconds)),
        ("MODELS", models_text(provider)),
        ("CREATED", provider.created_at.to_string()),
        ("UPDATED", provider.updated_at.to_string()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_name_equals_value() {
        assert_eq!(
            parse_header("X-Org=a=b").unwrap(),
            ("X-Org".to_owned(), "a=b".to_owned())
        );
        assert_eq!(
            parse_header("X-Empty=").unwrap(),
            ("X-Empty".to_owned(), String::new())
        );
        for bad in ["X-Org", "=v", ""] {
            assert!(parse_header(bad).is_err(), "{bad}");
        }
        let twice = header_map(vec![("A".into(), "1".into()), ("A".into(), "2".into())]);
        assert!(twice.unwrap_err().to_string().contains("--header A"));
    }

    #[test]
    fn the_key_is_read_from_the_variable_named_or_the_first_line_of_stdin() {
        let from_env = KeyFlags {
            api_key_env: Some("HOSTED_KEY".into()),
            api_key_stdin: false,
        };
        let unset = |_: &str| Err(std::env::VarError::NotPresent);
        let error = from_env.read_from(unset, &b""[..]).unwrap_err().to_string();
        assert_eq!(error, "--api-key-env HOSTED_KEY: the variable is not set");
        let set = |name: &str| {
            assert_eq!(name, "HOSTED_KEY");
            Ok("sk-1\n".to_owned())
        };
        assert_eq!(
            from_env.read_from(set, &b""[..]).unwrap().as_deref(),
            Some("sk-1")
        );
        let empty = |_: &str| Ok("  ".to_owned());
        assert!(from_env.read_from(empty, &b""[..]).is_err());

        let from_stdin = KeyFlags {
            api_key_env: None,
            api_key_stdin: true,
        };
        assert_eq!(
            from_stdin
                .read_from(unset, &b"sk-2\r\nsecond line\n"[..])
                .unwrap()
                .as_deref(),
            Some("sk-2")
        );
        let error = from_stdin.read_from(unset, &b"\n"[..]).unwrap_err();
        assert!(error.to_string().contains("--api-key-stdin"), "{error}");

        let nowhere = KeyFlags {
            api_key_env: None,
            api_key_stdin: false,
        };
        assert_eq!(nowhere.read_from(unset, &b"sk-3"[..]).unwrap(), None);
    }

    #[test]
    fn an_edit_without_a_change_names_the_flags() {
        let edit = EditArgs {
            name: "hosted".into(),
            base_url: None,
            key: KeyFlags {
                api_key_env: None,
                api_key_stdin: false,
            },
            remove_api_key: false,
            headers: Vec::new(),
            no_headers: false,
            timeout_seconds: None,
            models: Vec::new(),
            any_model: false,
            description: None,
        };
        let error = edit.update().unwrap_err().to_string();
        assert!(error.contains("nothing to change"), "{error}");
    }
}
