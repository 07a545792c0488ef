//! A PostgreSQL server of one test's own, which the test can stop and start again (the
//! shared server of `scripts/with-postgres.sh` serves every other test at once, so it
//! must stay up).
//!
//! Made the way `scripts/with-postgres.sh` makes its server: `initdb` into a temporary
//! directory, `pg_ctl start` on a free loopback port, as the unprivileged user
//! `gantry-test` when run as root (PostgreSQL refuses to run as root). The binaries are
//! found in `GANTRY_TEST_PG_BIN` (which the script exports) or the newest
//! `/usr/lib/postgresql/*/bin`.

use std::path::PathBuf;
use std::process::Command;

/// The unprivileged user PostgreSQL runs as when the tests run as root.
const RUN_AS: &str = "gantry-test";

/// A PostgreSQL server in a temporary directory, stopped (immediately) when dropped.
#[derive(Debug)]
pub struct OwnPostgres {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    running: bool,
}

impl OwnPostgres {
    /// Creates the cluster and starts the server; panics with what is missing.
    pub fn start() -> Self {
        let bin = find_bin();
        let dir = tempfile::Builder::new()
            .prefix("gantry-own-pg")
            .tempdir()
            .expect("create a temporary directory");
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("open the temporary directory to the server's user");
        if nix::unistd::Uid::effective().is_root() {
            ensure_user();
            run(Command::new("chown").arg(RUN_AS).arg(dir.path()));
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("find a free port")
            .port();
        let mut server = Self {
            bin,
            dir,
            port,
            running: false,
        };
        let data = server.data();
        server.run_pg(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        server.start_again();
        server
    }

    /// `postgres://` URL of the server's `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Stops the server (fast shutdown: sessions are ended, as when an operator stops
    /// it), waiting until it is down.
    pub fn stop(&mut self) {
        let data = self.data();
        self.run_pg("pg_ctl", &["-D", &data, "-m", "fast", "-w", "stop"]);
        self.running = false;
    }

    /// Starts the stopped server again on the same port, waiting until it accepts.
    pub fn start_again(&mut self) {
        let (data, log) = (self.data(), self.path("server.log"));
        let options = format!(
            "-c listen_addresses=127.0.0.1 -p {} -k {} -c fsync=off -c synchronous_commit=off \
             -c full_page_writes=off -c max_connections=100",
            self.port,
            self.dir.path().display()
        );
        self.run_pg(
            "pg_ctl",
            &[
                "-D", &data, "-l", &log, "-w", "-t", "60", "-o", &options, "start",
            ],
        );
        self.running = true;
    }

    fn data(&self) -> String {
        self.path("data")
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// `program` of the server's binaries, run as the server's user.
    fn pg_command(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        if nix::unistd::Uid::effective().is_root() {
            let mut command = Command::new("runuser");
            command.args(["-u", RUN_AS, "--"]).arg(program);
            command
        } else {
            Command::new(program)
        }
    }

    fn run_pg(&self, program: &str, args: &[&str]) {
        let output = self
            .pg_command(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("run {program}: {e}"));
        assert!(
            output.status.success(),
            "{program} {args:?} failed: {}{}\nserver log:\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            std::fs::read_to_string(self.path("server.log")).unwrap_or_default()
        );
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        if self.running {
            let data = self.data();
            let _ = self
                .pg_command("pg_ctl")
                .args(["-D", &data, "-m", "immediate", "stop"])
                .output();
        }
    }
}

fn find_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("GANTRY_TEST_PG_BIN") {
        return PathBuf::from(bin);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("bin"))
        .filter(|bin| bin.join("initdb").exists() && bin.join("pg_ctl").exists())
        .collect();
    // Newest major version last.
    found.sort_by_key(|bin| {
        bin.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    found.pop().unwrap_or_else(|| {
        panic!(
            "no PostgreSQL server binaries under /usr/lib/postgresql: run the tests with \
             scripts/test.sh (it installs them), or set GANTRY_TEST_PG_BIN"
        )
    })
}

fn ensure_user() {
    let known = Command::new("id")
        .arg(RUN_AS)
        .output()
        .is_ok_and(|o| o.status.success());
    if !known {
        run(Command::new("useradd").args([
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            RUN_AS,
        ]));
    }
}

fn run(command: &mut Command) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("run {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
