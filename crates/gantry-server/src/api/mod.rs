//! The HTTP surface of the server: routes, shared list handling, request logging and
//! the fallbacks that keep every error in the one JSON shape.

pub mod agent;
pub mod api_keys;
pub mod auth;
pub mod backends;
pub mod catalog;
pub mod clusters;
pub mod coordinator;
pub mod downloads;
pub mod health;
pub mod instances;
pub mod model_files;
pub mod models;
pub mod openapi;
pub mod pools;
pub mod providers;
pub mod routes;
pub mod uploads;
pub mod usage;
pub mod users;
pub mod watch;
pub mod worker_backends;
pub mod workers;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::Router;
use gantry_store::{Listed, Page};
use gantry_types::query::{ListFilter, ListQuery, DEFAULT_PER_PAGE, MAX_PER_PAGE};

use crate::error::ApiError;
use crate::state::AppState;

/// Every route of the server.
pub fn router(state: AppState) -> Router {
    let v1 = Router::new()
        .route("/users", get(users::list).post(users::create))
        .route(
            "/users/{id}",
            get(users::get).patch(users::update).delete(users::delete),
        )
        .route("/api-keys", get(api_keys::list).post(api_keys::create))
        .route(
            "/api-keys/{id}",
            get(api_keys::get)
                .patch(api_keys::update)
                .delete(api_keys::delete),
        )
        .route(
            "/inference-backends",
            get(backends::list).post(backends::create),
        )
        .route(
            "/inference-backends/{name}",
            get(backends::get)
                .patch(backends::update)
                .delete(backends::delete),
        )
        .route(
            "/model-providers",
            get(providers::list).post(providers::create),
        )
        .route(
            "/model-providers/{name}",
            get(providers::get)
                .patch(providers::update)
                .delete(providers::delete),
        )
        .route("/model-providers/{name}/models", get(providers::models))
        .route("/model-routes", get(routes::list).post(routes::create))
        .route(
            "/model-routes/{name}",
            get(routes::get)
                .patch(routes::update)
                .delete(routes::delete),
        )
        .route("/model-catalog", get(catalog::list))
        .route("/clusters", get(clusters::list).post(clusters::create))
        .route(
            "/clusters/{id}",
            get(clusters::get)
                .patch(clusters::update)
                .delete(clusters::delete),
        )
        .route(
            "/clusters/{id}/registration-token",
            get(clusters::registration).post(clusters::rotate),
        )
        .route(
            "/clusters/{id}/worker-pools",
            get(pools::list).post(pools::create),
        )
        .route(
            "/clusters/{id}/worker-pools/{pool}",
            get(pools::get).patch(pools::update).delete(pools::delete),
        )
        .route(
            "/clusters/{id}/worker-pools/{pool}/events",
            get(pools::events),
        )
        .route("/workers", get(workers::list))
        .route("/workers/join", get(workers::join))
        .route("/workers/{id}", get(workers::get).delete(workers::delete))
        .route("/workers/{id}/labels", put(workers::set_labels))
        .route("/workers/{id}/history", get(workers::history))
        .route(
            "/workers/{id}/backends",
            get(worker_backends::list).post(worker_backends::install),
        )
        .route(
            "/workers/{id}/backends/{name}/{version}",
            delete(worker_backends::remove),
        )
        .route("/models", get(models::list).post(models::create))
        .route("/models/estimate", post(models::estimate))
        .route(
            "/models/{id}",
            get(models::get)
                .patch(models::update)
                .delete(models::delete),
        )
        .route("/model-files", get(model_files::list))
        .route(
            "/model-files/uploads",
            get(uploads::list).post(uploads::create),
        )
        .route(
            "/model-files/uploads/{id}",
            get(uploads::get)
                .patch(uploads::append)
                .delete(uploads::delete),
        )
        .route("/model-files/uploads/{id}/content", get(uploads::content))
        .route("/worker/uploads/{id}", get(uploads::staged))
        .route(
            "/model-files/{worker_id}/{blob}",
            axum::routing::delete(model_files::delete),
        )
        .route("/usage", get(usage::report))
        .route("/model-instances", get(instances::list))
        .route("/model-instances/{id}/logs", get(instances::logs))
        .route("/model-instances/{id}/restart", post(instances::restart))
        .route("/workers/register", post(agent::register))
        .route("/worker/heartbeat", post(agent::heartbeat))
        .route("/worker/servers", get(agent::servers))
        .route("/coordinator/servers", get(coordinator::servers))
        .route("/coordinator/servers/register", post(coordinator::register))
        .route(
            "/coordinator/servers/unregister/{server_id}",
            post(coordinator::unregister),
        )
        .route("/coordinator/heartbeat", post(coordinator::heartbeat))
        .route("/coordinator/cluster", get(coordinator::cluster))
        .route("/coordinator/locks", get(coordinator::locks))
        .route(
            "/coordinator/locks/acquire",
            post(coordinator::acquire_lock),
        )
        .route(
            "/coordinator/locks/release",
            post(coordinator::release_lock),
        )
        .route("/coordinator/health", get(coordinator::health))
        .route("/worker/status", put(agent::status))
        .route("/worker/assignments", get(agent::assignments))
        .route("/worker/instances/{id}/state", post(agent::report_state))
        .route("/worker/goodbye", post(agent::goodbye))
        .route(
            "/model-instances/{id}",
            get(instances::get)
                .patch(instances::update)
                .delete(instances::delete),
        )
        .layer(middleware::from_fn_with_state(
            state.clone(),
            refuse_while_database_unreachable,
        ));
    let auth = Router::new()
        .route("/auth/login", post(auth::login))
        .route("/auth/logout", post(auth::logout))
        .route("/auth/change-password", post(auth::change_password))
        .route("/auth/me", get(auth::me))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            refuse_while_database_unreachable,
        ));
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/downloads/gantry", get(downloads::gantry))
        .merge(auth)
        .route("/api/openapi.json", get(openapi::spec))
        .route("/docs", get(openapi::docs))
        .nest("/api/v1", v1)
        .merge(crate::ui::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(state.config.max_request_body))
        .layer(middleware::from_fn(log_requests))
        .with_state(state)
}

