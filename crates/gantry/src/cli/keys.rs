//! `gantry keys create NAME [--expires-in-days N] [--rpm N] [--tpm N] [--allow-route
//! NAME]...`, `gantry keys ls`, `gantry keys limit ID …` and `gantry keys rm ID`: the
//! caller's API keys (an admin's list shows every user's) and the gateway's limits on
//! them, which only an admin may change once a key exists.

use anyhow::Context;
use clap::{Args, Subcommand};
use gantry_types::validate::check_name;
use gantry_types::{ApiKey, ApiKeyCreate, ApiKeyLimits, ApiKeyQuery, ApiKeyUpdate, Timestamp};

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
        #[command(flatten)]
        limits: CreateLimits,
    },
    /// List API keys (never their secrets) and their limits.
    #[command(visible_alias = "list")]
    Ls,
    /// Change the gateway's limits on an API key (admins); what is not given stays.
    Limit(LimitArgs),
    /// Delete an API key; requests with it are refused from then on.
    Rm {
        /// The key's id (gantry keys ls shows it).
        id: i64,
    },
}

/// The limits a key is created with; without them, none.
#[derive(Debug, Args)]
struct CreateLimits {
    /// Requests the key may make in any minute (1 to 1000000); past it the gateway
    /// answers 429.
    #[arg(long = "rpm", value_name = "N", value_parser = requests_per_minute())]
    requests_per_minute: Option<u32>,
    /// Tokens (prompt and completion) the key may use in any minute (1 to 10^12).
    #[arg(long = "tpm", value_name = "N", value_parser = tokens_per_minute())]
    tokens_per_minute: Option<u64>,
    /// A route (or deployed model) the key may call (repeatable); without it, any.
    #[arg(long = "allow-route", value_name = "NAME", value_parser = route_name)]
    allowed_routes: Vec<String>,
}

#[derive(Debug, Args)]
struct LimitArgs {
    /// The key's id (gantry keys ls shows it).
    id: i64,
    /// Requests the key may make in any minute (1 to 1000000).
    #[arg(long = "rpm", value_name = "N", value_parser = requests_per_minute())]
    requests_per_minute: Option<u32>,
    /// Lift the requests-per-minute limit.
    #[arg(long, conflicts_with = "requests_per_minute")]
    no_rpm: bool,
    /// Tokens the key may use in any minute (1 to 10^12).
    #[arg(long = "tpm", value_name = "N", value_parser = tokens_per_minute())]
    tokens_per_minute: Option<u64>,
    /// Lift the tokens-per-minute limit.
    #[arg(long, conflicts_with = "tokens_per_minute")]
    no_tpm: bool,
    /// The routes the key may call (repeatable): they replace the list it had.
    #[arg(long = "allow-route", value_name = "NAME", value_parser = route_name)]
    allowed_routes: Vec<String>,
    /// Let the key call any route.
    #[arg(long, conflicts_with = "allowed_routes")]
    any_route: bool,
}

fn requests_per_minute() -> clap::builder::RangedI64ValueParser<u32> {
    clap::value_parser!(u32).range(1..=1_000_000)
}

fn tokens_per_minute() -> clap::builder::RangedU64ValueParser<u64> {
    clap::value_parser!(u64).range(1..=1_000_000_000_000)
}

/// A limit's change: lifted (`--no-…`), set, or left as it is.
fn lift_or_set<T>(lift: bool, value: Option<T>) -> Option<Option<T>> {
    if lift {
        Some(None)
    } else {
        value.map(Some)
    }
}

/// An `--allow-route`: a route's (or deployed model's) name.
fn route_name(name: &str) -> Result<String, String> {
    check_name("a route name", name).map_err(|e| e.to_string())?;
    Ok(name.to_owned())
}

impl LimitArgs {
    /// The change the flags ask for; an error when they ask for none.
    fn update(self) -> anyhow::Result<ApiKeyUpdate> {
        let allowed_routes = if self.any_route {
            Some(None)
        } else {
            Some(self.allowed_routes)
                .filter(|routes| !routes.is_empty())
                .map(Some)
        };
        let update = ApiKeyUpdate {
            description: None,
            allowed_routes,
            requests_per_minute: lift_or_set(self.no_rpm, self.requests_per_minute),
            tokens_per_minute: lift_or_set(self.no_tpm, self.tokens_per_minute),
        };
        if update.allowed_routes.is_none()
            && update.requests_per_minute.is_none()
            && update.tokens_per_minute.is_none()
        {
            anyhow::bail!(
                "nothing to change: give --rpm, --no-rpm, --tpm, --no-tpm, --allow-route or \
                 --any-route"
            );
        }
        Ok(update)
    }
}

