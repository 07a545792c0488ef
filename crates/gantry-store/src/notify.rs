//! Cross-server change notifications on PostgreSQL. Several servers share one
//! database; each publishes its committed changes locally *and* with `pg_notify`, and
//! each listens on the same channel and republishes what the others wrote, so watch
//! streams and controllers on every server see every change.
//!
//! A notification carries the change itself when it fits PostgreSQL's payload limit;
//! larger ones carry only the resource and id, and receivers re-read the row (a deleted
//! row that large cannot be re-read; receivers then miss that one deletion, and the
//! level-triggered loops heal it on their next pass). Notifications sent while a
//! listener is reconnecting are lost the same way: consumers that must not miss a
//! change re-list on reconnect (the worker's assignment loop does).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sqlx::postgres::PgListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::changes::{Change, ChangeKind};
use crate::{Store, StoreError};

/// The PostgreSQL channel every gantry server listens on.
pub const CHANNEL: &str = "gantry_changes";

/// PostgreSQL refuses payloads of 8000 bytes or more.
const MAX_PAYLOAD: usize = 7900;

/// How many changes may wait to be sent before new ones are dropped (with a warning).
const QUEUE: usize = 4096;
/// Most changes sent in one statement. A placement batch publishes 500 changes at once,
/// and the leader writes up to three batches at a time.
const BATCH: usize = 256;

/// A notification from another server, as read. Its `origin` (which store made the
/// change) was checked by its first bytes before (see [`own_prefix`]).
#[derive(Debug, Deserialize)]
struct Envelope {
    #[serde(default)]
    change: Option<Change>,
    #[serde(default)]
    refresh: Option<Refresh>,
}

/// A notification as sent: the store that made the change first (see [`own_prefix`]),
/// then the change or which row to re-read.
#[derive(Serialize)]
struct Outgoing<'a> {
    origin: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    change: Option<&'a Change>,
    #[serde(skip_serializing_if = "Option::is_none")]
    refresh: Option<Refresh>,
}