async fn not_found(request: Request) -> ApiError {
    ApiError::not_found(format!(
        "no route for {} {}; the API is described at /api/openapi.json",
        request.method(),
        request.uri().path()
    ))
}

async fn method_not_allowed(request: Request) -> ApiError {
    ApiError::new(
        gantry_types::ErrorCode::MethodNotAllowed,
        format!(
            "{} is not allowed on {}",
            request.method(),
            request.uri().path()
        ),
    )
}

/// While the database is known to be unreachable, the management API answers 503 with
/// `Retry-After` at once instead of every request waiting out the connection pool's
/// timeout first. The gateway is not behind this: it goes on serving.
async fn refuse_while_database_unreachable(
    axum::extract::State(state): axum::extract::State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    match state.store.unreachable() {
        Some(why) => ApiError::from(gantry_store::StoreError::Unreachable(why)).into_response(),
        None => next.run(request).await,
    }
}

/// One log line per request, with an id that is also returned as `x-request-id`.
async fn log_requests(request: Request, next: Next) -> Response {
    static NEXT_ID: AtomicU64 = AtomicU64::new(1);
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let started = Instant::now();
    let mut response = next.run(request).await;
    let status = response.status().as_u16();
    let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
    if matches!(path.as_str(), "/healthz" | "/readyz") {
        tracing::debug!(request_id = id, %method, %path, status, elapsed_ms, "request");
    } else if status >= 500 {
        tracing::error!(request_id = id, %method, %path, status, elapsed_ms, "request");
    } else {
        tracing::info!(request_id = id, %method, %path, status, elapsed_ms, "request");
    }
    if let Ok(value) = HeaderValue::from_str(&id.to_string()) {
        response.headers_mut().insert("x-request-id", value);
    }
    response
}

/// The page a query asks for, with defaults.
pub fn page_of(page: Option<u32>, per_page: Option<u32>) -> Page {
    Page {
        page: page.unwrap_or(1),
        per_page: per_page.unwrap_or(DEFAULT_PER_PAGE),
    }
}

