//! `gantry keys create NAME [--expires-in-days N]`, `gantry keys ls` and
//! `gantry keys rm ID`: the caller's API keys (an admin's list shows every user's).

use anyhow::Context;
use clap::{Args, Subcommand};
use gantry_types::{ApiKey, ApiKeyCreate, ApiKeyQuery, Timestamp};

use super::output::{self, fields, print_json, OutputFormat, Table};
use super::{connect, every_page, explain, Connection, Output, PAGE_SIZE};

#[derive(Debug, Args)]
pub struct KeysArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(flatten)]
    output: Output,
    #[command(subcommand)]
    command: KeysCommand,
}

#[derive(Debug, Subcommand)]
enum KeysCommand {
    /// Create an API key; the key itself is printed this once.
    Create {
        /// A name of your own for the key, unique among your keys.
        name: String,
        /// Days until the key expires (1 to 3650); without it, it never expires.
        #[arg(long, value_name = "N")]
        expires_in_days: Option<u32>,
        #[arg(long, default_value = "")]
        description: String,
    },
    /// List API keys (never their secrets).
    Ls,
    /// Delete an API key; requests with it are refused from then on.
    Rm {
        /// The key's id (gantry keys ls shows it).
        id: i64,
    },
}

pub async fn run(args: KeysArgs) -> anyhow::Result<()> {
    let client = connect(&args.connection)?;
    let format = args.output.format;
    match args.command {
        KeysCommand::Create {
            name,
            expires_in_days,
            description,
        } => {
            let created = client
                .create_api_key(&ApiKeyCreate {
                    name: name.clone(),
                    description,
                    expires_in_days,
                    ..Default::default()
                })
                .await
                .map_err(explain)
                .with_context(|| format!("create API key {name}"))?;
            match format {
                OutputFormat::Json => print_json(&created),
                OutputFormat::Table => {
                    print!(
                        "{}",
                        fields(&[
                            ("ID", created.api_key.id.to_string()),
                            ("NAME", created.api_key.name.clone()),
                            ("EXPIRES", output::or_none(created.api_key.expires_at)),
                            ("KEY", created.key.clone()),
                        ])
                    );
                    eprintln!("Store the key now: it cannot be shown again.");
                    Ok(())
                }
            }
        }
        KeysCommand::Ls => {
            let keys = every_page(|page| {
                let query = ApiKeyQuery {
                    page: Some(page),
                    per_page: Some(PAGE_SIZE),
                    ..ApiKeyQuery::default()
                };
                let client = &client;
                async move { client.list_api_keys(&query).await }
            })
            .await?;
            let now = Timestamp::now();
            output::print_list(format, &keys, |keys| table(keys, now))
        }
        KeysCommand::Rm { id } => {
            client
                .delete_api_key(id)
                .await
                .map_err(explain)
                .with_context(|| format!("delete API key {id}"))?;
            println!("API key {id} deleted");
            Ok(())
        }
    }
}

fn table(keys: &[ApiKey], now: Timestamp) -> Table {
    let mut table = Table::new(&[
        "ID",
        "NAME",
        "USER",
        "ACCESS KEY",
        "EXPIRES",
        "LAST USED",
        "AGE",
    ]);
    for key in keys {
        table.row(vec![
            key.id.to_string(),
            key.name.clone(),
            key.user_id.to_string(),
            key.access_key.clone(),
            output::or_none(key.expires_at),
            key.last_used_at.map_or_else(
                || output::NONE.to_owned(),
                |at| format!("{} ago", output::age(at, now)),
            ),
            output::age(key.created_at, now),
        ]);
    }
    table
}
