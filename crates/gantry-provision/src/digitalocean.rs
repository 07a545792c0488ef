//! DigitalOcean: droplets through the v2 API. A machine is a droplet named as the machine,
//! tagged `gantry` and `gantry-pool-<pool>`, made with the cluster's set-up as its user
//! data and with an SSH key of its own (named `gantry-<machine>`, its private half never
//! kept), which is deleted with it.

use serde::Deserialize;
use serde_json::json;

use crate::{setup, ssh_key, Machine, MachineRequest, ProviderError};

/// The API's address, unless a pool says otherwise.
pub const API_URL: &str = "https://api.digitalocean.com";
/// How long one call may take.
const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

#[derive(Debug)]
pub struct DigitalOcean {
    http: reqwest::Client,
    api_url: String,
    token: String,
    /// The pool's tag, `gantry-pool-<pool>`.
    pool_tag: String,
}

#[derive(Debug, Deserialize)]
struct Droplet {
    id: u64,
    name: String,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    networks: Networks,
}

#[derive(Debug, Default, Deserialize)]
struct Networks {
    #[serde(default)]
    v4: Vec<Address>,
}

#[derive(Debug, Deserialize)]
struct Address {
    ip_address: String,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Debug, Deserialize)]
struct Droplets {
    droplets: Vec<Droplet>,
}

#[derive(Debug, Deserialize)]
struct OneDroplet {
    droplet: Droplet,
}

#[derive(Debug, Deserialize)]
struct SshKey {
    id: u64,
    name: String,
}

#[derive(Debug, Deserialize)]
struct SshKeys {
    ssh_keys: Vec<SshKey>,
    #[serde(default)]
    links: Links,
}

#[derive(Debug, Default, Deserialize)]
struct Links {
    #[serde(default)]
    pages: Pages,
}

#[derive(Debug, Default, Deserialize)]
struct Pages {
    next: Option<String>,
}

#[derive(Debug, Deserialize)]
struct OneSshKey {
    ssh_key: SshKey,
}

/// The API's error body.
#[derive(Debug, Deserialize)]
struct ApiError {
    id: Option<String>,
    message: Option<String>,
}

impl Droplet {
    fn machine(&self) -> Machine {
        let address = self
            .networks
            .v4
            .iter()
            .find(|a| a.kind == "public")
            .or_else(|| self.networks.v4.first())
            .map(|a| a.ip_address.clone());
        Machine {
            external_id: self.id.to_string(),
            address,
        }
    }
}

/// The tag a pool's droplets carry: DigitalOcean's tags take letters, digits, `-`, `_`
/// and `:`, so a pool name's dots become dashes.
pub fn pool_tag(pool: &str) -> String {
    format!("gantry-pool-{}", pool.replace('.', "-"))
}

fn key_name(machine: &str) -> String {
    format!("gantry-{machine}")
}

impl DigitalOcean {
    pub fn new(api_url: Option<&str>, token: &str, pool: &str) -> Self {
        Self {
            http: reqwest::Client::builder()
                .timeout(CALL_TIMEOUT)
                .build()
                .unwrap_or_default(),
            api_url: api_url.unwrap_or(API_URL).trim_end_matches('/').to_owned(),
            token: token.to_owned(),
            pool_tag: pool_tag(pool),
        }
    }