/// A 201 Created with a JSON body.
pub fn created<T: serde::Serialize>(body: T) -> Response {
    (StatusCode::CREATED, axum::Json(body)).into_response()
}

/// What a listed item's JSON is taken to need, for the buffer a page is written into: a
/// worker (8 GPUs) is about 1.8 KB, an instance with its placement about 1.4 KB.
const LIST_BYTES_PER_ITEM: usize = 2048;

/// A page of a list as JSON. It is written into a buffer sized for the page up front:
/// `axum::Json` starts at 128 bytes, so a page of 100 workers (180 KB) was copied eleven
/// times as the buffer doubled.
pub fn list_response<T: serde::Serialize>(items: Vec<T>, page: Page, total: u64) -> Response {
    let mut body = Vec::with_capacity(256 + LIST_BYTES_PER_ITEM * items.len());
    let list = gantry_types::ListResponse {
        items,
        pagination: gantry_types::Pagination {
            page: page.page,
            per_page: page.per_page,
            total,
        },
    };
    match serde_json::to_writer(&mut body, &list) {
        Ok(()) => (
            [(
                axum::http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body,
        )
            .into_response(),
        Err(e) => {
            ApiError::internal(format!("write a page of the list as JSON: {e}")).into_response()
        }
    }
}

/// Picks one resource out of a change: `Change::model`, `Change::instance`, …
pub type ChangeOf<T> = fn(&gantry_store::Change) -> Option<(gantry_store::ChangeKind, &T)>;

/// The answer of a list endpoint: one page of the items `query` selects, or with
/// `watch=true` all of them as `CREATED` events followed by the live changes that pass the
/// same filter (`of` picks the list's resource out of a change).
pub async fn list_or_watch<Q>(
    state: &crate::state::AppState,
    query: &Q,
    of: ChangeOf<<Q::Filter as ListFilter>::Item>,
) -> Result<Response, ApiError>
where
    Q: ListQuery,
    Q::Filter: Listed + Send + 'static,
    <Q::Filter as ListFilter>::Item: serde::Serialize + Clone + Send + 'static,
{
    list_or_watch_filtered(state, query, query.filter(), of).await
}

/// [`list_or_watch`] with the query's filter as the caller narrowed it (to the clusters
/// they may see).
pub async fn list_or_watch_filtered<Q>(
    state: &crate::state::AppState,
    query: &Q,
    filter: Q::Filter,
    of: ChangeOf<<Q::Filter as ListFilter>::Item>,
) -> Result<Response, ApiError>
where
    Q: ListQuery,
    Q::Filter: Listed + Send + 'static,
    <Q::Filter as ListFilter>::Item: serde::Serialize + Clone + Send + 'static,
{
    if query.watch() {
        // Subscribe before reading, so no change between the two is lost.
        let changes = state.store.subscribe();
        let initial = watch_all(|page| filter.list(&state.store, page)).await?;
        return Ok(watch::respond(
            state,
            watch::Changes::All(changes),
            initial,
            query.watch_timeout(),
            move |change| {
                let (kind, item) = of(change)?;
                filter.matches(item).then(|| (kind, item.clone()))
            },
            None,
        ));
    }
    let (page, per_page) = query.paging();
    let page = page_of(page, per_page);
    let (items, total) = filter.list(&state.store, page).await?;
    Ok(list_response(items, page, total))
}

/// Every item of a list, page by page: the initial snapshot of a watch stream.
pub async fn watch_all<T, F, Fut>(mut list: F) -> Result<Vec<T>, ApiError>
where
    F: FnMut(Page) -> Fut,
    Fut: std::future::Future<Output = Result<(Vec<T>, u64), gantry_store::StoreError>>,
{
    let mut all = Vec::new();
    for number in 1.. {
        let (items, total) = list(Page {
            page: number,
            per_page: MAX_PER_PAGE,
        })
        .await?;
        let done = items.len() < MAX_PER_PAGE as usize;
        all.extend(items);
        if done || all.len() as u64 >= total {
            break;
        }
    }
    Ok(all)
}
