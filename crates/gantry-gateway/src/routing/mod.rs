//! The routing table: model name → the running instances that serve it, with a
//! request-in-flight counter per instance.
//!
//! It is built from the store at start-up and kept current by one task that applies
//! the store's change feed (`Change::Instance`, `Change::Model`). The feed carries
//! every server's writes: on PostgreSQL the store republishes the changes other
//! servers announce with `pg_notify` (`gantry-store/src/notify.rs`). What it can miss
//! — changes sent while this server's listener was reconnecting, a deletion too large
//! to announce, a full cross-server queue, a local feed that lagged — is healed by a
//! rebuild from the store every [`REFRESH_INTERVAL`] (and at once on a lag). The same
//! task does both, in order, so a refresh never overwrites a newer event with an older
//! read (events queued during a refresh are applied after it, and applying an event
//! twice is harmless because it carries the object's state after the write).
//!
//! Requests read the table under a short read lock and keep `Arc`s to what they use:
//! an instance removed while requests are in flight keeps its counter (and its
//! connections) until they end. Removing an instance also fires its
//! [`Backend::left_routing`] signal, on which requests still waiting for its response
//! head give up and go to another instance (a frozen backend reported `unhealthy` by
//! its worker must not keep them). The same task sweeps idle connections on each
//! refresh.
//!
//! Each instance also carries its passive-ejection record (`eject.rs`): the balancer
//! passes over an ejected instance while the model has another one.

//!
//! - `backend.rs`: one instance (or provider) as a target;
//! - `table.rs`: the table requests read, and the pick;
//! - `tracker.rs`: the task that keeps the table current from the store.

mod backend;
mod table;
mod tracker;

pub use backend::{Backend, InFlightGuard};
pub use table::{ModelRoute, RoutingTable};
pub use tracker::{start, REFRESH_INTERVAL};

/// Routes of fake instances for the tests of the modules that pick from the table.
#[cfg(test)]
pub(crate) mod testing {
    use std::sync::{Arc, OnceLock};

    use axum::http::HeaderValue;
    use gantry_types::{fixtures, InstanceState, Model, ModelInstance};

    use super::{Backend, ModelRoute, RoutingTable};

    /// Instance `id` of `model`, running at `127.0.0.1:port`.
    pub(crate) fn running(id: i64, model: &Model, port: u16) -> ModelInstance {
        let mut instance = fixtures::instance(
            id,
            model,
            u32::try_from(id).expect("a small test id"),
            InstanceState::Running,
        );
        instance.port = Some(port);
        instance.address = Some(format!("127.0.0.1:{port}"));
        instance
    }

    /// A running instance `id` of the model `name` at `127.0.0.1:port`.
    pub(crate) fn backend(name: &str, id: i64, port: u16) -> Arc<Backend> {
        let model = fixtures::model(1, name);
        Arc::new(
            Backend::from_instance(&running(id, &model, port))
                .expect("a running instance has an address"),
        )
    }

    /// The route of `name` over `backends`, outside any table.
    pub(crate) fn route(name: &str, backends: Vec<Arc<Backend>>) -> ModelRoute {
        ModelRoute {
            name_header: HeaderValue::from_str(name).expect("a plain test name"),
            name: Arc::from(name),
            created: 0,
            backends,
            cursor: Arc::default(),
            metrics: OnceLock::new(),
        }
    }