pub async fn run(args: KeysArgs) -> anyhow::Result<()> {
    let client = connect(&args.connection)?;
    let format = args.output.format;
    match args.command {
        KeysCommand::Create {
            name,
            expires_in_days,
            description,
            limits,
        } => {
            let created = client
                .create_api_key(&ApiKeyCreate {
                    name: name.clone(),
                    description,
                    expires_in_days,
                    allowed_routes: Some(limits.allowed_routes).filter(|r| !r.is_empty()),
                    requests_per_minute: limits.requests_per_minute,
                    tokens_per_minute: limits.tokens_per_minute,
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
                            ("LIMITS", limits_text(&created.api_key.limits)),
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
        KeysCommand::Limit(limit) => {
            let id = limit.id;
            let update = limit.update()?;
            let key = client
                .update_api_key(id, &update)
                .await
                .map_err(explain)
                .with_context(|| format!("change the limits of API key {id}"))?;
            match format {
                OutputFormat::Json => print_json(&key),
                OutputFormat::Table => {
                    print!(
                        "{}",
                        fields(&[
                            ("ID", key.id.to_string()),
                            ("NAME", key.name.clone()),
                            ("ROUTES", routes_text(&key.limits)),
                            ("RPM", output::or_none(key.limits.requests_per_minute)),
                            ("TPM", output::or_none(key.limits.tokens_per_minute)),
                        ])
                    );
                    Ok(())
                }
            }
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
        "ROUTES",
        "RPM",
        "TPM",
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
            routes_text(&key.limits),
            output::or_none(key.limits.requests_per_minute),
            output::or_none(key.limits.tokens_per_minute),
            output::age(key.created_at, now),
        ]);
    }
    table
}

/// The routes a key may call: `any`, `none` or their names.
fn routes_text(limits: &ApiKeyLimits) -> String {
    match &limits.allowed_routes {
        None => "any".to_owned(),
        Some(routes) if routes.is_empty() => "none".to_owned(),
        Some(routes) => routes.join(","),
    }
}

/// A key's limits on one line: `routes=chat rpm=60 tpm=-`, or `none`.
fn limits_text(limits: &ApiKeyLimits) -> String {
    if !limits.is_limited() {
        return "none".to_owned();
    }
    format!(
        "routes={} rpm={} tpm={}",
        routes_text(limits),
        output::or_none(limits.requests_per_minute),
        output::or_none(limits.tokens_per_minute)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(args: &[&str]) -> Result<ApiKeyUpdate, String> {
        let invocation =
            crate::config::cli::parse_from(["gantry", "keys", "limit", "7"].iter().chain(args))
                .map_err(|e| e.to_string())?;
        let crate::config::cli::Invocation::Client(crate::cli::ClientCommand::Keys(keys)) =
            invocation
        else {
            panic!("keys limit is a keys command");
        };
        let KeysCommand::Limit(limit) = keys.command else {
            panic!("a limit command");
        };
        limit.update().map_err(|e| e.to_string())
    }

    #[test]
    fn limits_are_set_lifted_or_left_as_they_are() {
        let update = limit(&["--rpm", "60", "--no-tpm"]).unwrap();
        assert_eq!(update.requests_per_minute, Some(Some(60)));
        assert_eq!(update.tokens_per_minute, Some(None));
        assert_eq!(update.allowed_routes, None);
        let update = limit(&["--allow-route", "chat", "--allow-route", "tiny"]).unwrap();
        assert_eq!(
            update.allowed_routes,
            Some(Some(vec!["chat".to_owned(), "tiny".to_owned()]))
        );
        assert_eq!(update.requests_per_minute, None);
        let update = limit(&["--any-route"]).unwrap();
        assert_eq!(update.allowed_routes, Some(None));
    }

    #[test]
    fn bad_limits_name_their_flag() {
        for (args, flag) in [
            (&["--rpm", "0"][..], "--rpm"),
            (&["--rpm", "many"], "--rpm"),
            (&["--tpm=-5"], "--tpm"),
            (&["--rpm", "5", "--no-rpm"], "--no-rpm"),
            (&["--allow-route", "Chat"], "--allow-route"),
            (&["--allow-route", "chat", "--any-route"], "--any-route"),
            (&[], "nothing to change"),
        ] {
            let error = limit(args).expect_err("refused");
            assert!(error.contains(flag), "{args:?}: {error}");
        }
    }

    #[test]
    fn limits_read_in_one_line() {
        assert_eq!(limits_text(&ApiKeyLimits::default()), "none");
        let limits = ApiKeyLimits {
            allowed_routes: Some(vec!["chat".into()]),
            requests_per_minute: Some(60),
            tokens_per_minute: None,
        };
        assert_eq!(limits_text(&limits), "routes=chat rpm=60 tpm=-");
    }
}