    /// Sends a call; the body of a success, or the API's own words as the error.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<Option<bytes_body::Body>, ProviderError> {
        let url = if path.starts_with("http") {
            path.to_owned()
        } else {
            format!("{}{path}", self.api_url)
        };
        let mut request = self
            .http
            .request(method.clone(), &url)
            .bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer = request.send().await.map_err(|e| {
            ProviderError(format!(
                "DigitalOcean's API at {} cannot be reached: {e}",
                self.api_url
            ))
        })?;
        let status = answer.status();
        let text = answer.text().await.map_err(|e| {
            ProviderError(format!(
                "DigitalOcean's answer to {method} {path} broke off: {e}"
            ))
        })?;
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            let words = serde_json::from_str::<ApiError>(&text)
                .ok()
                .and_then(|e| match (e.id, e.message) {
                    (Some(id), Some(message)) => Some(format!("{id}: {message}")),
                    (None, Some(message)) => Some(message),
                    _ => None,
                })
                .unwrap_or(text);
            return Err(ProviderError(format!(
                "DigitalOcean answered {method} {path} with {status}: {words}"
            )));
        }
        Ok(Some(bytes_body::Body(text)))
    }

    pub async fn find(&self, name: &str) -> Result<Option<Machine>, ProviderError> {
        let path = format!("/v2/droplets?name={name}&per_page=200");
        let Some(body) = self.call(reqwest::Method::GET, &path, None).await? else {
            return Ok(None);
        };
        let droplets: Droplets = body.parse("the droplets")?;
        Ok(droplets
            .droplets
            .iter()
            .find(|d| d.name == name && d.tags.contains(&self.pool_tag))
            .map(Droplet::machine))
    }

    pub async fn create(&self, request: &MachineRequest) -> Result<Machine, ProviderError> {
        let key = match self.find_key(&key_name(&request.name)).await? {
            Some(id) => id,
            None => self.add_key(&request.name).await?,
        };
        let body = json!({
            "name": request.name,
            "region": request.region,
            "size": request.instance_type,
            "image": request.image,
            "ssh_keys": [key],
            "user_data": setup::user_data(request),
            "tags": ["gantry", self.pool_tag],
            "monitoring": true,
        });
        let created = self
            .call(reqwest::Method::POST, "/v2/droplets", Some(body))
            .await?
            .ok_or_else(|| {
                ProviderError("DigitalOcean answered 404 to creating a droplet".into())
            })?;
        let droplet: OneDroplet = created.parse("the droplet created")?;
        Ok(droplet.droplet.machine())
    }

    pub async fn delete(&self, name: &str, external_id: Option<&str>) -> Result<(), ProviderError> {
        let id = match external_id {
            Some(id) => Some(id.to_owned()),
            None => self.find(name).await?.map(|m| m.external_id),
        };
        if let Some(id) = id {
            self.call(reqwest::Method::DELETE, &format!("/v2/droplets/{id}"), None)
                .await?;
        }
        if let Some(key) = self.find_key(&key_name(name)).await? {
            self.call(
                reqwest::Method::DELETE,
                &format!("/v2/account/keys/{key}"),
                None,
            )
            .await?;
        }
        Ok(())
    }

    /// The id of the account's SSH key named `name`.
    async fn find_key(&self, name: &str) -> Result<Option<u64>, ProviderError> {
        let mut next = Some("/v2/account/keys?per_page=200".to_owned());
        while let Some(path) = next {
            let Some(body) = self.call(reqwest::Method::GET, &path, None).await? else {
                return Ok(None);
            };
            let keys: SshKeys = body.parse("the SSH keys")?;
            if let Some(key) = keys.ssh_keys.iter().find(|k| k.name == name) {
                return Ok(Some(key.id));
            }
            next = keys.links.pages.next;
        }
        Ok(None)
    }

    async fn add_key(&self, machine: &str) -> Result<u64, ProviderError> {
        let body = json!({
            "name": key_name(machine),
            "public_key": ssh_key::public_key(&key_name(machine))?,
        });
        let added = self
            .call(reqwest::Method::POST, "/v2/account/keys", Some(body))
            .await?
            .ok_or_else(|| {
                ProviderError("DigitalOcean answered 404 to adding an SSH key".into())
            })?;
        let key: OneSshKey = added.parse("the SSH key added")?;
        Ok(key.ssh_key.id)
    }
}

mod bytes_body {
    use crate::ProviderError;

    /// An answer's body.
    pub struct Body(pub String);

    impl Body {
        pub fn parse<T: serde::de::DeserializeOwned>(
            &self,
            what: &str,
        ) -> Result<T, ProviderError> {
            serde_json::from_str(&self.0).map_err(|e| {
                ProviderError(format!(
                    "DigitalOcean's answer with {what} is not what its API documents: {e}"
                ))
            })
        }
    }
}
