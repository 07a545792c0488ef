//! The command line, built from the key table with clap's builder: each command gets a
//! flag for every key it reads (`--key-name`, plus the table's other spellings), and
//! `--help` shows each key's doc, default and environment variable. Flags only collect
//! raw text; the table's kinds parse it, whatever the source, in [`super::Layers`].
//! The client commands (`gantry login`, `models`, `chat`, …) are declared in
//! [`crate::cli`] and merged in; they read no keys.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Arg, ArgAction, Command, FromArgMatches, Subcommand};

use crate::cli::ClientCommand;

use super::{DefaultText, Key, Scope, KEYS};

/// The `--config` argument's id; it names the file, so it is no key of the table.
const CONFIG: &str = "config";

/// Which parts run in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `gantry server`.
    Server,
    /// `gantry worker`.
    Worker,
    /// `gantry start`: a server and a worker joined to it.
    Both,
}

impl Role {
    /// The commands that run each role, with what `--help` says of them.
    const COMMANDS: [(Role, &'static str, &'static str); 3] = [
        (
            Role::Server,
            "server",
            "Run a server: management API, scheduler and gateway.",
        ),
        (
            Role::Worker,
            "worker",
            "Run a worker: join the servers, report this machine's GPUs, run model instances.",
        ),
        (
            Role::Both,
            "start",
            "Run a server and a worker in one process, for a one-machine cluster \
             (embedded SQLite by default).",
        ),
    ];

