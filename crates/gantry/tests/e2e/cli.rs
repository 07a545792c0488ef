//! The command line client (`gantry login`, `models`, `instances`, `workers`, `clusters`,
//! `pools`, `keys`, `providers`, `routes`, `chat`, `completions`, `logout`) as a user runs
//! it: the built `gantry` binary as a child process, with its own `HOME` and
//! `XDG_CONFIG_HOME`, against a real server — and, for the models and the chat, a real
//! worker running the tiny model with a real `llama-server`; for worker pools, an `exec`
//! program in the server's `pool_commands_dir`. The cluster's state is checked through the
//! typed client.

use crate::common;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::common::{manual_model_body, manual_model_create, tiny_model, Cluster, ADMIN_PASSWORD};
use gantry_types::{
    ApiKey, ApiKeyQuery, ClusterRegistration, InstanceState, Model, ModelInstance, ModelProvider,
    ModelRoute, ProviderModels, RouteTarget, Worker, WorkerState, DEFAULT_CLUSTER_ID,
};

/// The `gantry` binary run as one user: a home and a configuration directory of its own,
/// and none of the variables that would point it elsewhere.
struct User {
    home: tempfile::TempDir,
}

impl User {
    fn new() -> Self {
        Self {
            home: tempfile::tempdir().unwrap(),
        }
    }

    fn config_dir(&self) -> PathBuf {
        self.home.path().join("config")
    }

    /// Where `gantry login` saves the login.
    fn login_file(&self) -> PathBuf {
        self.config_dir().join("gantry/cli.json")
    }

    fn command(&self, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_gantry"));
        command
            .args(args)
            .env("HOME", self.home.path())
            .env("XDG_CONFIG_HOME", self.config_dir())
            .env_remove("GANTRY_SERVER")
            .env_remove("GANTRY_API_KEY")
            .envs(env.iter().copied());
        command
    }

    /// Runs `gantry ARGS` with `stdin` as its standard input.
    fn run_with(&self, args: &[&str], env: &[(&str, &str)], stdin: &str) -> Output {
        let mut child = self
            .command(args, env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    }

    /// `gantry ARGS`, which must succeed; its standard output.
    fn ok(&self, args: &[&str]) -> String {
        self.ok_with(args, &[], "")
    }

    fn ok_with(&self, args: &[&str], env: &[(&str, &str)], stdin: &str) -> String {
        let output = self.run_with(args, env, stdin);
        let (stdout, stderr) = texts(&output);
        assert!(
            output.status.success(),
            "gantry {args:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
            output.status
        );
        stdout
    }

    /// `gantry ARGS`, which must fail with a non-zero status; its standard error.
    fn fails(&self, args: &[&str]) -> String {
        self.fails_with(args, &[], "")
    }

    fn fails_with(&self, args: &[&str], env: &[(&str, &str)], stdin: &str) -> String {
        let output = self.run_with(args, env, stdin);
        let (stdout, stderr) = texts(&output);
        assert!(
            !output.status.success() && output.status.code().is_some_and(|code| code != 0),
            "gantry {args:?} should fail:\nstdout:\n{stdout}\nstderr:\n{stderr}"
        );
        stderr
    }

    /// `gantry ARGS -o json`, parsed.
    fn json<T: serde::de::DeserializeOwned>(&self, args: &[&str]) -> T {
        let mut args = args.to_vec();
        args.extend(["-o", "json"]);
        let stdout = self.ok(&args);
        serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("gantry {args:?} printed no JSON ({e}):\n{stdout}"))
    }

    /// `gantry login BASE` as the admin, the password on standard input.
    fn login(&self, base: &str) {
        self.ok_with(
            &["login", base, "--username", "admin", "--password-stdin"],
            &[],
            &format!("{ADMIN_PASSWORD}\n"),
        );
    }
}

