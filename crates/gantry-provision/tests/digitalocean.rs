//! The DigitalOcean provider against a double of DigitalOcean's v2 API (there is no cloud
//! account here): the real paths, JSON shapes, error bodies and paging of the endpoints it
//! calls, served on a loopback port. Machines are created with their own SSH key and the
//! cluster's user data, found by name, and deleted with their key.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use axum::{Json, Router};
use gantry_provision::digitalocean::DigitalOcean;
use gantry_provision::MachineRequest;
use serde_json::{json, Value};

const TOKEN: &str = "dop_v1_test";

/// What the double's account holds.
#[derive(Default)]
struct Account {
    droplets: BTreeMap<u64, Value>,
    keys: BTreeMap<u64, Value>,
    next_id: u64,
    /// Every call, `METHOD path`.
    calls: Vec<String>,
    /// Answer the next droplet creation with this error.
    fail_next_create: Option<(StatusCode, Value)>,
}

type Shared = Arc<Mutex<Account>>;

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        Json(json!({"id": "unauthorized", "message": "Unable to authenticate you"})),
    )
        .into_response()
}

fn authorised(headers: &HeaderMap) -> bool {
    headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {TOKEN}"))
}

fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(json!({"id": "not_found", "message": "The resource you were accessing could not be found."})),
    )
        .into_response()
}

async fn list_droplets(
    State(account): State<Shared>,
    headers: HeaderMap,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    if !authorised(&headers) {
        return unauthorized();
    }
    let mut account = account.lock().unwrap();
    account.calls.push(format!(
        "GET /v2/droplets?name={}",
        query.get("name").cloned().unwrap_or_default()
    ));
    let droplets: Vec<Value> = account
        .droplets
        .values()
        .filter(|d| query.get("name").is_none_or(|n| d["name"] == *n))
        .cloned()
        .collect();
    let total = droplets.len();
    Json(json!({"droplets": droplets, "links": {}, "meta": {"total": total}})).into_response()
}

async fn create_droplet(
    State(account): State<Shared>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    if !authorised(&headers) {
        return unauthorized();
    }
    let mut account = account.lock().unwrap();
    account.calls.push("POST /v2/droplets".into());
    if let Some((status, error)) = account.fail_next_create.take() {
        return (status, Json(error)).into_response();
    }
    for field in ["name", "region", "size", "image"] {
        if !body[field].is_string() {
            return (
                StatusCode::UNPROCESSABLE_ENTITY,
                Json(json!({"id": "unprocessable_entity", "message": format!("{field} is required")})),
            )
                .into_response();
        }
    }
    account.next_id += 1;
    let id = 3_164_000 + account.next_id;
    let droplet = json!({
        "id": id,
        "name": body["name"],
        "status": "new",
        "size_slug": body["size"],
        "region": {"slug": body["region"]},
        "image": {"slug": body["image"]},
        "tags": body["tags"],
        "user_data_seen": body["user_data"],
        "ssh_keys_seen": body["ssh_keys"],
        "networks": {"v4": [
            {"ip_address": "10.128.0.2", "type": "private"},
            {"ip_address": "203.0.113.7", "type": "public"}
        ], "v6": []},
    });
    account.droplets.insert(id, droplet.clone());
    (
        StatusCode::ACCEPTED,
        Json(json!({"droplet": droplet, "links": {"actions": [{"id": 1, "rel": "create", "href": "https://api.digitalocean.com/v2/actions/1"}]}})),
    )
        .into_response()
}

async fn delete_droplet(
    State(account): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<u64>,
) -> Response {
    if !authorised(&headers) {
        return unauthorized();
    }
    let mut account = account.lock().unwrap();
    account.calls.push(format!("DELETE /v2/droplets/{id}"));
    match account.droplets.remove(&id) {
        Some(_) => StatusCode::NO_CONTENT.into_response(),
        None => not_found(),
    }
}

/// Keys are paged two at a time, with `links.pages.next` as DigitalOcean gives it.
async fn list_keys(
    State(account): State<Shared>,
    headers: HeaderMap,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    if !authorised(&headers) {
        return unauthorized();
    }
    let mut account = account.lock().unwrap();
    let page: usize = query.get("page").and_then(|p| p.parse().ok()).unwrap_or(1);
    account
        .calls
        .push(format!("GET /v2/account/keys?page={page}"));
    let keys: Vec<Value> = account.keys.values().cloned().collect();
    let shown: Vec<Value> = keys.iter().skip((page - 1) * 2).take(2).cloned().collect();
    let mut links = json!({});
    if keys.len() > page * 2 {
        // Absolute, as DigitalOcean writes it.
        let host = headers
            .get("host")
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default();
        links = json!({"pages": {"next": format!("http://{host}/v2/account/keys?page={}&per_page=2", page + 1)}});
    }
    Json(json!({"ssh_keys": shown, "links": links, "meta": {"total": keys.len()}})).into_response()
}

async fn add_key(
    State(account): State<Shared>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    if !authorised(&headers) {
        return unauthorized();
    }
    let mut account = account.lock().unwrap();
    account.calls.push("POST /v2/account/keys".into());
    let public_key = body["public_key"].as_str().unwrap_or_default();
    if !public_key.starts_with("ssh-ed25519 ") {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({"id": "unprocessable_entity", "message": "Key invalid type, we support 'ssh-rsa', 'ssh-dss', 'ecdsa-sha2-nistp', or 'ssh-ed25519'"})),
        )
            .into_response();
    }
    account.next_id += 1;
    let id = 512_000 + account.next_id;
    let key = json!({"id": id, "fingerprint": format!("3b:16:{id}"), "public_key": public_key, "name": body["name"]});
    account.keys.insert(id, key.clone());
    (StatusCode::CREATED, Json(json!({"ssh_key": key}))).into_response()
}