    /// Whether this role's command reads keys of `scope`.
    fn reads(self, scope: Scope) -> bool {
        matches!(
            (self, scope),
            (_, Scope::Global)
                | (Role::Both, _)
                | (Role::Server, Scope::Server)
                | (Role::Worker, Scope::Worker)
        )
    }
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Invocation {
    /// `gantry version`.
    Version,
    /// `gantry backend install NAME[@VERSION]`: installs a backend version into this
    /// machine's worker data directory (the worker's keys apply).
    BackendInstall {
        /// `llama.cpp`, `llama.cpp@11434.0.0`, `vllm@0.8.5`, …
        target: String,
        config_file: Option<PathBuf>,
        flags: BTreeMap<&'static str, String>,
    },
    /// `gantry backup --out FILE`: a consistent copy of the SQLite database, taken while
    /// the server runs (the server's keys apply).
    Backup {
        out: PathBuf,
        config_file: Option<PathBuf>,
        flags: BTreeMap<&'static str, String>,
    },
    /// `gantry restore --from FILE`: puts a backup in place of the SQLite database, with
    /// the server stopped.
    Restore {
        from: PathBuf,
        config_file: Option<PathBuf>,
        flags: BTreeMap<&'static str, String>,
    },
    /// A client command: `gantry login`, `models`, `chat`, …
    Client(ClientCommand),
    /// `gantry server`, `worker` or `start`.
    Run {
        role: Role,
        /// `--config FILE`, when given.
        config_file: Option<PathBuf>,
        /// The keys given as flags; the values of a repeated flag joined with commas.
        flags: BTreeMap<&'static str, String>,
    },
}

/// The whole command line.
pub fn command() -> Command {
    let root = Command::new("gantry")
        .about("Cluster manager for serving AI models on GPUs.")
        .version(env!("CARGO_PKG_VERSION"))
        .propagate_version(true)
        .subcommand_required(true)
        .arg_required_else_help(true)
        .arg(config_flag().global(true));
    let root = KEYS
        .iter()
        .filter(|key| key.scope == Scope::Global)
        .fold(root, |command, key| command.arg(flag(key).global(true)));
    let root = Role::COMMANDS
        .iter()
        .fold(root, |root, (role, name, about)| {
            let command = KEYS
                .iter()
                .filter(|key| key.scope != Scope::Global && role.reads(key.scope))
                .fold(Command::new(*name).about(*about), |command, key| {
                    command.arg(flag(key))
                });
            root.subcommand(command)
        })
        .subcommand(Command::new("version").about("Print the version."))
        .subcommand(
            KEYS.iter().filter(|key| key.scope == Scope::Server).fold(
                Command::new("backup")
                    .about(
                        "Write a consistent copy of the embedded SQLite database to a new \
                         file, while the server runs (PostgreSQL: use pg_dump).",
                    )
                    .arg(
                        Arg::new("out")
                            .long("out")
                            .required(true)
                            .value_name("FILE")
                            .value_parser(clap::value_parser!(PathBuf))
                            .help("The backup file to write; it must not exist"),
                    ),
                |command, key| command.arg(flag(key)),
            ),
        )
        .subcommand(
            KEYS.iter().filter(|key| key.scope == Scope::Server).fold(
                Command::new("restore")
                    .about(
                        "Put a backup from `gantry backup` in place of the SQLite database; the \
                         server must be stopped. The database it replaces is kept beside it.",
                    )
                    .arg(
                        Arg::new("from")
                            .long("from")
                            .required(true)
                            .value_name("FILE")
                            .value_parser(clap::value_parser!(PathBuf))
                            .help("The backup file to restore"),
                    ),
                |command, key| command.arg(flag(key)),
            ),
        )
        .subcommand(
            Command::new("backend")
                .about("Manage the inference backends installed on this machine.")
                .subcommand_required(true)
                .subcommand(
                    KEYS.iter().filter(|key| key.scope == Scope::Worker).fold(
                        Command::new("install")
                            .about(
                                "Install a backend version for this machine's worker \
                                     (llama.cpp built from source, vLLM or SGLang in a virtual \
                                     environment), ahead of the models that need it; prints \
                                     its directory.",
                            )
                            .arg(
                                Arg::new("target")
                                    .required(true)
                                    .value_name("NAME[@VERSION]")
                                    .help("llama.cpp, vllm or sglang, optionally with a version"),
                            ),
                        |command, key| command.arg(flag(key)),
                    ),
                ),
        );
    // Taken from a command of their own: augmenting the root would give it the enum's
    // doc as its `about`.
    let client = ClientCommand::augment_subcommands(Command::new("gantry"));
    let root = client
        .get_subcommands()
        .fold(root, |root, command| root.subcommand(command.clone()));
    without_key_flags(root)
}

/// `--config FILE`.
fn config_flag() -> Arg {
    Arg::new(CONFIG)
        .long("config")
        .value_name("FILE")
        .value_parser(clap::value_parser!(PathBuf))
        .display_order(0)
        .help("YAML configuration file holding any of the keys [env: GANTRY_CONFIG]")
}

/// The client commands with the global key flags hidden: clap gives every command the
/// root's global flags, but a command that already has a flag keeps its own, so each
/// client command gets hidden ones (global, for its subcommands) and its `--help` lists
/// only what it reads.
fn without_key_flags(root: Command) -> Command {
    let client_commands: Vec<String> = root
        .get_subcommands()
        .map(|command| command.get_name().to_owned())
        .filter(|name| ClientCommand::has_subcommand(name))
        .collect();
    client_commands.iter().fold(root, |root, name| {
        root.mut_subcommand(name, |command| {
            KEYS.iter().filter(|key| key.scope == Scope::Global).fold(
                command.arg(config_flag().global(true).hide(true)),
                |command, key| command.arg(flag(key).global(true).hide(true)),
            )
        })
    })
}

/// The flag of one key. `--help` lists flags in the table's order, under a heading per
/// scope (global flags first, under clap's "Options").
fn flag(key: &Key) -> Arg {
    let value_name = key
        .value_name
        .map_or_else(|| key.name.to_uppercase(), str::to_owned);
    let position = KEYS
        .iter()
        .position(|k| k.name == key.name)
        .expect("flags are made for keys of the table");
    let heading = match key.scope {
        Scope::Global => None,
        Scope::Server => Some("Server options"),
        Scope::Worker => Some("Worker options"),
    };
    Arg::new(key.name)
        .long(key.flag())
        .visible_aliases(key.also.iter().copied())
        .value_name(value_name)
        .help(help(key))
        .help_heading(heading)
        // After --config (0).
        .display_order(position + 1)
        .action(if key.list {
            ArgAction::Append
        } else {
            ArgAction::Set
        })
}

/// The `--help` line of one key: its doc, default and variable.
fn help(key: &Key) -> String {
    let mut help = key.plain_doc();
    match (key.default)() {
        DefaultText::Nothing => {}
        DefaultText::Value(value) => help.push_str(&format!(" [default: {value}]")),
        DefaultText::Described(words) => {
            help.push_str(&format!(" [default: {}]", words.replace('`', "")));
        }
    }
    if key.list {
        help.push_str(" [repeatable]");
    }
    help.push_str(&format!(" [env: {}]", key.env_var()));
    help
}

/// Reads the command line. `Err` is clap's: a usage error, or the help or version text
/// that was asked for; `clap::Error::exit` prints it.
pub fn parse_from<I, T>(args: I) -> Result<Invocation, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let root = command().try_get_matches_from(args)?;
    let (name, matches) = root
        .subcommand()
        .expect("clap requires a command (subcommand_required)");
    if ClientCommand::has_subcommand(name) {
        return ClientCommand::from_arg_matches(&root).map(Invocation::Client);
    }
    if name == "backup" || name == "restore" {
        let file = |arg: &str| matches.get_one::<PathBuf>(arg).cloned().unwrap_or_default();
        let config_file = matches.get_one::<PathBuf>(CONFIG).cloned();
        let flags = flags_of(matches, Role::Server);
        return Ok(if name == "backup" {
            Invocation::Backup {
                out: file("out"),
                config_file,
                flags,
            }
        } else {
            Invocation::Restore {
                from: file("from"),
                config_file,
                flags,
            }
        });
    }
    if name == "backend" {
        let (_, install) = matches
            .subcommand()
            .expect("clap requires a backend command (subcommand_required)");
        return Ok(Invocation::BackendInstall {
            target: install
                .get_one::<String>("target")
                .cloned()
                .unwrap_or_default(),
            config_file: install.get_one::<PathBuf>(CONFIG).cloned(),
            flags: flags_of(install, Role::Worker),
        });
    }
    let Some((role, _, _)) = Role::COMMANDS
        .iter()
        .find(|(_, command, _)| *command == name)
    else {
        return Ok(Invocation::Version);
    };
    Ok(Invocation::Run {
        role: *role,
        config_file: matches.get_one::<PathBuf>(CONFIG).cloned(),
        flags: flags_of(matches, *role),
    })
}