fn texts(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// The ids of API keys named `name`, as the admin sees them.
async fn keys_named(cluster: &Cluster, name: &str) -> Vec<i64> {
    let keys = cluster
        .client()
        .list_api_keys(&ApiKeyQuery::default())
        .await
        .unwrap();
    keys.items
        .iter()
        .filter(|key| key.name.starts_with(name))
        .map(|key| key.id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_saves_a_private_key_that_the_commands_use_until_logout() {
    let cluster = Cluster::start(&[]).await;
    let user = User::new();
    let base = cluster.base.as_str();

    // Before any login: a clear line and a failure, for every command that calls the API.
    for command in [
        &["models", "ls"][..],
        &["workers", "ls"],
        &["chat", "tiny", "hi"],
    ] {
        let error = user.fails(command);
        assert!(
            error.contains("not logged in: run gantry login SERVER first"),
            "{command:?}: {error}"
        );
    }

    // A wrong password: the server's message, and nothing saved.
    let error = user.fails_with(
        &["login", base, "--username", "admin", "--password-stdin"],
        &[],
        "not-the-password\n",
    );
    assert!(error.contains("invalid username or password"), "{error}");
    assert!(!error.contains("saved token"), "{error}");
    assert!(!user.login_file().exists());
    let error = user.fails(&[
        "login",
        "127.0.0.1:1",
        "--username",
        "admin",
        "--password-stdin",
    ]);
    assert!(error.contains("with its scheme"), "{error}");

    // Login saves the server and an API key, readable by the user alone.
    user.login(base);
    let file = user.login_file();
    assert_eq!(mode(&file), 0o600);
    assert_eq!(mode(file.parent().unwrap()), 0o700);
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(saved["server"], base);
    assert_eq!(saved["username"], "admin");
    assert!(
        saved["token"].as_str().unwrap().starts_with("gantry_"),
        "{saved}"
    );
    assert_eq!(keys_named(&cluster, "cli-").await.len(), 1);
    // Logging in again replaces the previous login's key.
    user.login(base);
    assert_eq!(keys_named(&cluster, "cli-").await.len(), 1);

    // Keys: created (shown once), listed, used, deleted.
    let table = user.ok(&["keys", "create", "ci-table", "--expires-in-days", "30"]);
    assert!(
        table.contains("KEY") && table.contains("gantry_"),
        "{table}"
    );
    let created: serde_json::Value = user.json(&["keys", "create", "ci"]);
    let key = created["key"].as_str().unwrap().to_owned();
    let id = created["id"].as_i64().unwrap();
    let listed = user.ok(&["keys", "ls"]);
    for name in ["ci-table", "cli-", "ACCESS KEY"] {
        assert!(listed.contains(name), "{name} missing from:\n{listed}");
    }
    let keys: Vec<ApiKey> = user.json(&["keys", "ls"]);
    assert!(
        keys.iter().any(|k| k.id == id && k.name == "ci"),
        "{keys:?}"
    );
    // GANTRY_API_KEY and --token override the saved key; GANTRY_SERVER and --server the URL.
    let elsewhere = User::new();
    elsewhere.ok_with(
        &["workers", "ls"],
        &[("GANTRY_SERVER", base), ("GANTRY_API_KEY", &key)],
        "",
    );
    elsewhere.ok(&["workers", "ls", "--server", base, "--token", &key]);
    let removed = user.ok(&["keys", "rm", &id.to_string()]);
    assert!(removed.contains("deleted"), "{removed}");
    let keys: Vec<ApiKey> = user.json(&["keys", "ls"]);
    assert!(keys.iter().all(|k| k.id != id), "{keys:?}");
    let error = elsewhere.fails(&["workers", "ls", "--server", base, "--token", &key]);
    assert!(error.contains("unauthorized"), "{error}");
    let error = user.fails(&["keys", "rm", &id.to_string()]);
    assert!(error.contains("not_found"), "{error}");

    // Completions: a script the shell understands, naming the commands.
    let bash = user.ok(&["completions", "bash"]);
    assert!(
        bash.contains("_gantry()") && bash.contains("complete -F _gantry"),
        "{bash}"
    );
    for command in ["login", "models", "instances", "chat"] {
        assert!(
            bash.contains(command),
            "{command} missing from the bash completions"
        );
    }
    assert!(user.ok(&["completions", "zsh"]).contains("#compdef gantry"));
    assert!(user
        .ok(&["completions", "fish"])
        .contains("complete -c gantry"));

    // Logout deletes the key it made and forgets the login.
    let cli_key = keys_named(&cluster, "cli-").await;
    user.ok(&["logout"]);
    assert!(!file.exists());
    assert!(
        keys_named(&cluster, "cli-").await.is_empty(),
        "{cli_key:?} survived logout"
    );
    let error = user.fails(&["models", "ls"]);
    assert!(error.contains("run gantry login SERVER first"), "{error}");
    // Logging out twice is harmless.
    user.ok(&["logout"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_instances_workers_and_a_streamed_chat_through_a_real_worker() {
    let cluster = Cluster::start(&[]).await;
    let worker = cluster.worker("w1", &[]);
    cluster.worker_id("w1", &worker).await;
    let dir = tempfile::tempdir().unwrap();
    let model_path = tiny_model(dir.path());
    let user = User::new();
    user.login(&cluster.base);

    let workers = user.ok(&["workers", "ls"]);
    assert!(
        workers.contains("w1") && workers.contains("ready"),
        "{workers}"
    );
    let workers: Vec<Worker> = user.json(&["workers", "ls"]);
    assert_eq!(workers.len(), 1);
    assert_eq!(workers[0].name, "w1");

    // A model from flags, which the scheduler places on the worker …
    let created = user.ok(&[
        "models",
        "create",
        "--name",
        "tiny",
        "--source",
        &model_path.display().to_string(),
        "--backend-args",
        "-c 256 -t 1 -tb 1 -np 1",
    ]);
    assert!(
        created.contains("tiny") && created.contains("REPLICAS"),
        "{created}"
    );
    // … and one from a file, whose selector matches no worker, so it stays pending.
    let body = dir.path().join("other.json");
    std::fs::write(
        &body,
        manual_model_body("other", &model_path, 1).to_string(),
    )
    .unwrap();
    user.ok(&["models", "create", "-f", &body.display().to_string()]);
    let error = user.fails(&[
        "models",
        "create",
        "--name",
        "tiny",
        "--source",
        &model_path.display().to_string(),
    ]);
    assert!(error.contains("conflict"), "{error}");

    let models: Vec<Model> = user.json(&["models", "ls"]);
    let names: Vec<&str> = models.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["tiny", "other"]);
    assert_eq!(
        models[0].backend_args,
        ["-c", "256", "-t", "1", "-tb", "1", "-np", "1"]
    );
    let tiny: Model = user.json(&["models", "get", "tiny"]);
    assert_eq!(tiny.id, models[0].id);

    let running = cluster
        .wait_instances(tiny.id, "running", Duration::from_secs(60), |instances| {
            instances.len() == 1 && instances[0].state == InstanceState::Running
        })
        .await;
    let instance_id = running[0].id;
    let listed = user.ok(&["models", "ls"]);
    let tiny_line = listed.lines().find(|l| l.contains("tiny")).unwrap();
    assert!(tiny_line.contains("1/1"), "{listed}");
    let shown = user.ok(&["models", "get", "tiny"]);
    assert!(shown.contains("running") && shown.contains("w1"), "{shown}");

    // Instances: all, or a model's.
    let all: Vec<ModelInstance> = user.json(&["instances", "ls"]);
    assert_eq!(all.len(), 2);
    let only_tiny = user.ok(&["instances", "ls", "--model", "tiny"]);
    assert!(
        only_tiny.contains("running") && !only_tiny.contains("other-"),
        "{only_tiny}"
    );
    let logs = user.ok(&["instances", "logs", &instance_id.to_string(), "--tail", "5"]);
    assert!(!logs.trim().is_empty());
    follow_logs_until_interrupted(&user, instance_id);

    // Scaling and addressing models by name.
    let scaled = user.ok(&["models", "scale", "other", "3"]);
    assert!(scaled.contains("scaled to 3"), "{scaled}");
    let other = cluster.client().get_model(models[1].id).await.unwrap();
    assert_eq!(other.replicas, 3);
    for command in [
        &["models", "get", "nope"][..],
        &["models", "scale", "nope", "2"],
        &["models", "rm", "nope"],
        &["instances", "ls", "--model", "nope"],
    ] {
        let error = user.fails(command);
        assert!(
            error.contains("no model named \"nope\""),
            "{command:?}: {error}"
        );
    }

    // Chat: one prompt, streamed to standard output. A model of random weights may end
    // its answer at once now and then, so an empty answer is asked again.
    let mut answer = String::new();
    for _ in 0..3 {
        answer = user.ok(&["chat", "tiny", "hello", "--max-tokens", "12"]);
        if !answer.trim_end_matches('\n').is_empty() {
            break;
        }
    }
    assert!(
        !answer.trim_end_matches('\n').is_empty(),
        "no answer was printed"
    );
    // A conversation from standard input: one answer per line.
    let conversation = user.ok_with(
        &["chat", "tiny", "--max-tokens", "4"],
        &[],
        "hello\n\nand again\n",
    );
    assert!(!conversation.is_empty());
    let error = user.fails(&["chat", "nope", "hi"]);
    assert!(error.contains("the model `nope` does not exist"), "{error}");

    let deleted = user.ok(&["models", "rm", "tiny"]);
    assert!(deleted.contains("deleted"), "{deleted}");
    let models: Vec<Model> = user.json(&["models", "ls"]);
    assert_eq!(models.len(), 1);
    assert_eq!(models[0].name, "other");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn providers_routes_and_key_limits_from_the_command_line() {
    let cluster = Cluster::start(&[]).await;
    let dir = tempfile::tempdir().unwrap();
    // A deployed model for the routes' local target: with no worker it stays pending,
    // which is enough for a route to name it.
    cluster
        .client()
        .create_model(&manual_model_create("tiny", &tiny_model(dir.path()), 1))
        .await
        .unwrap();
    let user = User::new();
    user.login(&cluster.base);

    // The provider is this cluster's own gateway, with a key of the cluster as its API
    // key: then `providers models` has something to ask.
    let created: serde_json::Value = user.json(&["keys", "create", "as-provider"]);
    let provider_key = created["key"].as_str().unwrap().to_owned();
    let secret = provider_key.rsplit('_').next().unwrap().to_owned();
    let provider_base = format!("{}/v1", cluster.base);
    let error = user.fails(&[
        "providers",
        "add",
        "hosted",
        "--base-url",
        &provider_base,
        "--api-key-env",
        "GANTRY_TEST_UNSET_VARIABLE",
    ]);
    assert!(
        error.contains("--api-key-env GANTRY_TEST_UNSET_VARIABLE: the variable is not set"),
        "{error}"
    );
    let error = user.fails(&["providers", "add", "hosted", "--base-url", "ftp://x/v1"]);
    assert!(error.contains("base_url"), "{error}");
    let shown = user.ok_with(
        &[
            "providers",
            "add",
            "hosted",
            "--base-url",
            &provider_base,
            "--api-key-env",
            "HOSTED_KEY",
            "--header",
            "X-Team=ml",
            "--timeout",
            "30",
        ],
        &[("HOSTED_KEY", &provider_key)],
        "",
    );
    assert!(
        shown.contains("API KEY") && shown.contains("set"),
        "{shown}"
    );
    let listed = user.ok(&["providers", "list", "-o", "json"]);
    assert!(
        !listed.contains(&provider_key) && !listed.contains(&secret),
        "the provider's key is shown:
{listed}"
    );
    let providers: Vec<ModelProvider> = serde_json::from_str(&listed).unwrap();
    assert_eq!(providers.len(), 1);
    let hosted = &providers[0];
    assert_eq!(
        (
            hosted.name.as_str(),
            hosted.base_url.as_str(),
            hosted.has_api_key,
            hosted.timeout_seconds
        ),
        ("hosted", provider_base.as_str(), true, 30)
    );
    assert_eq!(hosted.headers["X-Team"], "ml");
    let table = user.ok(&["providers", "ls"]);
    assert!(
        table.contains("hosted") && table.contains("set") && !table.contains(&secret),
        "{table}"
    );

    // A route to the local model and to a provider's model whose id holds `/`, with a
    // fallback behind them.
    let error = user.fails(&["routes", "add", "chat", "--target", "tiny:weight=x"]);
    assert!(
        error.contains("--target") && error.contains("weight must be a whole number"),
        "{error}"
    );
    let error = user.fails(&["routes", "add", "chat", "--target", "nope"]);
    assert!(error.contains("no deployed model is named"), "{error}");
    let shown = user.ok(&[
        "routes",
        "add",
        "chat",
        "--target",
        "tiny:weight=3",
        "--target",
        "hosted/meta-llama/Llama-3-8B",
        "--target",
        "hosted/gpt-4o:priority=1",
    ]);
    assert!(
        shown.contains("tiny w=3 p=0, hosted/meta-llama/Llama-3-8B w=1 p=0, hosted/gpt-4o w=1 p=1"),
        "{shown}"
    );
    let stored = cluster.client().get_route("chat").await.unwrap();
    assert_eq!(
        stored.targets[1],
        RouteTarget {
            model: "meta-llama/Llama-3-8B".into(),
            provider: Some("hosted".into()),
            weight: 1,
            priority: 0,
        }
    );
    // Editing a weight: --target gives the whole new list.
    let edited: ModelRoute = user.json(&[
        "routes",
        "edit",
        "chat",
        "--target",
        "tiny:weight=1",
        "--target",
        "hosted/meta-llama/Llama-3-8B:weight=2",
    ]);
    let weights: Vec<(String, u32)> = edited
        .targets
        .iter()
        .map(|t| (t.label(), t.weight))
        .collect();
    assert_eq!(
        weights,
        [
            ("tiny".to_owned(), 1),
            ("hosted/meta-llama/Llama-3-8B".to_owned(), 2)
        ]
    );
    let routes = user.ok(&["routes", "ls"]);
    assert!(
        routes.contains("chat")
            && routes.contains("tiny w=1 p=0, hosted/meta-llama/Llama-3-8B w=2 p=0"),
        "{routes}"
    );
    let error = user.fails(&["routes", "edit", "chat"]);
    assert!(error.contains("nothing to change"), "{error}");

    // The provider, asked with its key, lists what this cluster's gateway serves: the
    // route (once the gateway has taken it, within about a second).
    let mut found = ProviderModels {
        provider: String::new(),
        models: Vec::new(),
    };
    for _ in 0..50 {
        found = user.json(&["providers", "models", "hosted"]);
        if found.models.iter().any(|m| m == "chat") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(found.models.iter().any(|m| m == "chat"), "{found:?}");
    // Without its key the provider refuses: the provider's error, not an unreachable
    // server. The key comes back from standard input.
    user.ok(&["providers", "edit", "hosted", "--remove-api-key"]);
    assert!(
        !cluster
            .client()
            .get_provider("hosted")
            .await
            .unwrap()
            .has_api_key
    );
    let error = user.fails(&["providers", "models", "hosted"]);
    assert!(
        error.contains("provider_error") && !error.contains("cannot reach the server"),
        "{error}"
    );
    user.ok_with(
        &["providers", "edit", "hosted", "--api-key-stdin"],
        &[],
        &format!("{provider_key}\n"),
    );
    assert!(
        cluster
            .client()
            .get_provider("hosted")
            .await
            .unwrap()
            .has_api_key
    );

    // Key limits: set at creation, changed, shown by `keys list`, lifted.
    let created: serde_json::Value = user.json(&[
        "keys",
        "create",
        "limited",
        "--rpm",
        "60",
        "--allow-route",
        "chat",
    ]);
    let id = created["id"].as_i64().unwrap().to_string();
    assert_eq!(created["requests_per_minute"], 60);
    let error = user.fails(&["keys", "limit", &id, "--rpm", "0"]);
    assert!(error.contains("--rpm"), "{error}");
    user.ok(&["keys", "limit", &id, "--rpm", "5", "--tpm", "1000"]);
    let listed = user.ok(&["keys", "list"]);
    let line = listed.lines().find(|l| l.contains("limited")).unwrap();
    let header = listed.lines().next().unwrap();
    assert!(
        header.contains("ROUTES") && header.contains("RPM") && header.contains("TPM"),
        "{listed}"
    );
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert!(
        cells.ends_with(&["chat", "5", "1000", cells[cells.len() - 1]]),
        "{listed}"
    );
    let keys: Vec<ApiKey> = user.json(&["keys", "ls"]);
    let limited = keys.iter().find(|k| k.name == "limited").unwrap();
    assert_eq!(limited.limits.requests_per_minute, Some(5));
    assert_eq!(limited.limits.tokens_per_minute, Some(1000));
    assert_eq!(limited.limits.allowed_routes, Some(vec!["chat".to_owned()]));
    let lifted: ApiKey = user.json(&["keys", "limit", &id, "--no-rpm", "--any-route"]);
    assert_eq!(lifted.limits.requests_per_minute, None);
    assert_eq!(lifted.limits.allowed_routes, None);
    assert_eq!(lifted.limits.tokens_per_minute, Some(1000));

    // A provider a route uses cannot go; the route first, then the provider.
    let error = user.fails(&["providers", "delete", "hosted"]);
    assert!(
        error.contains("conflict") && error.contains("chat"),
        "{error}"
    );
    assert!(user.ok(&["routes", "delete", "chat"]).contains("deleted"));
    assert!(user
        .ok(&["providers", "delete", "hosted"])
        .contains("deleted"));
    assert!(cluster.client().list_routes().await.unwrap().is_empty());
    assert!(cluster.client().list_providers().await.unwrap().is_empty());
    let error = user.fails(&["providers", "show", "hosted"]);
    assert!(error.contains("not_found"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusters_are_made_joined_deployed_into_and_guarded_from_the_command_line() {
    let cluster = Cluster::start(&[]).await;
    let dir = tempfile::tempdir().unwrap();
    let model_path = tiny_model(dir.path());
    let user = User::new();
    user.login(&cluster.base);

    // The default cluster is there from the start, and cannot go.
    let listed = user.ok(&["clusters", "ls"]);
    let header: Vec<&str> = listed.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["ID", "NAME", "PROVIDER", "STATE", "WORKERS", "GPUS", "MODELS", "DEFAULT", "AGE"]
    );
    assert!(
        listed.lines().nth(1).unwrap().starts_with("1   default"),
        "{listed}"
    );
    let error = user.fails(&["clusters", "delete", "default"]);
    assert!(
        error.contains("the default cluster cannot be deleted") && error.contains("conflict"),
        "{error}"
    );

    // A cluster, made once: a second of the name is refused.
    let shown = user.ok_with(
        &["clusters", "create", "east", "--description", "East racks"],
        &[],
        "",
    );
    assert!(
        shown.contains("NAME         east") && shown.contains("STATE        pending"),
        "{shown}"
    );
    let east: gantry_types::Cluster = user.json(&["clusters", "show", "east"]);
    assert_eq!(
        (east.description.as_str(), east.is_default),
        ("East racks", false)
    );
    let by_id: gantry_types::Cluster = user.json(&["clusters", "show", &east.id.to_string()]);
    assert_eq!(by_id.name, "east");
    let error = user.fails(&["clusters", "create", "east"]);
    assert!(error.contains("cluster east already exists"), "{error}");
    let error = user.fails(&["clusters", "show", "west"]);
    assert!(error.contains("no cluster named \"west\""), "{error}");

    // Its join command holds its own token; run with that token, a worker joins it.
    let command = user.ok(&["clusters", "join-command", "east"]);
    let token = command
        .trim()
        .strip_prefix(&format!(
            "gantry worker --server-url {} --token ",
            cluster.base
        ))
        .unwrap_or_else(|| panic!("not a join command: {command}"))
        .to_owned();
    assert_ne!(token, cluster.registration_token());
    let error = user.fails(&["clusters", "join-command", "east", "--manifests"]);
    assert!(
        error.contains("cluster east has no Kubernetes manifests: its provider is custom"),
        "{error}"
    );
    let worker = cluster.worker_with_token("e1", &token, &["--simulate-gpus", "1x8GiB"]);
    let worker_id = cluster.worker_id("e1", &worker).await;
    cluster
        .wait_for(
            "cluster east to count its worker ready",
            Duration::from_secs(30),
            || cluster.client().get_cluster(east.id),
            |c| c.counts.ready_workers == 1,
        )
        .await;
    let listed = user.ok(&["clusters", "ls"]);
    let line: Vec<&str> = listed
        .lines()
        .find(|l| l.contains("east"))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(
        &line[..8],
        [
            &east.id.to_string(),
            "east",
            "custom",
            "ready",
            "1/1",
            "1",
            "0",
            "-"
        ],
        "{listed}"
    );

    // Workers and models name their cluster, and list by it; a model goes into the
    // cluster named (its selector keeps it unplaced: placing is not what this is about).
    let workers = user.ok(&["workers", "ls"]);
    let e1 = workers.lines().find(|l| l.contains("e1")).unwrap();
    assert!(e1.split_whitespace().nth(2) == Some("east"), "{workers}");
    let only_east: Vec<Worker> = user.json(&["workers", "ls", "--cluster", "east"]);
    assert_eq!(
        only_east.iter().map(|w| w.id).collect::<Vec<_>>(),
        [worker_id]
    );
    let body = dir.path().join("in-east.json");
    std::fs::write(
        &body,
        manual_model_body("in-east", &model_path, 1).to_string(),
    )
    .unwrap();
    let created: Model = user.json(&[
        "models",
        "create",
        "-f",
        &body.display().to_string(),
        "--cluster",
        "east",
    ]);
    assert_eq!(created.cluster_id, east.id);
    let shown = user.ok(&["models", "get", "in-east"]);
    assert!(shown.contains("CLUSTER          east"), "{shown}");
    let error = user.fails(&[
        "models",
        "create",
        "--name",
        "lost",
        "--source",
        &model_path.display().to_string(),
        "--cluster",
        "west",
    ]);
    assert!(error.contains("no cluster named \"west\""), "{error}");
    let models = user.ok(&["models", "ls"]);
    let line = models.lines().find(|l| l.contains("in-east")).unwrap();
    assert_eq!(line.split_whitespace().nth(2), Some("east"), "{models}");
    let in_default: Vec<Model> = user.json(&["models", "ls", "--cluster", "default"]);
    assert!(in_default.is_empty(), "{in_default:?}");
    let in_east: Vec<Model> = user.json(&["models", "ls", "--cluster", &east.id.to_string()]);
    assert_eq!(in_east.len(), 1);

    // Not empty: the refusal names what is in it.
    let error = user.fails(&["clusters", "rm", "east"]);
    assert!(
        error.contains("conflict") && error.contains("e1") && error.contains("in-east"),
        "{error}"
    );

    // A rotated token says so on standard error; the joined worker keeps working.
    let rotated = user.run_with(&["clusters", "join-command", "east", "--rotate"], &[], "");
    let (stdout, stderr) = texts(&rotated);
    assert!(rotated.status.success(), "{stderr}");
    assert!(
        stderr.contains("rotated the registration token of cluster east")
            && stderr.contains("registered workers keep working"),
        "{stderr}"
    );
    assert!(
        stdout.starts_with("gantry worker") && !stdout.contains(&token),
        "{stdout}"
    );
    let registration: ClusterRegistration = user.json(&["clusters", "join-command", "east"]);
    assert_eq!(registration.command, stdout.trim());
    assert!(registration.kubernetes_manifests.is_none());
    let heartbeat = cluster.client().get_worker(worker_id).await.unwrap();
    cluster
        .wait_worker(
            worker_id,
            "heard from after the rotation",
            Duration::from_secs(30),
            |w| w.last_heartbeat_at > heartbeat.last_heartbeat_at && w.state == WorkerState::Ready,
        )
        .await;

    // A cluster renamed and made a Kubernetes one prints its manifests, with the image
    // asked for.
    let error = user.fails(&["clusters", "update", "east"]);
    assert!(error.contains("nothing to change"), "{error}");
    let updated: gantry_types::Cluster = user.json(&[
        "clusters",
        "update",
        "east",
        "--name",
        "gpu-nodes",
        "--provider",
        "kubernetes",
    ]);
    assert_eq!((updated.id, updated.name.as_str()), (east.id, "gpu-nodes"));
    let yaml = user.ok(&[
        "clusters",
        "join-command",
        "gpu-nodes",
        "--manifests",
        "--image",
        "registry.example.com/gantry:1.2",
    ]);
    assert!(
        yaml.contains("kind: DaemonSet")
            && yaml.contains("image: \"registry.example.com/gantry:1.2\"")
            && yaml.contains(&format!("token: \"{}\"", registration.token)),
        "{yaml}"
    );

    // Emptied, it goes.
    user.ok(&["models", "rm", "in-east"]);
    drop(worker);
    cluster.client().delete_worker(worker_id).await.unwrap();
    let deleted = user.ok(&["clusters", "delete", "gpu-nodes"]);
    assert_eq!(deleted.trim(), "cluster gpu-nodes deleted");
    let left: Vec<gantry_types::Cluster> = user.json(&["clusters", "ls"]);
    assert_eq!(
        left.iter().map(|c| c.id).collect::<Vec<_>>(),
        [DEFAULT_CLUSTER_ID]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_pools_are_made_shown_changed_and_deleted_from_the_command_line() {
    let cluster = Cluster::start(&["--pool-interval", "500ms"]).await;
    // The server runs only programs in its pool_commands_dir, <data dir>/pool-commands.
    let commands = cluster.dir.path().join("server/pool-commands");
    std::fs::create_dir_all(&commands).unwrap();
    // A cloud out of GPUs: every machine of the pool is refused in a provider's words.
    gantry_testkit::cloud::write_cloud_script(
        &commands.join("cloud.sh"),
        gantry_testkit::cloud::Cloud {
            fail_names_starting: Some(("burst", "out of capacity: no GPUs left in region lab-1")),
            ..Default::default()
        },
    );
    let user = User::new();
    user.login(&cluster.base);

    let listed = user.ok(&["pools", "ls"]);
    assert_eq!(
        listed.trim(),
        "NAME  CLUSTER  PROVIDER  GPUS  MIN  MAX  MACHINES"
    );

    // Made with its credentials on standard input: they are set, and shown nowhere.
    let create = [
        "pools",
        "create",
        "default",
        "burst",
        "--provider",
        "exec",
        "--command",
        "cloud.sh --region lab-1",
        "--region",
        "lab-1",
        "--gpus",
        "1x80GiB",
        "--memory",
        "64GiB",
        "--label",
        "tier=burst",
        "--min",
        "1",
        "--max",
        "2",
        "--scale-down-after",
        "30s",
        "--credentials-file",
        "-",
    ];
    let output = user.run_with(&create, &[], "lab-secret\n");
    let (stdout, stderr) = texts(&output);
    assert!(output.status.success(), "{stderr}");
    for line in [
        "NAME              burst",
        "CLUSTER           default",
        "COMMAND           cloud.sh --region lab-1",
        "LABELS            tier=burst",
        "CREDENTIALS       set",
    ] {
        assert!(stdout.contains(line), "no {line:?} in:\n{stdout}");
    }
    assert!(!stdout.contains("lab-secret"), "{stdout}");
    assert!(
        stderr.contains("gantry pools show default burst follows them"),
        "{stderr}"
    );
    let pools = cluster
        .client()
        .list_pools(DEFAULT_CLUSTER_ID)
        .await
        .unwrap();
    assert_eq!(pools.len(), 1);
    let pool = &pools[0];
    assert!(
        pool.has_credentials && pool.min == 1 && pool.max == 2,
        "{pool:?}"
    );

    // Refusals, in the server's words: a taken name, a program outside pool_commands_dir,
    // an exec pool without a command.
    let error = user.fails_with(&create, &[], "lab-secret\n");
    assert!(error.contains("conflict"), "{error}");
    let mut elsewhere = create.to_vec();
    elsewhere[3] = "elsewhere";
    elsewhere[7] = "missing.sh";
    let error = user.fails_with(&elsewhere, &[], "lab-secret\n");
    assert!(
        error.contains("validation_failed") && error.contains("pool-commands"),
        "{error}"
    );
    let error = user.fails(&[
        "pools",
        "create",
        "default",
        "nocommand",
        "--provider",
        "exec",
        "--gpus",
        "1x80GiB",
    ]);
    assert!(
        error.contains("command") && error.contains("validation_failed"),
        "{error}"
    );
    let error = user.fails(&["pools", "create", "default", "x", "--provider", "exec"]);
    assert!(error.contains("--gpus"), "{error}");

    // min 1: the leader asks for a machine at once; the provider's refusal is the
    // machine's message and a failed event.
    cluster
        .wait_for(
            "the pool's machine to fail with the provider's words",
            Duration::from_secs(30),
            || cluster.client().get_pool(DEFAULT_CLUSTER_ID, pool.id),
            |p| {
                p.machines
                    .iter()
                    .any(|m| m.state_message.contains("out of capacity"))
            },
        )
        .await;
    let shown = user.ok(&["pools", "show", "default", "burst"]);
    let machine = shown
        .lines()
        .find(|l| l.starts_with("burst-"))
        .unwrap_or_else(|| panic!("no machine in:\n{shown}"));
    assert!(
        machine.contains("provisioning")
            && machine.contains("creating machine failed")
            && machine.contains("out of capacity: no GPUs left in region lab-1"),
        "{shown}"
    );
    let failed = shown
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("failed"))
        .unwrap_or_else(|| panic!("no failed event in:\n{shown}"));
    assert!(failed.contains("out of capacity"), "{shown}");
    let events = user.ok(&["pools", "events", "default", &pool.id.to_string()]);
    assert_eq!(
        events
            .lines()
            .next()
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["AGE", "EVENT", "MESSAGE"]
    );
    assert!(events.contains("failed"), "{events}");
    let listed = user.ok(&["pools", "ls"]);
    let line: Vec<&str> = listed.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        line,
        ["burst", "default", "exec", "1x80GiB", "1", "2", "0/1"],
        "{listed}"
    );
    let in_default: Vec<gantry_types::WorkerPool> = user.json(&["pools", "ls", "--cluster", "1"]);
    assert_eq!(in_default.len(), 1);
    let error = user.fails(&["pools", "show", "default", "l4"]);
    assert!(
        error.contains("cluster default has no worker pool named \"l4\""),
        "{error}"
    );

    // Changed: bounds, labels, idle time and credentials from a file; nothing asked is
    // an error, and bounds that do not fit are refused by the server.
    let error = user.fails(&["pools", "update", "default", "burst"]);
    assert!(error.contains("nothing to change"), "{error}");
    let error = user.fails(&["pools", "update", "default", "burst", "--min", "3"]);
    assert!(
        error.contains("min") && error.contains("validation_failed"),
        "{error}"
    );
    let secret = cluster.dir.path().join("new-secret");
    std::fs::write(&secret, "lab-secret-2\n").unwrap();
    let updated: gantry_types::WorkerPool = user.json(&[
        "pools",
        "update",
        "default",
        "burst",
        "--max",
        "3",
        "--label",
        "tier=spot",
        "--scale-down-after",
        "1m",
        "--credentials-file",
        &secret.display().to_string(),
    ]);
    assert_eq!(
        (updated.min, updated.max, updated.scale_down_after.as_str()),
        (1, 3, "1m")
    );
    assert_eq!(updated.labels.get("tier").map(String::as_str), Some("spot"));
    assert!(updated.has_credentials);

    // Deleted: it says its machines go first; then the pool is gone.
    let deleted = user.ok(&["pools", "delete", "default", "burst"]);
    assert!(
        deleted.starts_with(
            "worker pool burst of cluster default deleted: its 1 machine(s) are being deleted"
        ),
        "{deleted}"
    );
    cluster
        .wait_for(
            "the deleted pool to go",
            Duration::from_secs(30),
            || cluster.client().list_pools(DEFAULT_CLUSTER_ID),
            |pools| pools.is_empty(),
        )
        .await;
    assert_eq!(user.ok(&["pools", "ls"]).lines().count(), 1);
}

/// `gantry instances logs ID -f` prints the log and keeps following until Ctrl-C
/// (SIGINT), which ends it with success.
fn follow_logs_until_interrupted(user: &User, instance_id: i64) {
    let mut child = user
        .command(
            &[
                "instances",
                "logs",
                &instance_id.to_string(),
                "-f",
                "--tail",
                "3",
            ],
            &[],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let (sender, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut first = [0u8; 256];
        let read = stdout.read(&mut first).unwrap_or(0);
        let _ = sender.send(read);
        // Drain the rest so the child never blocks on a full pipe.
        let _ = std::io::copy(&mut stdout, &mut std::io::sink());
    });
    let read = received
        .recv_timeout(Duration::from_secs(10))
        .expect("the followed log printed nothing within 10 s");
    assert!(read > 0);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        child.try_wait().unwrap().is_none(),
        "following the log ended by itself"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = common::wait_exit(&mut child, Duration::from_secs(10))
        .expect("the process did not end within 10 s");
    assert!(status.success(), "Ctrl-C ended the follow with {status}");
}