/// A change too large to carry: which row to re-read.
#[derive(Debug, Serialize, Deserialize)]
struct Refresh {
    resource: Resource,
    id: i64,
    kind: ChangeKind,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
enum Resource {
    User,
    ApiKey,
    Worker,
    Model,
    Instance,
    Provider,
    Route,
}

/// The sending half, owned by the [`Store`].
#[derive(Debug)]
pub(crate) struct Notifier {
    queue: mpsc::Sender<String>,
    origin: String,
}

impl Notifier {
    /// Queues a change for the other servers. Never blocks the writer.
    pub(crate) fn forward(&self, change: &Change) {
        let outgoing = |change: Option<&Change>, refresh: Option<Refresh>| {
            serde_json::to_string(&Outgoing {
                origin: &self.origin,
                change,
                refresh,
            })
            .unwrap_or_default()
        };
        let mut payload = outgoing(Some(change), None);
        if payload.len() > MAX_PAYLOAD && identify(change).2 == ChangeKind::Deleted {
            // A deleted row cannot be re-read: send it without its bulky fields.
            payload = outgoing(Some(&slim(change)), None);
        }
        if payload.len() > MAX_PAYLOAD {
            let (resource, id, kind) = identify(change);
            payload = outgoing(None, Some(Refresh { resource, id, kind }));
        }
        if self.queue.try_send(payload).is_err() {
            tracing::warn!("cross-server change queue is full; other servers will miss a change");
        }
    }
}

/// How a notification sent by the store of `origin` begins: a store skips its own by
/// these bytes, without parsing the change (on a busy server, most of what it hears is
/// its own writes coming back).
fn own_prefix(origin: &str) -> String {
    let mut prefix = String::from("{\"origin\":");
    prefix.push_str(&serde_json::to_string(origin).unwrap_or_default());
    prefix.push(',');
    prefix
}

/// The change without the fields that can make it large (free text, arguments,
/// hardware lists); what identifies the object stays.
fn slim(change: &Change) -> Change {
    let mut change = change.clone();
    match &mut change {
        Change::Model(_, model) => {
            model.description.clear();
            model.backend_args.clear();
            model.env.clear();
            model.labels.clear();
            model.worker_selector.clear();
            model.custom_command = None;
        }
        Change::Instance(_, instance) => {
            instance.state_message.clear();
            instance.placement = None;
        }
        Change::Worker(_, worker) => {
            worker.status = Default::default();
            worker.labels.clear();
            worker.state_message.clear();
        }
        Change::User(_, user) => user.full_name.clear(),
        Change::ApiKey(_, key) => key.description.clear(),
        Change::Provider(_, provider) => {
            provider.description.clear();
            provider.headers.clear();
            provider.models.clear();
        }
        Change::Route(_, route) => {
            route.description.clear();
            route.targets.clear();
        }
    }
    change
}

fn identify(change: &Change) -> (Resource, i64, ChangeKind) {
    match change {
        Change::User(kind, user) => (Resource::User, user.id, *kind),
        Change::ApiKey(kind, key) => (Resource::ApiKey, key.id, *kind),
        Change::Worker(kind, worker) => (Resource::Worker, worker.id, *kind),
        Change::Model(kind, model) => (Resource::Model, model.id, *kind),
        Change::Instance(kind, instance) => (Resource::Instance, instance.id, *kind),
        Change::Provider(kind, provider) => (Resource::Provider, provider.id, *kind),
        Change::Route(kind, route) => (Resource::Route, route.id, *kind),
    }
}

/// Starts the sender and the listener for `store`; both end when `cancel` fires.
/// The notifications are sent on `pool`, one connection of their own.
pub(crate) async fn start(
    store: &Store,
    pool: sqlx::AnyPool,
    cancel: CancellationToken,
) -> Result<Arc<Notifier>, StoreError> {
    let origin = format!(
        "{}-{}-{}",
        std::process::id(),
        gantry_types::Timestamp::now().as_millis(),
        rand_suffix()
    );
    let (queue, mut outgoing) = mpsc::channel::<String>(QUEUE);

    // One sender, so notifications leave in the order the changes were committed. What
    // queued up meanwhile leaves together, up to BATCH in one statement: one round trip
    // per burst instead of one per change, so a burst of writes (a scheduler pass placing
    // hundreds of instances) does not overflow the queue.
    let send_cancel = cancel.clone();
    tokio::spawn(async move {
        let mut batch: Vec<String> = Vec::with_capacity(BATCH);
        loop {
            batch.clear();
            tokio::select! {
                () = send_cancel.cancelled() => return,
                received = outgoing.recv_many(&mut batch, BATCH) => if received == 0 {
                    return;
                },
            }
            // pg_notify returns void, which the Any driver cannot describe: count it.
            // Rows of VALUES are notified in their order.
            let sql = format!(
                "SELECT COUNT(*) AS n FROM (SELECT pg_notify($1, t.payload) \
                 FROM (VALUES {}) AS t(payload)) AS sent",
                crate::scheduling::values_rows(batch.len(), &["TEXT"], 2)
            );
            let mut query = sqlx::query(&sql).bind(CHANNEL);
            for payload in &batch {
                query = query.bind(payload);
            }
            if let Err(e) = query.execute(&pool).await {
                tracing::warn!(error = %e, changes = batch.len(), "could not notify other servers of changes");
            }
        }
    });

    let mut listener = PgListener::connect(&store.url)
        .await
        .map_err(|e| StoreError::Config(format!("listen for changes of other servers: {e}")))?;
    listener.listen(CHANNEL).await?;
    // The listener's handle must not keep the store's lifetime guard alive, or the
    // listener would never stop.
    let mut receiver = store.clone();
    receiver.lifetime = None;
    receiver.notifier = None;
    let own = own_prefix(&origin);
    tokio::spawn(async move {
        loop {
            let message = tokio::select! {
                () = cancel.cancelled() => return,
                message = listener.try_recv() => message,
            };
            match message {
                Ok(Some(notification)) => receiver.receive(notification.payload(), &own).await,
                Ok(None) => {
                    receiver.workers_may_have_changed();
                    tracing::warn!(
                        "lost the connection that listens for other servers' changes; reconnected, \
                         changes made meanwhile were missed"
                    );
                }
                Err(e) => {
                    receiver.workers_may_have_changed();
                    tracing::warn!(error = %e, "listening for other servers' changes failed; retrying");
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
            }
        }
    });
    Ok(Arc::new(Notifier { queue, origin }))
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(gantry_types::Timestamp::now().as_millis().unsigned_abs());
    hasher.finish()
}

impl Store {
    /// Republishes a change another server made; `own` is how this store's own
    /// notifications begin ([`own_prefix`]).
    async fn receive(&self, payload: &str, own: &str) {
        if payload.starts_with(own) {
            return;
        }
        let envelope: Envelope = match serde_json::from_str(payload) {
            Ok(envelope) => envelope,
            Err(e) => {
                tracing::warn!(error = %e, "unreadable cross-server change notification");
                return;
            }
        };
        let change = match (envelope.change, envelope.refresh) {
            (Some(change), _) => change,
            (None, Some(refresh)) => match self.reread(&refresh).await {
                Some(change) => change,
                None => return,
            },
            (None, None) => return,
        };
        self.publish_local(change);
    }

    async fn reread(&self, refresh: &Refresh) -> Option<Change> {
        if refresh.kind == ChangeKind::Deleted {
            return None;
        }
        let kind = refresh.kind;
        let id = refresh.id;
        match refresh.resource {
            Resource::User => self.get_user(id).await.ok().map(|o| Change::User(kind, o)),
            Resource::ApiKey => self
                .get_api_key(id)
                .await
                .ok()
                .map(|o| Change::ApiKey(kind, o)),
            Resource::Worker => self
                .get_worker(id)
                .await
                .ok()
                .map(|o| Change::Worker(kind, o)),
            Resource::Model => self
                .get_model(id)
                .await
                .ok()
                .map(|o| Change::Model(kind, o)),
            Resource::Instance => self
                .get_instance(id)
                .await
                .ok()
                .map(|o| Change::Instance(kind, o)),
            Resource::Provider => self
                .get_provider_by_id(id)
                .await
                .ok()
                .map(|o| Change::Provider(kind, o.provider)),
            Resource::Route => self
                .get_route_by_id(id)
                .await
                .ok()
                .map(|o| Change::Route(kind, o)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_types::fixtures;
    use gantry_types::InstanceState;

    fn sent(notifier: &Notifier, outgoing: &mut mpsc::Receiver<String>, change: &Change) -> String {
        notifier.forward(change);
        outgoing.try_recv().expect("a notification was queued")
    }

    #[test]
    fn a_store_knows_its_own_notifications_by_their_first_bytes() {
        let (queue, mut outgoing) = mpsc::channel(4);
        let notifier = Notifier {
            queue,
            origin: "41-1700000000000-7".to_owned(),
        };
        let model = fixtures::model(3, "m");
        let small = Change::Model(ChangeKind::Updated, model.clone());
        let mut large = model;
        large.description = "x".repeat(MAX_PAYLOAD);
        let large = Change::Model(ChangeKind::Updated, large);
        let instance = Change::Instance(
            ChangeKind::Created,
            fixtures::instance(9, &fixtures::model(3, "m"), 0, InstanceState::Pending),
        );
        for change in [&small, &large, &instance] {
            let payload = sent(&notifier, &mut outgoing, change);
            assert!(
                payload.starts_with(&own_prefix("41-1700000000000-7")),
                "{payload}"
            );
            // Another store's prefix, and one that only begins the same, do not match.
            assert!(!payload.starts_with(&own_prefix("41-1700000000000")));
            assert!(!payload.starts_with(&own_prefix("42-1700000000000-7")));
            // What another server reads of it.
            let envelope: Envelope = serde_json::from_str(&payload).unwrap();
            assert!(envelope.change.is_some() != envelope.refresh.is_some());
        }
        let payload = sent(&notifier, &mut outgoing, &large);
        let envelope: Envelope = serde_json::from_str(&payload).unwrap();
        assert!(envelope.change.is_none(), "too large to carry: re-read");
        assert!(matches!(
            envelope.refresh,
            Some(Refresh {
                resource: Resource::Model,
                id: 3,
                kind: ChangeKind::Updated
            })
        ));
    }
}