/// The keys `role` reads that were given as flags. Global flags are propagated into the
/// command's matches, wherever they were given.
fn flags_of(matches: &clap::ArgMatches, role: Role) -> BTreeMap<&'static str, String> {
    KEYS.iter()
        .filter(|key| role.reads(key.scope))
        .filter_map(|key| {
            let values: Vec<&str> = matches
                .get_many::<String>(key.name)?
                .map(String::as_str)
                .collect();
            Some((key.name, values.join(",")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> (Role, Option<PathBuf>, BTreeMap<&'static str, String>) {
        match parse_from(std::iter::once("gantry").chain(args.iter().copied())) {
            Ok(Invocation::Run {
                role,
                config_file,
                flags,
            }) => (role, config_file, flags),
            other => panic!("{args:?} should run a role: {other:?}"),
        }
    }

    #[test]
    fn backend_install_reads_its_target_and_the_worker_keys() {
        match parse_from([
            "gantry",
            "backend",
            "install",
            "llama.cpp@11434.0.0",
            "--data-dir",
            "/srv/gantry",
            "--backend-cache-dir",
            "/cache",
        ]) {
            Ok(Invocation::BackendInstall { target, flags, .. }) => {
                assert_eq!(target, "llama.cpp@11434.0.0");
                assert_eq!(flags["data_dir"], "/srv/gantry");
                assert_eq!(flags["backend_cache_dir"], "/cache");
            }
            other => panic!("{other:?}"),
        }
        assert!(parse_from(["gantry", "backend", "install"]).is_err());
        assert!(parse_from(["gantry", "backend", "install", "x", "--database-url", "y"]).is_err());
    }

    #[test]
    fn the_command_line_is_consistent() {
        command().debug_assert();
    }

    #[test]
    fn every_key_has_a_flag_on_each_command_that_reads_it() {
        for (role, name, _) in Role::COMMANDS {
            for key in KEYS.iter().filter(|key| role.reads(key.scope)) {
                let flag = format!("--{}", key.flag());
                let (_, _, flags) = run(&[name, &flag, "x"]);
                assert_eq!(
                    flags.get(key.name).map(String::as_str),
                    Some("x"),
                    "{name} {flag}"
                );
            }
        }
    }

    #[test]
    fn commands_refuse_flags_of_other_commands() {
        assert!(parse_from(["gantry", "worker", "--database-url", "postgres://x"]).is_err());
        assert!(parse_from(["gantry", "server", "--port-range", "1-2"]).is_err());
    }

    #[test]
    fn todays_flag_spellings_keep_working() {
        let (role, _, flags) = run(&[
            "worker",
            "--server-url",
            "http://a:8080",
            "--server-url",
            "http://b:8080",
            "--name",
            "w1",
            "--label",
            "gpu=a100",
            "--label",
            "zone=eu-1",
            "--token",
            "gantryreg_x",
        ]);
        assert_eq!(role, Role::Worker);
        assert_eq!(flags["server_urls"], "http://a:8080,http://b:8080");
        assert_eq!(flags["worker_name"], "w1");
        assert_eq!(flags["labels"], "gpu=a100,zone=eu-1");
        assert_eq!(flags["token"], "gantryreg_x");
        let (_, _, flags) = run(&["server", "--server-urls", "http://a:8080"]);
        assert_eq!(flags["server_urls"], "http://a:8080");
    }

    #[test]
    fn global_flags_work_before_and_after_the_command() {
        let (role, config, flags) = run(&[
            "--data-dir",
            "/tmp/g",
            "--config",
            "/etc/gantry.yaml",
            "start",
            "--heartbeat-interval",
            "5s",
            "--port",
            "0",
        ]);
        assert_eq!(role, Role::Both);
        assert_eq!(config, Some(PathBuf::from("/etc/gantry.yaml")));
        assert_eq!(flags["data_dir"], "/tmp/g");
        assert_eq!(flags["heartbeat_interval"], "5s");
        assert_eq!(flags["port"], "0");
    }

    #[test]
    fn a_single_value_flag_may_not_repeat() {
        assert!(parse_from(["gantry", "server", "--port", "1", "--port", "2"]).is_err());
    }

    fn help_of(command_name: &str) -> String {
        let asked = command().try_get_matches_from(["gantry", command_name, "--help"]);
        let help = asked.expect_err("--help ends parsing with the help text");
        assert_eq!(help.kind(), clap::error::ErrorKind::DisplayHelp);
        help.to_string()
    }

    #[test]
    fn help_shows_each_keys_doc_default_and_variable() {
        let help = help_of("server");
        for needle in [
            "--heartbeat-interval <DURATION>",
            "Interval of worker heartbeats; servers expect it too. [default: 15s] [env: GANTRY_HEARTBEAT_INTERVAL]",
            "--max-request-body <SIZE>",
            "[default: 1MiB]",
            "[default: SQLite file in data_dir]",
            "--scheduling-mode <MODE>",
            "--lease-ttl <DURATION>",
        ] {
            assert!(help.contains(needle), "{needle:?} missing from:\n{help}");
        }
        let worker = help_of("worker");
        assert!(worker.contains("[alias: --name]"), "{worker}");
        assert!(worker.contains("[default: 40000-40999]"), "{worker}");
    }

    #[test]
    fn version_is_a_command() {
        assert!(matches!(
            parse_from(["gantry", "version"]),
            Ok(Invocation::Version)
        ));
    }
}
