//! First-start set-up: the data directory, the JWT secret, the first admin and the
//! worker registration token. Every step is idempotent and safe when several servers
//! start at once against one PostgreSQL: the database decides who wins.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use gantry_auth::sealed::Sealer;
use gantry_store::{ClusterToken, NewUser, Store};
use gantry_types::{Role, DEFAULT_CLUSTER_ID};

use crate::auth::{password, secrets};
use crate::config::ServerConfig;

/// File holding the generated admin password.
pub const INITIAL_ADMIN_PASSWORD_FILE: &str = "initial_admin_password";
/// File holding the worker registration token.
pub const REGISTRATION_TOKEN_FILE: &str = "registration_token";
/// Where a server keeps its own server credential (for the coordinator API).
pub const SERVER_CREDENTIAL_FILE: &str = "server_credential";
/// File holding the generated JWT secret.
pub const JWT_SECRET_FILE: &str = "jwt_secret";

/// Creates the data directory (mode 0700) if it is missing.
pub fn ensure_data_dir(dir: &Path) -> anyhow::Result<()> {
    if !dir.exists() {
        fs::create_dir_all(dir)
            .with_context(|| format!("create data directory {}", dir.display()))?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .with_context(|| format!("restrict data directory {}", dir.display()))?;
    }
    Ok(())
}

/// Writes a secret file readable only by its owner, atomically.
pub fn write_secret_file(path: &Path, contents: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("create {}", tmp.display()))?;
    file.write_all(contents.as_bytes())
        .and_then(|()| file.write_all(b"\n"))
        .and_then(|()| file.sync_all())
        .with_context(|| format!("write {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("rename {} into place", tmp.display()))?;
    Ok(())
}

/// The secret that signs session tokens: from the config, else from (or generated
/// into) `data_dir/jwt_secret`. Several servers must share one secret, so with
/// PostgreSQL it must be configured.
pub fn jwt_secret(config: &ServerConfig) -> anyhow::Result<Vec<u8>> {
    if let Some(secret) = &config.jwt_secret {
        if secret.len() < 32 {
            bail!("jwt_secret is too short: use at least 32 characters (for example the output of `openssl rand -hex 32`)");
        }
        return Ok(secret.as_bytes().to_vec());
    }
    if config.is_multi_server() {
        bail!(
            "jwt_secret must be set when database_url is PostgreSQL: every server has to sign \
             sessions with the same secret. Set GANTRY_JWT_SECRET (or jwt_secret in the config \
             file) to the same value on every server, for example the output of `openssl rand -hex 32`"
        );
    }
    let path = config.data_dir.join(JWT_SECRET_FILE);
    match fs::read_to_string(&path) {
        Ok(secret) if secret.trim().len() >= 32 => Ok(secret.trim().as_bytes().to_vec()),
        Ok(_) => bail!(
            "{} is shorter than 32 characters; delete it to have a new one generated",
            path.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let secret = secrets::random_alphanumeric(64);
            write_secret_file(&path, &secret)?;
            tracing::info!(path = %path.display(), "generated JWT secret");
            Ok(secret.into_bytes())
        }
        Err(e) => Err(e).with_context(|| format!("read {}", path.display())),
    }
}

/// Creates user `admin` when no user of that name exists.
pub async fn ensure_admin(store: &Store, config: &ServerConfig) -> anyhow::Result<()> {
    if store.user_record_by_name("admin").await.is_ok() {
        return Ok(());
    }
    let (password, generated_file) = match &config.bootstrap_password {
        Some(password) => {
            gantry_types::validate::check_password("bootstrap_password", password)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            (password.clone(), None)
        }
        None => {
            let password = secrets::random_alphanumeric(24);
            let path = config.data_dir.join(INITIAL_ADMIN_PASSWORD_FILE);
            write_secret_file(&path, &password)?;
            (password, Some(path))
        }
    };
    let new = NewUser {
        cluster_admin_of: Vec::new(),
        username: "admin".into(),
        password_hash: password::hash(password).await?,
        role: Role::Admin,
        full_name: "Administrator".into(),
        require_password_change: generated_file.is_some(),
    };
    let created = store.create_user_if_absent(&new).await?;
    match (created, generated_file) {
        (true, Some(path)) => tracing::warn!(
            path = %path.display(),
            "created user admin with a generated password; read it from the file and change it at first login"
        ),
        (true, None) => tracing::info!("created user admin with the configured bootstrap_password"),
        (false, Some(path)) => {
            // Another server created the admin first; its password is the valid one.
            let _ = fs::remove_file(path);
        }
        (false, None) => {}
    }
    Ok(())
}

/// Makes sure the default cluster has a registration token, creating it on a fresh
/// database and writing it to `data_dir/registration_token` (what `gantry start` joins its
/// own worker with). A token from before clusters existed is known in clear only to the
/// server whose data directory holds it: that server seals it into the cluster's row, so
/// every server can show it from then on. A file left behind by a rotation is rewritten
/// with the current token. Returns the file's path when this server has the current
/// token there.
pub async fn ensure_registration_token(
    store: &Store,
    data_dir: &Path,
    sealer: &Sealer,
) -> anyhow::Result<Option<PathBuf>> {
    let path = data_dir.join(REGISTRATION_TOKEN_FILE);
    let held = match fs::read_to_string(&path) {
        Ok(text) => Some(text.trim().to_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("read {}", path.display())),
    };
    let default = store.get_cluster(DEFAULT_CLUSTER_ID).await?;
    let Some(current) = default.token_digest.as_deref() else {
        let token = secrets::generate_registration_token();
        write_secret_file(&path, &token)?;
        let digest = secrets::digest(&token);
        let sealed = sealer.seal(&token);
        let first = ClusterToken {
            digest: &digest,
            sealed: &sealed,
        };
        if store.set_first_default_token(first).await? {
            tracing::info!(path = %path.display(), "generated the default cluster's worker registration token");
            return Ok(Some(path));
        }
        // Another server starting at the same moment made the token first.
        let _ = fs::remove_file(&path);
        return Ok(None);
    };
    match held {
        Some(token) if secrets::digest(&token) == current => {
            if default.token_sealed.is_none() {
                let sealed = sealer.seal(&token);
                let known = ClusterToken {
                    digest: current,
                    sealed: &sealed,
                };
                if store.seal_cluster_token(DEFAULT_CLUSTER_ID, known).await? {
                    tracing::info!("stored the default cluster's registration token sealed, so that every server can show its join command");
                }
            }
            Ok(Some(path))
        }
        Some(_) => match default.token_sealed.as_deref().map(|s| sealer.open(s)) {
            Some(Ok(token)) => {
                write_secret_file(&path, &token)?;
                tracing::info!(path = %path.display(), "the default cluster's registration token was rotated; rewrote the token file");
                Ok(Some(path))
            }
            _ => {
                tracing::warn!(path = %path.display(), "the registration token file holds an old token; see the current one with GET /api/v1/clusters/1/registration-token");
                Ok(None)
            }
        },
        None => Ok(None),
    }
}

/// Writes this server's credential (made from the cluster's secret and its id) to
/// `data_dir/server_credential`, for tools that act for it on the coordinator API.
pub fn write_server_credential(
    jwt: &gantry_auth::jwt::JwtKeys,
    config: &ServerConfig,
) -> anyhow::Result<PathBuf> {
    let path = config.data_dir.join(SERVER_CREDENTIAL_FILE);
    write_secret_file(&path, &jwt.server_credential(&config.server_id))?;
    Ok(path)
}
