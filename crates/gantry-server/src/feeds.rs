//! Instance changes delivered to the assignment streams of the workers they concern,
//! instead of to every stream.
//!
//! Every worker holds one `GET /api/v1/worker/assignments?watch=true` stream. Fed from the
//! store's broadcast channel, each change would wake every stream — with 10,000 workers,
//! every placement woke 10,000 tasks to throw the change away. [`AssignmentFeeds`] is a
//! change listener of the store (called inline for this server's writes and for those it
//! hears of from other servers) that hands an instance change only to the streams of
//! the worker the instance is on now and of the workers it was on before (which must be
//! told it left: the stream sends `DELETED`).
//!
//! Where an instance was is known from the changes seen since the server started and
//! from each stream's initial list ([`Feed::settle`]). Until a stream has read its
//! initial list it gets every instance change, so one that lands between subscribing and
//! reading is not lost; delivering a change to a stream it does not concern is harmless,
//! since the stream's own filter drops it. A stream that falls [`FEED_CAPACITY`] changes
//! behind is cut off (it sends `ERROR` and the worker lists again), as the broadcast
//! channel does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use gantry_store::{Change, ChangeKind};
use tokio::sync::mpsc;

/// Changes a stream may have waiting before it is cut off.
pub const FEED_CAPACITY: usize = 1024;

/// The instance changes for each worker's assignment streams.
#[derive(Debug, Default)]
pub struct AssignmentFeeds {
    inner: Mutex<Routes>,
}

#[derive(Debug, Default)]
struct Routes {
    next_id: u64,
    streams: HashMap<u64, Stream>,
    /// Streams by worker.
    by_worker: HashMap<i64, Vec<u64>>,
    /// Streams that have not read their initial list yet (they get every instance
    /// change; a handful at a time, so a change never scans every stream).
    unsettled: Vec<u64>,
    /// The workers each instance may have been sent to (where it is, where it was until
    /// a stream heard it left).
    placed_on: HashMap<i64, Vec<i64>>,
}

#[derive(Debug)]
struct Stream {
    worker_id: i64,
    sender: mpsc::Sender<Arc<Change>>,
    lagged: Arc<AtomicBool>,
}

/// One assignment stream's changes; unsubscribes when dropped.
#[derive(Debug)]
pub struct Feed {
    feeds: Arc<AssignmentFeeds>,
    id: u64,
    worker_id: i64,
    receiver: mpsc::Receiver<Arc<Change>>,
    lagged: Arc<AtomicBool>,
}

/// Why a feed gave no change.
#[derive(Debug, PartialEq, Eq)]
pub enum FeedEnd {
    /// The stream fell [`FEED_CAPACITY`] changes behind and was cut off.
    Lagged,
    /// The feeds are gone (the server is stopping).
    Closed,
}

impl AssignmentFeeds {
    /// Feeds that hear every change `store` publishes (its change listener).
    pub fn attach(store: &gantry_store::Store) -> Arc<Self> {
        let feeds = Arc::new(Self::default());
        // Weak: the listener lives inside the store, which outlives the server's state.
        let routed = Arc::downgrade(&feeds);
        store.on_change(Arc::new(move |change| {
            if let Some(feeds) = routed.upgrade() {
                feeds.on_change(change);
            }
        }));
        feeds
    }

    /// Subscribes a stream of `worker_id`. Subscribe before reading the initial list,
    /// then [`Feed::settle`] with it.
    pub fn subscribe(self: &Arc<Self>, worker_id: i64) -> Feed {
        let (sender, receiver) = mpsc::channel(FEED_CAPACITY);
        let lagged = Arc::new(AtomicBool::new(false));
        let mut routes = self.lock();
        let id = routes.next_id;
        routes.next_id += 1;
        routes.streams.insert(
            id,
            Stream {
                worker_id,
                sender,
                lagged: Arc::clone(&lagged),
            },
        );
        routes.by_worker.entry(worker_id).or_default().push(id);
        routes.unsettled.push(id);
        Feed {
            feeds: Arc::clone(self),
            id,
            worker_id,
            receiver,
            lagged,
        }
    }

    /// Routes one committed change (the store's change listener).
    pub fn on_change(&self, change: &Arc<Change>) {
        let Change::Instance(kind, instance) = change.as_ref() else {
            return;
        };
        let mut routes = self.lock();
        let Routes {
            streams,
            by_worker,
            unsettled,
            placed_on,
            ..
        } = &mut *routes;
        let now_on = instance.worker_id.filter(|_| *kind != ChangeKind::Deleted);
        let before = match now_on {
            Some(worker) => placed_on.insert(instance.id, vec![worker]),
            None => placed_on.remove(&instance.id),
        }
        .unwrap_or_default();
        let mut targets: Vec<u64> = Vec::new();
        for worker in now_on.iter().chain(before.iter()) {
            for id in by_worker.get(worker).into_iter().flatten() {
                if !targets.contains(id) {
                    targets.push(*id);
                }
            }
        }
        for id in unsettled.iter() {
            if !targets.contains(id) {
                targets.push(*id);
            }
        }
        let mut cut_off = Vec::new();
        for id in targets {
            let Some(stream) = streams.get(&id) else {
                continue;
            };
            match stream.sender.try_send(Arc::clone(change)) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    stream.lagged.store(true, Ordering::Release);
                    cut_off.push(id);
                }
                // The stream is going away; its Drop unsubscribes it.
                Err(mpsc::error::TrySendError::Closed(_)) => {}
            }
        }
        for id in cut_off {
            remove(&mut routes, id);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Routes> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Streams subscribed now (for tests and metrics).
    pub fn streams(&self) -> usize {
        self.lock().streams.len()
    }
}

