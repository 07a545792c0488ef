//! Coordination between servers: the server registry, the leader and its fencing token,
//! and distributed locks, as the coordinator API (`/api/v1/coordinator/*`) shows them.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::time::Timestamp;
use crate::validate::{FieldError, Validate};

/// A server's part in scheduling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ServerRole {
    /// Holds the leader lease: runs the controllers (and places, unless scheduling is
    /// distributed).
    Leader,
    /// Serves the API, the console and the gateway; takes over when the leader goes.
    Standby,
}

impl ServerRole {
    pub fn as_str(self) -> &'static str {
        match self {
            ServerRole::Leader => "leader",
            ServerRole::Standby => "standby",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "leader" => Some(ServerRole::Leader),
            "standby" => Some(ServerRole::Standby),
            _ => None,
        }
    }
}

/// What a server reports of its load with every heartbeat.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerLoad {
    /// Gateway requests in flight on this server.
    pub inflight_requests: u64,
    /// Workers whose heartbeats reach this server.
    pub connected_workers: u64,
}

/// One server in the registry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ServerInfo {
    pub server_id: String,
    /// Where workers and clients reach it.
    pub url: String,
    /// The gantry version it runs.
    pub version: String,
    pub role: ServerRole,
    pub started_at: Timestamp,
    pub last_heartbeat_at: Timestamp,
    /// False once it has been silent for `server_timeout`: workers are no longer sent
    /// there.
    pub active: bool,
    pub load: ServerLoad,
    /// `worker_factor * 0.4 + load_factor * 0.6`, each factor this server's share of the
    /// largest value among the active servers (0 to 1): a worker (re)connecting prefers
    /// the lowest.
    pub load_score: f64,
}

/// `POST /api/v1/coordinator/servers/register`: adds a server to the registry (a server
/// does this for itself at start-up; the API is for tools and tests).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerRegister {
    #[schema(min_length = 1, max_length = 128, pattern = r"^[A-Za-z0-9._-]*$")]
    pub server_id: String,
    /// Where the other servers and the workers reach it: `http(s)://host[:port][/path]`,
    /// the host a name, an IPv4 address or a bracketed IPv6 address.
    #[schema(
        max_length = 2048,
        pattern = r"^https?://([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?(/[!-~]*)?$"
    )]
    pub url: String,
    #[serde(default)]
    #[schema(max_length = 64)]
    pub version: String,
}

/// `POST /api/v1/coordinator/heartbeat`: a registered server is alive, with its load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerHeartbeat {
    #[schema(min_length = 1, max_length = 128, pattern = r"^[A-Za-z0-9._-]*$")]
    pub server_id: String,
    #[serde(default)]
    pub load: ServerLoad,
}

/// `http(s)://host[:port][/path]`: the host a name or IPv4 address (letters, digits, `.`,
/// `-`) or a bracketed IPv6 address, the port 1 to 5 digits, the path printable ASCII.
fn is_http_url(url: &str) -> bool {
    let Some(rest) = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
    else {
        return false;
    };
    let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
    if !path.bytes().all(|b| b.is_ascii_graphic()) {
        return false;
    }
    let (host, port) = if let Some(inside) = authority.strip_prefix('[') {
        let Some((ip, after)) = inside.split_once(']') else {
            return false;
        };
        if ip.parse::<std::net::Ipv6Addr>().is_err() {
            return false;
        }
        match after {
            "" => ("ip", None),
            port => match port.strip_prefix(':') {
                Some(port) => ("ip", Some(port)),
                None => return false,
            },
        }
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let host_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-');
    let port_ok =
        port.is_none_or(|p| (1..=5).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()));
    host_ok && port_ok
}

/// Server ids: 1 to 128 characters of letters, digits, `-`, `_` and `.`.
pub fn check_server_id(field: &str, id: &str) -> Result<(), FieldError> {
    if id.is_empty() || id.chars().count() > 128 {
        return Err(FieldError::new(field, "must be 1 to 128 characters long"));
    }
    if let Some(bad) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(FieldError::new(
            field,
            format!("contains {bad:?}; only letters, digits, '-', '_' and '.' are allowed"),
        ));
    }
    Ok(())
}

impl Validate for ServerRegister {
    fn validate(&self) -> Result<(), FieldError> {
        check_server_id("server_id", &self.server_id)?;
        if !is_http_url(&self.url) || self.url.len() > 2048 {
            return Err(FieldError::new(
                "url",
                "must be an http:// or https:// URL (host, optional port and path) of at \
                 most 2048 characters",
            ));
        }
        if self.version.chars().count() > 64 {
            return Err(FieldError::new("version", "must be at most 64 characters"));
        }
        Ok(())
    }
}

impl Validate for ServerHeartbeat {
    fn validate(&self) -> Result<(), FieldError> {
        check_server_id("server_id", &self.server_id)
    }
}

/// The leader lease as it stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LeaderInfo {
    /// The holder; `None` when nobody leads (between a release and the next take-over).
    pub server_id: Option<String>,
    /// Grows by one every time the lease changes hands; a leader-only write carrying an
    /// older token is refused.
    pub fencing_token: u64,
    /// When the current holder took the lease (the database's clock).
    pub acquired_at: Timestamp,
    /// When the lease lapses unless renewed.
    pub expires_at: Timestamp,
}