async fn delete_key(
    State(account): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<u64>,
) -> Response {
    if !authorised(&headers) {
        return unauthorized();
    }
    let mut account = account.lock().unwrap();
    account.calls.push(format!("DELETE /v2/account/keys/{id}"));
    match account.keys.remove(&id) {
        Some(_) => StatusCode::NO_CONTENT.into_response(),
        None => not_found(),
    }
}

/// Serves the double on a loopback port; its base URL and account.
async fn serve() -> (String, Shared) {
    let account = Shared::default();
    let app = Router::new()
        .route("/v2/droplets", get(list_droplets).post(create_droplet))
        .route("/v2/droplets/{id}", delete(delete_droplet))
        .route("/v2/account/keys", get(list_keys).post(add_key))
        .route("/v2/account/keys/{id}", delete(delete_key))
        .with_state(Arc::clone(&account));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, account)
}

fn request(name: &str) -> MachineRequest {
    MachineRequest {
        name: name.into(),
        cluster_token: "gantryreg_abc".into(),
        server_urls: vec!["https://gantry.example:8080".into()],
        instance_type: "gpu-h100x1-80gb".into(),
        image: "gpu-h100x1-base".into(),
        region: "nyc2".into(),
        gpus: "1x80GiB".into(),
        labels: [("gantry.dev/pool".to_owned(), "h100".to_owned())].into(),
    }
}

#[tokio::test]
async fn droplets_are_created_with_their_key_found_by_name_and_deleted_with_it() {
    let (base, account) = serve().await;
    let provider = DigitalOcean::new(Some(&base), TOKEN, "h100");

    assert_eq!(provider.find("h100-1").await.unwrap(), None);
    let made = provider.create(&request("h100-1")).await.unwrap();
    assert_eq!(
        made.address.as_deref(),
        Some("203.0.113.7"),
        "the public address"
    );
    {
        let account = account.lock().unwrap();
        let droplet = account.droplets.values().next().unwrap();
        assert_eq!(droplet["name"], "h100-1");
        assert_eq!(droplet["size_slug"], "gpu-h100x1-80gb");
        assert_eq!(droplet["tags"], json!(["gantry", "gantry-pool-h100"]));
        let user_data = droplet["user_data_seen"].as_str().unwrap();
        assert!(
            user_data.contains("GANTRY_TOKEN=gantryreg_abc"),
            "{user_data}"
        );
        assert!(
            user_data.contains("GANTRY_WORKER_NAME=h100-1"),
            "{user_data}"
        );
        let key = account.keys.values().next().unwrap();
        assert_eq!(key["name"], "gantry-h100-1");
        assert_eq!(droplet["ssh_keys_seen"], json!([key["id"]]));
    }
    let found = provider.find("h100-1").await.unwrap().unwrap();
    assert_eq!(found, made);
    // A droplet of the same name without the pool's tag is someone else's.
    let other = DigitalOcean::new(Some(&base), TOKEN, "other-pool");
    assert_eq!(other.find("h100-1").await.unwrap(), None);

    // More keys than a page: the machine's key is found on a later page.
    for n in 2..=4 {
        provider
            .create(&request(&format!("h100-{n}")))
            .await
            .unwrap();
    }
    provider
        .delete("h100-1", Some(&made.external_id))
        .await
        .unwrap();
    provider.delete("h100-4", None).await.unwrap();
    {
        let account = account.lock().unwrap();
        let names: Vec<&str> = account
            .droplets
            .values()
            .map(|d| d["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["h100-2", "h100-3"]);
        let keys: Vec<&str> = account
            .keys
            .values()
            .map(|k| k["name"].as_str().unwrap())
            .collect();
        assert_eq!(keys, ["gantry-h100-2", "gantry-h100-3"]);
        assert!(
            account
                .calls
                .iter()
                .any(|c| c == "GET /v2/account/keys?page=2"),
            "the key list was followed to its next page: {:?}",
            account.calls
        );
    }
    // Deleting what is gone already succeeds.
    provider
        .delete("h100-1", Some(&made.external_id))
        .await
        .unwrap();
}

#[tokio::test]
async fn the_apis_own_words_come_back_on_failure() {
    let (base, account) = serve().await;
    account.lock().unwrap().fail_next_create = Some((
        StatusCode::UNPROCESSABLE_ENTITY,
        json!({"id": "unprocessable_entity", "message": "Size is not available in this region.", "request_id": "4d9d8375"}),
    ));
    let provider = DigitalOcean::new(Some(&base), TOKEN, "h100");
    let error = provider.create(&request("h100-1")).await.unwrap_err();
    assert!(
        error.0.contains("422")
            && error
                .0
                .contains("unprocessable_entity: Size is not available in this region."),
        "{error}"
    );
    let wrong = DigitalOcean::new(Some(&base), "dop_v1_wrong", "h100");
    let error = wrong.find("h100-1").await.unwrap_err();
    assert!(error.0.contains("Unable to authenticate you"), "{error}");
    let nowhere = DigitalOcean::new(Some("http://127.0.0.1:1"), TOKEN, "h100");
    let error = nowhere.find("h100-1").await.unwrap_err();
    assert!(error.0.contains("cannot be reached"), "{error}");
}