fn remove(routes: &mut Routes, id: u64) {
    routes.unsettled.retain(|other| *other != id);
    let Some(stream) = routes.streams.remove(&id) else {
        return;
    };
    if let Some(ids) = routes.by_worker.get_mut(&stream.worker_id) {
        ids.retain(|other| *other != id);
        if ids.is_empty() {
            routes.by_worker.remove(&stream.worker_id);
        }
    }
}

impl Feed {
    /// The stream has read its initial list (`instances`, all placed on its worker):
    /// from now on it gets only the changes of its worker's instances.
    pub fn settle(&self, instances: impl IntoIterator<Item = i64>) {
        let mut routes = self.feeds.lock();
        for instance in instances {
            let workers = routes.placed_on.entry(instance).or_default();
            if !workers.contains(&self.worker_id) {
                workers.push(self.worker_id);
            }
        }
        routes.unsettled.retain(|other| *other != self.id);
    }

    /// The next change for this stream.
    pub async fn recv(&mut self) -> Result<Arc<Change>, FeedEnd> {
        match self.receiver.recv().await {
            Some(change) => Ok(change),
            None if self.lagged.load(Ordering::Acquire) => Err(FeedEnd::Lagged),
            None => Err(FeedEnd::Closed),
        }
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        remove(&mut self.feeds.lock(), self.id);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use gantry_types::{fixtures, InstanceState, ModelInstance};

    use super::*;

    fn instance(id: i64, worker: Option<i64>) -> ModelInstance {
        let model = fixtures::model(1, "m");
        let mut instance = fixtures::instance(
            id,
            &model,
            u32::try_from(id).unwrap(),
            InstanceState::Scheduled,
        );
        instance.worker_id = worker;
        instance
    }

    fn change(kind: ChangeKind, id: i64, worker: Option<i64>) -> Arc<Change> {
        Arc::new(Change::Instance(kind, instance(id, worker)))
    }

    /// The instance ids (and their worker) waiting in a feed.
    fn drain(feed: &mut Feed) -> Vec<(i64, Option<i64>)> {
        let mut seen = Vec::new();
        while let Ok(change) = feed.receiver.try_recv() {
            let (_, instance) = change.instance().unwrap();
            seen.push((instance.id, instance.worker_id));
        }
        seen
    }

    #[test]
    fn a_change_reaches_the_worker_it_is_on_and_the_worker_it_left() {
        let feeds = Arc::new(AssignmentFeeds::default());
        let (mut one, mut two, mut three) =
            (feeds.subscribe(1), feeds.subscribe(2), feeds.subscribe(3));
        // Worker 1 already runs instance 10 (its initial list).
        one.settle([10]);
        two.settle([]);
        three.settle([]);

        feeds.on_change(&change(ChangeKind::Created, 20, None));
        feeds.on_change(&change(ChangeKind::Updated, 20, Some(2)));
        assert_eq!(drain(&mut one), vec![]);
        assert_eq!(drain(&mut two), vec![(20, Some(2))]);
        assert_eq!(drain(&mut three), vec![]);

        // Instance 10 moves from worker 1 to worker 3: both hear of it, 2 does not.
        feeds.on_change(&change(ChangeKind::Updated, 10, Some(3)));
        assert_eq!(drain(&mut one), vec![(10, Some(3))]);
        assert_eq!(drain(&mut two), vec![]);
        assert_eq!(drain(&mut three), vec![(10, Some(3))]);
        // Later changes of 10 reach only worker 3.
        feeds.on_change(&change(ChangeKind::Updated, 10, Some(3)));
        assert_eq!(drain(&mut one), vec![]);
        assert_eq!(drain(&mut three), vec![(10, Some(3))]);

        // Unplaced, then deleted: the worker it was on hears both, nobody else.
        feeds.on_change(&change(ChangeKind::Updated, 20, None));
        assert_eq!(drain(&mut two), vec![(20, None)]);
        feeds.on_change(&change(ChangeKind::Deleted, 10, Some(3)));
        assert_eq!(drain(&mut three), vec![(10, Some(3))]);
        assert_eq!(drain(&mut one), vec![]);
    }

    #[test]
    fn an_unsettled_stream_gets_every_instance_change_and_a_dropped_one_none() {
        let feeds = Arc::new(AssignmentFeeds::default());
        let mut reading = feeds.subscribe(1);
        // Between subscribing and reading its list: changes of other workers' instances
        // arrive too (one of them might be leaving this worker).
        feeds.on_change(&change(ChangeKind::Updated, 7, Some(5)));
        assert_eq!(drain(&mut reading), vec![(7, Some(5))]);
        reading.settle([]);
        feeds.on_change(&change(ChangeKind::Updated, 7, Some(5)));
        assert_eq!(drain(&mut reading), vec![]);

        drop(reading);
        assert_eq!(feeds.streams(), 0);
        // Other kinds of change reach nobody.
        let mut other = feeds.subscribe(5);
        other.settle([]);
        feeds.on_change(&Arc::new(Change::Model(
            ChangeKind::Updated,
            fixtures::model(1, "m"),
        )));
        assert_eq!(drain(&mut other), vec![]);
    }

    #[tokio::test]
    async fn a_stream_that_falls_behind_is_cut_off_and_says_so() {
        let feeds = Arc::new(AssignmentFeeds::default());
        let mut slow = feeds.subscribe(1);
        slow.settle([]);
        for _ in 0..=FEED_CAPACITY {
            feeds.on_change(&change(ChangeKind::Updated, 3, Some(1)));
        }
        assert_eq!(feeds.streams(), 0, "cut off");
        for _ in 0..FEED_CAPACITY {
            assert!(slow.recv().await.is_ok());
        }
        assert_eq!(slow.recv().await.unwrap_err(), FeedEnd::Lagged);
    }
}