/// `GET /api/v1/coordinator/cluster`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ClusterStatus {
    /// How servers share scheduling: `local` or `distributed`.
    pub scheduling_mode: String,
    pub servers: Vec<ServerInfo>,
    pub active_servers: u64,
    pub leader: LeaderInfo,
    /// Registered workers.
    pub total_workers: u64,
    /// Gateway requests in flight over all active servers.
    pub total_load: u64,
}

/// `POST /api/v1/coordinator/locks/acquire`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LockAcquire {
    /// What the lock guards, 1 to 200 printable ASCII characters.
    #[schema(min_length = 1, max_length = 200, pattern = r"^[!-~]*$")]
    pub name: String,
    /// Who takes it (a server id, or a tool's name).
    #[schema(min_length = 1, max_length = 200, pattern = r"^[!-~]*$")]
    pub owner: String,
    /// How long it holds without renewal, in milliseconds (1 to 3,600,000); the server's
    /// `lock_timeout` when absent. Acquiring again as the owner renews it.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 3_600_000)]
    pub timeout_ms: Option<u64>,
}

/// `POST /api/v1/coordinator/locks/release`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LockRelease {
    #[schema(min_length = 1, max_length = 200, pattern = r"^[!-~]*$")]
    pub name: String,
    #[schema(min_length = 1, max_length = 200, pattern = r"^[!-~]*$")]
    pub owner: String,
}

/// The longest lock timeout the API accepts: one hour.
pub const MAX_LOCK_TIMEOUT_MS: u64 = 3_600_000;

fn check_lock_text(field: &str, text: &str) -> Result<(), FieldError> {
    if text.is_empty() || text.len() > 200 || !text.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(FieldError::new(
            field,
            "must be 1 to 200 printable ASCII characters without spaces",
        ));
    }
    Ok(())
}

impl Validate for LockAcquire {
    fn validate(&self) -> Result<(), FieldError> {
        check_lock_text("name", &self.name)?;
        check_lock_text("owner", &self.owner)?;
        if let Some(ms) = self.timeout_ms {
            if ms == 0 || ms > MAX_LOCK_TIMEOUT_MS {
                return Err(FieldError::new(
                    "timeout_ms",
                    format!("must be 1 to {MAX_LOCK_TIMEOUT_MS}"),
                ));
            }
        }
        Ok(())
    }
}

impl Validate for LockRelease {
    fn validate(&self) -> Result<(), FieldError> {
        check_lock_text("name", &self.name)?;
        check_lock_text("owner", &self.owner)
    }
}

/// A held lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LockInfo {
    pub name: String,
    pub owner: String,
    /// Grows by one at every acquisition of this name; writes guarded by the lock carry
    /// it.
    pub token: u64,
    pub acquired_at: Timestamp,
    pub expires_at: Timestamp,
}

/// `GET /api/v1/coordinator/health`: this server's view of coordination.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CoordinatorHealth {
    pub server_id: String,
    pub role: ServerRole,
    pub scheduling_mode: String,
    /// This server's fencing token while it leads.
    pub fencing_token: Option<u64>,
    /// Whether the coordination tables answer.
    pub database: bool,
}

/// `GET /api/v1/worker/servers`: where a worker may send its calls, best first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ServerDirectory {
    /// Active servers, lowest load score first.
    pub servers: Vec<ServerInfo>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_ids_and_lock_names_are_checked() {
        assert!(check_server_id("server_id", "gantry-1.example").is_ok());
        assert!(check_server_id("server_id", "").is_err());
        assert!(check_server_id("server_id", "a b").is_err());
        let lock = |name: &str, timeout_ms| LockAcquire {
            name: name.into(),
            owner: "tool".into(),
            timeout_ms,
        };
        assert!(lock("schedule:instance:7", None).validate().is_ok());
        assert_eq!(lock("", None).validate().unwrap_err().field, "name");
        assert_eq!(lock("a b", None).validate().unwrap_err().field, "name");
        assert_eq!(
            lock("x", Some(0)).validate().unwrap_err().field,
            "timeout_ms"
        );
        assert!(lock("x", Some(MAX_LOCK_TIMEOUT_MS)).validate().is_ok());
        let register = ServerRegister {
            server_id: "s1".into(),
            url: "ftp://x".into(),
            version: String::new(),
        };
        assert_eq!(register.validate().unwrap_err().field, "url");
    }
}

#[cfg(test)]
mod url_tests {
    use super::is_http_url;

    #[test]
    fn server_urls_are_http_urls_with_a_host() {
        for good in [
            "http://a",
            "https://gantry-1.example.com:8080",
            "http://10.0.0.1:80/base",
            "http://[::1]:8080",
            "https://[fe80::1]",
        ] {
            assert!(is_http_url(good), "{good}");
        }
        for bad in [
            "http://",
            "http://[",
            "http://[::1",
            "http://[::1]x",
            "http://[fB1]",
            "http://[1:::2]",
            "ftp://a",
            "http://a b",
            "http://a:",
            "http://a:123456",
            "http://a:x",
            "http://a/ b",
            "http://user@a",
        ] {
            assert!(!is_http_url(bad), "{bad}");
        }
    }
}
