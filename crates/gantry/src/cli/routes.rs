//! `gantry routes list|show|add|edit|delete`: the model routes, public model names whose
//! requests go to weighted, prioritised targets (admins only).
//!
//! A target is written `MODEL` for a model deployed on the cluster and `PROVIDER/MODEL`
//! for a model of a provider, followed by `:weight=N` and `:priority=N` as needed (see
//! [`TARGET_HELP`]). Deployed model and provider names cannot hold `/` or `:`, so the
//! first `/` ends the provider's name however many a provider's model id holds, and the
//! options are the trailing `:KEY=N` parts, so a model id with `:` of its own
//! (`ollama/llama3:8b`) needs no quoting.

use anyhow::Context;
use clap::{Args, Subcommand};
use gantry_types::route::{check_provider_model, MAX_TARGET_PRIORITY, MAX_TARGET_WEIGHT};
use gantry_types::validate::check_name;
use gantry_types::{ModelRoute, ModelRouteCreate, ModelRouteUpdate, RouteTarget, Timestamp};

use super::output::{self, fields, print_json, OutputFormat, Table};
use super::{connect, explain, Connection, Output};

/// How `--target` is written, for `--help`.
const TARGET_HELP: &str = "A target (repeatable): MODEL for a model deployed on this \
cluster, PROVIDER/MODEL for a model of a provider (the first / ends the provider's name: \
hosted/meta-llama/Llama-3-8B is model meta-llama/Llama-3-8B of provider hosted), then \
optionally :weight=N (share of the traffic among the targets of the same priority, 0 to \
10000, default 1) and :priority=N (0 to 100, default 0; lower is used first, higher ones \
only when none of the lower can answer). Only those trailing :KEY=N parts are options: a \
provider's model id may hold : itself (ollama/llama3:8b). Example: --target tiny:weight=3 --target \
hosted/gpt-4o-mini --target hosted/gpt-4o:priority=1";

#[derive(Debug, Args)]
pub struct RoutesArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(flatten)]
    output: Output,
    #[command(subcommand)]
    command: RoutesCommand,
}

#[derive(Debug, Subcommand)]
enum RoutesCommand {
    /// List the model routes and their targets.
    #[command(visible_alias = "ls")]
    List,
    /// Show a model route.
    #[command(visible_alias = "get")]
    Show { name: String },
    /// Add a model route: a model name clients send, and where its requests go.
    Add {
        /// The name clients send as `model`. It may be a deployed model's name, to put
        /// fallbacks behind that model.
        name: String,
        #[arg(long = "target", value_name = "SPEC", required = true, value_parser = parse_target, help = TARGET_HELP)]
        targets: Vec<RouteTarget>,
        /// What the route is for, for people.
        #[arg(long, default_value = "")]
        description: String,
    },
    /// Change a model route: --target replaces all its targets.
    Edit {
        /// The route's name.
        name: String,
        #[arg(long = "target", value_name = "SPEC", value_parser = parse_target, help = TARGET_HELP)]
        targets: Vec<RouteTarget>,
        /// A new description.
        #[arg(long)]
        description: Option<String>,
    },
    /// Delete a model route; a deployed model of its name is then its own route again.
    #[command(visible_alias = "rm")]
    Delete { name: String },
}

pub async fn run(args: RoutesArgs) -> anyhow::Result<()> {
    let client = connect(&args.connection)?;
    let format = args.output.format;
    match args.command {
        RoutesCommand::List => {
            let routes = client
                .list_routes()
                .await
                .map_err(explain)
                .context("list model routes")?;
            let now = Timestamp::now();
            output::print_list(format, &routes, |routes| table(routes, now))
        }
        RoutesCommand::Show { name } => {
            let route = client
                .get_route(&name)
                .await
                .map_err(explain)
                .with_context(|| format!("show model route {name}"))?;
            print_route(format, &route)
        }
        RoutesCommand::Add {
            name,
            targets,
            description,
        } => {
            let route = client
                .create_route(&ModelRouteCreate {
                    name: name.clone(),
                    description,
                    targets,
                })
                .await
                .map_err(explain)
                .with_context(|| format!("add model route {name}"))?;
            print_route(format, &route)
        }
        RoutesCommand::Edit {
            name,
            targets,
            description,
        } => {
            if targets.is_empty() && description.is_none() {
                anyhow::bail!("nothing to change: give --target (one or more) or --description");
            }
            let update = ModelRouteUpdate {
                description,
                targets: Some(targets).filter(|targets| !targets.is_empty()),
            };
            let route = client
                .update_route(&name, &update)
                .await
                .map_err(explain)
                .with_context(|| format!("change model route {name}"))?;
            print_route(format, &route)
        }
        RoutesCommand::Delete { name } => {
            client
                .delete_route(&name)
                .await
                .map_err(explain)
                .with_context(|| format!("delete model route {name}"))?;
            println!("model route {name} deleted");
            Ok(())
        }
    }
}

