//! `gantry login SERVER` and `gantry logout`.
//!
//! Login keeps an **API key**, not the session token. `POST /auth/login` answers with a
//! session that lasts a day (`session_ttl`) and ends early whenever the user logs out
//! anywhere (`POST /auth/logout` ends every session of its user) or changes the password;
//! an API key made with that session lasts until it is deleted, and works with both the
//! management API and the OpenAI-compatible gateway (`gantry chat`). So the command line
//! stays logged in for as long as the user wants, and `gantry logout` deletes the key,
//! which ends exactly this login and no other. Each login makes its own key, named
//! `cli-<host>-<time>` so that `gantry keys ls` tells them apart; logging in again to the
//! same server as the same user deletes the key of the previous login.

use std::io::{BufRead, BufReader, Write};

use anyhow::Context;
use clap::Args;
use gantry_client::Client;
use gantry_types::{ApiKeyCreate, ChangePasswordRequest, ErrorCode, Timestamp};

use super::config_file::SavedLogin;
use super::{explain, server_url};

#[derive(Debug, Args)]
pub struct LoginArgs {
    /// The server's URL, such as http://gantry.example:8080.
    #[arg(value_name = "SERVER")]
    server: String,
    /// The user to log in as (asked on the terminal when not given).
    #[arg(short = 'u', long)]
    username: Option<String>,
    /// Read the password from the first line of standard input instead of asking on the
    /// terminal (for scripts).
    #[arg(long)]
    password_stdin: bool,
}

pub async fn login(args: LoginArgs) -> anyhow::Result<()> {
    let url = server_url(&args.server)?;
    let username = match args.username {
        Some(username) => username,
        None if args.password_stdin => anyhow::bail!(
            "give --username with --password-stdin: standard input holds the password"
        ),
        None => Terminal::open()?.ask("Username: ")?,
    };
    let password = if args.password_stdin {
        password_from_stdin()?
    } else {
        Terminal::open()?.ask_secret("Password: ")?
    };
    let anonymous = Client::new(url.clone());
    let session = anonymous
        .login(&username, &password)
        .await
        // The server's own words ("invalid username or password"), without the hint of a
        // stale saved token that `explain` gives other calls.
        .map_err(|e| match e.message() {
            Some(message) => anyhow::anyhow!("{message}"),
            None => explain(e),
        })
        .with_context(|| format!("log in to {url} as {username}"))?;
    let mut client = anonymous.for_token(session.token);
    if session.user.require_password_change {
        if args.password_stdin {
            anyhow::bail!(
                "{username} must change the password before anything else: run gantry login \
                 {url} on a terminal, or change it in the web console"
            );
        }
        client = change_password(&client, password).await?;
    }
    let key = client
        .create_api_key(&ApiKeyCreate {
            name: key_name(&gantry_worker::system::hostname(), Timestamp::now()),
            description: format!("gantry login of {username}"),
            expires_in_days: None,
            ..Default::default()
        })
        .await
        .map_err(explain)
        .context("create an API key for the command line")?;
    let previous = SavedLogin::load().ok().flatten();
    let saved = SavedLogin {
        server: url.clone(),
        token: key.key,
        username: username.clone(),
        api_key_id: Some(key.api_key.id),
    };
    let path = saved.save()?;
    if let Some(SavedLogin {
        server,
        username: previous_user,
        api_key_id: Some(id),
        ..
    }) = previous
    {
        if server == url && previous_user == username {
            // The previous login's key is this one's predecessor; a failure only leaves
            // an unused key behind, which `gantry keys ls` shows.
            if let Err(e) = client.delete_api_key(id).await {
                if e.status() != Some(404) {
                    eprintln!("note: the previous login's API key {id} stays: {e}");
                }
            }
        }
    }
    eprintln!(
        "Logged in to {url} as {username}; the API key {} is saved in {}",
        key.api_key.name,
        path.display()
    );
    Ok(())
}

/// Asks for a new password (the generated bootstrap one must be changed first) and
/// returns a client of the new session.
async fn change_password(client: &Client, current_password: String) -> anyhow::Result<Client> {
    let mut terminal = Terminal::open()?;
    terminal.say("The password must be changed before anything else.\n")?;
    let new_password = terminal.ask_secret("New password: ")?;
    if terminal.ask_secret("New password again: ")? != new_password {
        anyhow::bail!("the new passwords differ; nothing was changed");
    }
    let changed = client
        .change_password(&ChangePasswordRequest {
            current_password,
            new_password,
        })
        .await
        .map_err(explain)
        .context("change the password")?;
    Ok(client.for_token(changed.token))
}