    /// A table routing `name` to `backends`.
    pub(crate) fn table(name: &str, backends: Vec<Arc<Backend>>) -> RoutingTable {
        let table = RoutingTable::default();
        table.set(Arc::from(name), Some(Arc::new(route(name, backends))));
        table
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::HashSet;
    use std::sync::Arc;
    use std::time::Duration;

    use gantry_store::{Change, ChangeKind};
    use gantry_types::{fixtures, InstanceState, ModelInstance};
    use tokio::time::Instant;

    use super::table::MISS_RECHECK;
    use super::tracker::Tracker;
    use super::*;
    use crate::eject::EjectionPolicy;
    use crate::testing::MemoryStore;

    use super::testing::running;

    fn route_of(backends: &[&Arc<Backend>]) -> ModelRoute {
        testing::route("tiny", backends.iter().map(|b| Arc::clone(b)).collect())
    }

    fn backend(id: i64, port: u16) -> Arc<Backend> {
        testing::backend("tiny", id, port)
    }

    /// Connections to an instance that answers every request on them with `ok`, taken
    /// one request each and given back.
    async fn used_connections(backend: &Backend, listener: tokio::net::TcpListener, n: usize) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        tokio::spawn(async move {
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buffer = vec![0u8; 4096];
                    while let Ok(read) = socket.read(&mut buffer).await {
                        if read == 0 {
                            return;
                        }
                        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if socket.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let request = crate::upstream::Outgoing {
            method: "POST",
            path: "/v1/completions",
            query: None,
            host: b"instance",
            headers: b"",
            body: b"",
        };
        let mut connections = Vec::new();
        for _ in 0..n {
            let mut connection = backend.connect().await.unwrap();
            connection.send(request).await.unwrap();
            while let Some(data) = std::future::poll_fn(|cx| connection.poll_body(cx)).await {
                data.unwrap();
            }
            connections.push(connection);
        }
        for connection in connections {
            backend.give_back(connection, Instant::now());
        }
    }

    #[tokio::test]
    async fn an_instance_that_leaves_routing_keeps_no_idle_connection() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let routed = backend(1, port);
        used_connections(&routed, listener, 2).await;
        assert_eq!(routed.pool.idle_count(), 2, "kept while it is routed");
        routed.leave_routing();
        assert_eq!(routed.pool.idle_count(), 0, "closed when it leaves");
        // A request under way when it left ends: its connection is closed, not kept.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let left = backend(2, listener.local_addr().unwrap().port());
        left.leave_routing();
        used_connections(&left, listener, 1).await;
        assert_eq!(left.pool.idle_count(), 0);
    }

    const EJECT_AT_ONCE: EjectionPolicy = EjectionPolicy {
        eject_after: 1,
        cooldown: Duration::from_secs(60),
    };

    #[test]
    fn an_ejected_instance_is_not_picked_while_its_model_has_another() {
        let (first, second) = (backend(1, 9001), backend(2, 9002));
        let route = route_of(&[&first, &second]);
        assert!(first.record_failure(&EJECT_AT_ONCE).is_some());
        assert!(first.is_ejected());
        for _ in 0..6 {
            assert_eq!(route.pick(&[]).unwrap().instance_id, 2);
        }
        // The other instance failed this request already: the ejected one, untried,
        // is what is left.
        assert_eq!(route.pick(&[2]).unwrap().instance_id, 1);
        // A success brings it back at once.
        assert!(first.record_success().is_some());
        let picked: HashSet<i64> = (0..4)
            .map(|_| route.pick(&[]).unwrap().instance_id)
            .collect();
        assert_eq!(picked, HashSet::from([1, 2]));
    }

    #[test]
    fn with_every_instance_ejected_the_least_bad_one_still_serves() {
        let (first, second) = (backend(1, 9001), backend(2, 9002));
        let route = route_of(&[&first, &second]);
        first.record_failure(&EJECT_AT_ONCE).unwrap();
        second.record_failure(&EJECT_AT_ONCE).unwrap();
        // The first is also stuck with a request.
        let _stuck = InFlightGuard::start(Arc::clone(&first));
        for _ in 0..4 {
            assert_eq!(route.pick(&[]).unwrap().instance_id, 2);
        }
    }

    #[test]
    fn an_instance_that_left_routing_is_never_picked_from_a_stale_route() {
        let (first, second) = (backend(1, 9001), backend(2, 9002));
        let route = route_of(&[&first, &second]);
        first.leave_routing();
        for _ in 0..4 {
            assert_eq!(route.pick(&[]).unwrap().instance_id, 2);
        }
        assert_eq!(route.pick(&[2]).unwrap().instance_id, 2);
        second.leave_routing();
        assert!(route.pick(&[]).is_none());
    }

    #[tokio::test]
    async fn a_request_waits_for_a_route_that_is_on_its_way_and_no_longer() {
        let table = Arc::new(RoutingTable::default());
        let name: Arc<str> = Arc::from("tiny");
        // Nothing comes: the wait ends at its limit with no route.
        let began = Instant::now();
        assert!(table
            .wait_for("tiny", Duration::from_millis(50))
            .await
            .is_none());
        assert!(began.elapsed() >= Duration::from_millis(50));

        // The route arrives while the request waits (the change reached this server
        // after the store already said the instance runs).
        let setter = Arc::clone(&table);
        let set_name = Arc::clone(&name);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            // Another model's route first: the waiter must keep waiting for its own.
            setter.set(
                Arc::from("other"),
                Some(Arc::new(route_of(&[&backend(9, 9009)]))),
            );
            tokio::time::sleep(Duration::from_millis(30)).await;
            setter.set(set_name, Some(Arc::new(route_of(&[&backend(1, 9001)]))));
        });
        let route = table
            .wait_for("tiny", Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(route.backends[0].instance_id, 1);

        // A miss is remembered briefly, then forgotten.
        assert!(!table.recently_missed("gone"));
        table.missed("gone");
        assert!(table.recently_missed("gone"));
        tokio::time::sleep(MISS_RECHECK).await;
        assert!(!table.recently_missed("gone"));
    }

    #[tokio::test]
    async fn the_table_signals_requests_when_an_instance_stops_running_or_moves() {
        let store = MemoryStore::new();
        let table = RoutingTable::default();
        let mut tracker = Tracker::default();
        let model = fixtures::model(1, "tiny");
        tracker
            .apply(
                &Change::Model(ChangeKind::Created, model.clone()),
                &store,
                &table,
            )
            .await;
        let instance = running(1, &model, 9001);
        tracker
            .apply(
                &Change::Instance(ChangeKind::Updated, instance.clone()),
                &store,
                &table,
            )
            .await;
        let routed = Arc::clone(&table.get("tiny").unwrap().backends[0]);

        // Reported running again at the same address: the same backend, no signal.
        tracker
            .apply(
                &Change::Instance(ChangeKind::Updated, instance.clone()),
                &store,
                &table,
            )
            .await;
        assert!(Arc::ptr_eq(
            &routed,
            &table.get("tiny").unwrap().backends[0]
        ));
        assert!(!routed.has_left_routing());

        // Restarted on another port: the old backend is signalled.
        let moved = running(1, &model, 9002);
        tracker
            .apply(
                &Change::Instance(ChangeKind::Updated, moved.clone()),
                &store,
                &table,
            )
            .await;
        assert!(routed.has_left_routing());
        let current = Arc::clone(&table.get("tiny").unwrap().backends[0]);
        assert_eq!(current.address, "127.0.0.1:9002");

        // Failing its health probe: out of the table, and a request waiting on it wakes.
        let waiter = tokio::spawn({
            let current = Arc::clone(&current);
            async move { current.left_routing().await }
        });
        let unhealthy = ModelInstance {
            state: InstanceState::Unhealthy,
            ..moved
        };
        tracker
            .apply(
                &Change::Instance(ChangeKind::Updated, unhealthy),
                &store,
                &table,
            )
            .await;
        assert!(table.get("tiny").is_none());
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();

        // A deletion signals too.
        let other = running(2, &model, 9003);
        tracker
            .apply(
                &Change::Instance(ChangeKind::Updated, other.clone()),
                &store,
                &table,
            )
            .await;
        let routed = Arc::clone(&table.get("tiny").unwrap().backends[0]);
        tracker
            .apply(
                &Change::Instance(ChangeKind::Deleted, other),
                &store,
                &table,
            )
            .await;
        assert!(routed.has_left_routing());

        // The periodic re-read signals what it no longer finds (the store holds no
        // running instance here).
        let unseen = running(3, &model, 9004);
        tracker
            .apply(
                &Change::Instance(ChangeKind::Updated, unseen),
                &store,
                &table,
            )
            .await;
        let routed = Arc::clone(&table.get("tiny").unwrap().backends[0]);
        tracker.refresh(&store, &table).await.unwrap();
        assert!(table.get("tiny").is_none());
        assert!(routed.has_left_routing());
    }

    #[tokio::test]
    async fn the_table_is_read_from_the_store_and_an_unseen_model_is_looked_up() {
        let store = MemoryStore::new();
        let mut model = fixtures::model(1, "tiny");
        model.created_at = gantry_types::Timestamp::from_millis(1_700_000_000_000);
        store.put_model(model.clone());
        store.put_instance(running(1, &model, 9001));
        let mut pending = running(2, &model, 9002);
        pending.state = InstanceState::Starting;
        store.put_instance(pending);
        let table = RoutingTable::default();
        let mut tracker = Tracker::default();

        // The re-read routes the running instance only, and knows the model's age.
        tracker.refresh(&store, &table).await.unwrap();
        let route = table.get("tiny").unwrap();
        assert_eq!(route.backends.len(), 1);
        assert_eq!(route.backends[0].instance_id, 1);
        assert_eq!(route.created, 1_700_000_000);
        assert!(table.knows("tiny"));

        // An instance of a model this tracker has not seen (created on another server):
        // the model is read from the store for its creation time.
        let mut other = fixtures::model(2, "other");
        other.created_at = gantry_types::Timestamp::from_millis(1_600_000_000_000);
        store.put_model(other.clone());
        tracker
            .apply(
                &Change::Instance(ChangeKind::Updated, running(3, &other, 9003)),
                &store,
                &table,
            )
            .await;
        assert_eq!(table.get("other").unwrap().created, 1_600_000_000);
        assert!(table.knows("other"));
    }
}