/// A `--target` as written (see [`TARGET_HELP`]).
fn parse_target(spec: &str) -> Result<RouteTarget, String> {
    let mut rest = spec;
    let mut weight = None;
    let mut priority = None;
    // The options are the trailing `:KEY=VALUE` parts whose KEY is a word; what is
    // before them is the target, which may hold `:` itself (`llama3:8b`).
    while let Some((head, option)) = rest.rsplit_once(':') {
        let Some((key, value)) = option.split_once('=') else {
            break;
        };
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_lowercase()) {
            break;
        }
        let (slot, max) = match key {
            "weight" => (&mut weight, MAX_TARGET_WEIGHT),
            "priority" => (&mut priority, MAX_TARGET_PRIORITY),
            _ => {
                return Err(format!(
                    "unknown option {key:?}: a target takes :weight=N and :priority=N"
                ))
            }
        };
        if slot.is_some() {
            return Err(format!("{key} is given twice"));
        }
        let number: u32 = value.parse().ok().filter(|n| *n <= max).ok_or_else(|| {
            format!("{key} must be a whole number from 0 to {max}, not {value:?}")
        })?;
        *slot = Some(number);
        rest = head;
    }
    let (provider, model) = match rest.split_once('/') {
        Some((provider, model)) => {
            check_name("the provider", provider).map_err(|e| e.to_string())?;
            check_provider_model("the provider's model", model).map_err(|e| e.to_string())?;
            (Some(provider.to_owned()), model)
        }
        None => {
            if rest.contains(':') {
                return Err(format!(
                    "{rest:?} is no deployed model's name: write the options as :weight=N and \
                     :priority=N, and a provider's model as PROVIDER/MODEL"
                ));
            }
            check_name("the deployed model", rest).map_err(|e| e.to_string())?;
            (None, rest)
        }
    };
    Ok(RouteTarget {
        model: model.to_owned(),
        provider,
        weight: weight.unwrap_or(1),
        priority: priority.unwrap_or(0),
    })
}

/// A target as the tables show it: `hosted/gpt-4o-mini w=1 p=0`.
fn target_text(target: &RouteTarget) -> String {
    format!(
        "{} w={} p={}",
        target.label(),
        target.weight,
        target.priority
    )
}

fn targets_text(targets: &[RouteTarget]) -> String {
    let texts: Vec<String> = targets.iter().map(target_text).collect();
    texts.join(", ")
}

fn print_route(format: OutputFormat, route: &ModelRoute) -> anyhow::Result<()> {
    match format {
        OutputFormat::Json => print_json(route),
        OutputFormat::Table => {
            print!("{}", describe(route));
            Ok(())
        }
    }
}

fn table(routes: &[ModelRoute], now: Timestamp) -> Table {
    let mut table = Table::new(&["NAME", "TARGETS", "AGE"]);
    for route in routes {
        table.row(vec![
            route.name.clone(),
            targets_text(&route.targets),
            output::age(route.created_at, now),
        ]);
    }
    table
}

/// A route's fields, one per line.
fn describe(route: &ModelRoute) -> String {
    fields(&[
        ("NAME", route.name.clone()),
        (
            "DESCRIPTION",
            output::or_none(Some(&route.description).filter(|d| !d.is_empty())),
        ),
        ("TARGETS", targets_text(&route.targets)),
        ("CREATED", route.created_at.to_string()),
        ("UPDATED", route.updated_at.to_string()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(provider: Option<&str>, model: &str, weight: u32, priority: u32) -> RouteTarget {
        RouteTarget {
            model: model.into(),
            provider: provider.map(str::to_owned),
            weight,
            priority,
        }
    }

    #[test]
    fn a_target_is_a_deployed_model_or_a_providers_model_with_options() {
        for (spec, expected) in [
            ("tiny", target(None, "tiny", 1, 0)),
            ("tiny:weight=3", target(None, "tiny", 3, 0)),
            ("tiny:priority=2:weight=0", target(None, "tiny", 0, 2)),
            (
                "hosted/gpt-4o-mini",
                target(Some("hosted"), "gpt-4o-mini", 1, 0),
            ),
            // The first `/` ends the provider's name; the model id keeps the rest.
            (
                "hosted/meta-llama/Llama-3-8B:weight=2:priority=1",
                target(Some("hosted"), "meta-llama/Llama-3-8B", 2, 1),
            ),
            // A `:` that starts no KEY=N option belongs to the model id.
            (
                "ollama/llama3:8b:weight=5",
                target(Some("ollama"), "llama3:8b", 5, 0),
            ),
            (
                "ollama/llama3:8b",
                target(Some("ollama"), "llama3:8b", 1, 0),
            ),
        ] {
            assert_eq!(parse_target(spec), Ok(expected), "{spec}");
        }
    }

    #[test]
    fn malformed_targets_say_what_is_wrong() {
        for (spec, says) in [
            ("", "the deployed model"),
            ("tiny:weight=x", "weight must be a whole number"),
            ("tiny:weight=-1", "weight must be a whole number"),
            ("tiny:weight=10001", "from 0 to 10000"),
            ("tiny:priority=101", "from 0 to 100"),
            ("tiny:weight=1:weight=2", "weight is given twice"),
            ("tiny:wieght=2", "unknown option \"wieght\""),
            ("tiny:3", "no deployed model's name"),
            ("Tiny", "the deployed model"),
            ("/gpt-4o", "the provider"),
            ("hosted/", "the provider's model"),
            ("hosted/:weight=2", "the provider's model"),
            ("Hosted/gpt-4o", "the provider"),
        ] {
            let error = parse_target(spec).expect_err(spec);
            assert!(error.contains(says), "{spec}: {error}");
        }
    }

    #[test]
    fn tables_show_targets_with_their_weight_and_priority() {
        let targets = [
            target(None, "tiny", 3, 0),
            target(Some("hosted"), "meta-llama/Llama-3-8B", 1, 1),
        ];
        assert_eq!(
            targets_text(&targets),
            "tiny w=3 p=0, hosted/meta-llama/Llama-3-8B w=1 p=1"
        );
    }

    #[test]
    fn a_bad_target_on_the_command_line_names_the_flag() {
        let error = crate::config::cli::parse_from([
            "gantry",
            "routes",
            "add",
            "chat",
            "--target",
            "tiny:weight=x",
        ])
        .expect_err("a bad target is refused");
        let text = error.to_string();
        assert!(
            text.contains("--target") && text.contains("weight must be"),
            "{text}"
        );
    }
}