pub async fn logout() -> anyhow::Result<()> {
    let Some(saved) = SavedLogin::load()? else {
        eprintln!("Not logged in.");
        return Ok(());
    };
    if let Some(id) = saved.api_key_id {
        let client = Client::new(saved.server.clone()).with_token(saved.token.clone());
        match client.delete_api_key(id).await {
            Ok(()) => {}
            // Already deleted (or expired): nothing is left to end.
            Err(e)
                if matches!(
                    e.code(),
                    Some(ErrorCode::NotFound | ErrorCode::Unauthorized)
                ) => {}
            Err(e) => eprintln!(
                "warning: the API key {id} on {} stays valid ({:#}); delete it with gantry keys \
                 rm {id} or in the web console",
                saved.server,
                explain(e)
            ),
        }
    }
    SavedLogin::remove()?;
    eprintln!("Logged out of {}.", saved.server);
    Ok(())
}

/// The name of the API key of a login on `host` at `now`: `cli-<host>-<milliseconds>`
/// (key names are unique per user, and a script may log in twice within a second), in
/// the characters a key name allows (`[a-z0-9._-]`, at most 63).
fn key_name(host: &str, now: Timestamp) -> String {
    let millis = now.as_millis();
    let host: String = host
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let room = 63 - "cli--".len() - millis.to_string().len();
    let host: String = host.chars().take(room).collect();
    format!("cli-{host}-{millis}")
}

/// The first line of standard input, without its line ending.
fn password_from_stdin() -> anyhow::Result<String> {
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .context("read the password from standard input")?;
    let password = line.trim_end_matches(['\n', '\r']).to_owned();
    if password.is_empty() {
        anyhow::bail!("standard input held no password");
    }
    Ok(password)
}

/// The controlling terminal, where questions are asked even when standard input and
/// output are redirected.
struct Terminal {
    tty: std::fs::File,
}

impl Terminal {
    fn open() -> anyhow::Result<Self> {
        let tty = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/tty")
            .context(
                "no terminal to ask on: give --username and pipe the password into \
                 --password-stdin",
            )?;
        Ok(Self { tty })
    }

    fn say(&mut self, text: &str) -> anyhow::Result<()> {
        self.tty
            .write_all(text.as_bytes())
            .and_then(|()| self.tty.flush())
            .context("write to the terminal")
    }

    /// Asks a question and returns the answer.
    fn ask(&mut self, prompt: &str) -> anyhow::Result<String> {
        self.say(prompt)?;
        let mut line = String::new();
        BufReader::new(&self.tty)
            .read_line(&mut line)
            .context("read from the terminal")?;
        let answer = line.trim().to_owned();
        if answer.is_empty() {
            anyhow::bail!("no answer given");
        }
        Ok(answer)
    }

    /// Asks a question whose answer is not shown as it is typed.
    fn ask_secret(&mut self, prompt: &str) -> anyhow::Result<String> {
        use nix::sys::termios::{tcgetattr, tcsetattr, LocalFlags, SetArg};
        self.say(prompt)?;
        let shown = tcgetattr(&self.tty).context("read the terminal's settings")?;
        let mut hidden = shown.clone();
        hidden.local_flags.remove(LocalFlags::ECHO);
        // The newline the user types still moves to the next line.
        hidden.local_flags.insert(LocalFlags::ECHONL);
        tcsetattr(&self.tty, SetArg::TCSAFLUSH, &hidden).context("turn off the echo")?;
        let mut line = String::new();
        let read = BufReader::new(&self.tty).read_line(&mut line);
        tcsetattr(&self.tty, SetArg::TCSANOW, &shown).context("turn the echo back on")?;
        read.context("read from the terminal")?;
        let secret = line.trim_end_matches(['\n', '\r']).to_owned();
        if secret.is_empty() {
            anyhow::bail!("no password given");
        }
        Ok(secret)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_names_are_valid_names_whatever_the_host() {
        let now = Timestamp::from_millis(1_790_000_000_123);
        assert_eq!(
            key_name("Build-01.lan", now),
            "cli-build-01.lan-1790000000123"
        );
        assert_eq!(key_name("ünï code", now), "cli--n--code-1790000000123");
        let long = key_name(&"h".repeat(200), now);
        assert_eq!(long.len(), 63);
        let key = ApiKeyCreate {
            name: long,
            description: String::new(),
            expires_in_days: None,
            ..Default::default()
        };
        gantry_types::Validate::validate(&key).unwrap();
    }
}
