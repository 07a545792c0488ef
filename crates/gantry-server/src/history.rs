//! How busy each worker was over the last hour: the samples its heartbeats carry, kept in
//! memory by the server that received them (no table: an hour of load is not worth a
//! write per heartbeat). Bounded: at most one sample per [`SPACING`] per worker, none
//! older than [`KEPT_FOR`] — about 360 samples, some 120 KiB for an 8-GPU worker — and
//! never more than [`MAX_SAMPLES`] in all: with more than 333 workers the spacing grows
//! with their number (10,000 workers: one sample per 5 minutes each), so the history
//! stays under about 40 MiB at any size of cluster.
//!
//! With several servers a worker's heartbeats go to one of them at a time, so each server
//! holds the part of the hour it heard; `GET /api/v1/workers/{id}/history` gathers the
//! parts from every active server.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use gantry_types::{Timestamp, WorkerSample};

/// How long samples are kept.
pub const KEPT_FOR: Duration = Duration::from_secs(3600);
/// The least time between two samples kept of one worker: heartbeats closer together
/// than this only replace nothing.
pub const SPACING: Duration = Duration::from_secs(10);
/// The most samples kept for all workers together.
pub const MAX_SAMPLES: usize = 120_000;
/// How often workers that stopped sending are forgotten.
const PRUNE_EVERY: Duration = Duration::from_secs(600);

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

#[derive(Default)]
struct Samples {
    by_worker: HashMap<i64, VecDeque<WorkerSample>>,
    pruned_at: i64,
}

/// Every worker's recent samples.
#[derive(Default)]
pub struct WorkerHistories {
    inner: Mutex<Samples>,
}

impl std::fmt::Debug for WorkerHistories {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerHistories")
            .field("workers", &self.lock().by_worker.len())
            .finish()
    }
}

impl WorkerHistories {
    fn lock(&self) -> std::sync::MutexGuard<'_, Samples> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `sample` of `worker_id`, received `now`, unless the last one kept is less
    /// than [`SPACING`] old.
    pub fn record(&self, worker_id: i64, mut sample: WorkerSample, now: Timestamp) {
        let now_ms = now.as_millis();
        let oldest = now_ms - millis(KEPT_FOR);
        let mut inner = self.lock();
        if now_ms - inner.pruned_at > millis(PRUNE_EVERY) {
            inner.pruned_at = now_ms;
            inner.by_worker.retain(|_, samples| {
                samples
                    .back()
                    .and_then(|last| last.at)
                    .is_some_and(|at| at.as_millis() >= oldest)
            });
        }
        let spacing = spacing_for(inner.by_worker.len().max(1));
        let samples = inner.by_worker.entry(worker_id).or_default();
        let last = samples.back().and_then(|s| s.at).map(|at| at.as_millis());
        if last.is_some_and(|last| now_ms - last < millis(spacing)) {
            return;
        }
        while samples
            .front()
            .and_then(|s| s.at)
            .is_some_and(|at| at.as_millis() < oldest)
        {
            samples.pop_front();
        }
        sample.at = Some(now);
        samples.push_back(sample);
    }

    /// The samples of `worker_id` of the last [`KEPT_FOR`] before `now`, oldest first.
    pub fn of(&self, worker_id: i64, now: Timestamp) -> Vec<WorkerSample> {
        let oldest = now.as_millis() - millis(KEPT_FOR);
        self.lock()
            .by_worker
            .get(&worker_id)
            .map(|samples| {
                samples
                    .iter()
                    .filter(|s| s.at.is_some_and(|at| at.as_millis() >= oldest))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The spacing of samples for the workers heard now ([`spacing_for`]).
    pub fn spacing(&self) -> Duration {
        spacing_for(self.lock().by_worker.len().max(1))
    }

    /// Forgets a worker (it was deleted).
    pub fn forget(&self, worker_id: i64) {
        self.lock().by_worker.remove(&worker_id);
    }
}

/// The least time between two samples of one worker kept when `workers` send them: at
/// least [`SPACING`], more when keeping that many would exceed [`MAX_SAMPLES`].
pub fn spacing_for(workers: usize) -> Duration {
    let per_worker = (MAX_SAMPLES / workers).max(1) as u32;
    (KEPT_FOR / per_worker).max(SPACING)
}

/// Merges the parts of a worker's hour that several servers hold, oldest first, one sample
/// per time.
pub fn merge(parts: impl IntoIterator<Item = Vec<WorkerSample>>) -> Vec<WorkerSample> {
    let mut all: Vec<WorkerSample> = parts.into_iter().flatten().collect();
    all.sort_by_key(|s| s.at.map(|at| at.as_millis()));
    all.dedup_by_key(|s| s.at.map(|at| at.as_millis()));
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(memory_used: u64) -> WorkerSample {
        WorkerSample {
            memory_used,
            ..Default::default()
        }
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_millis(1_000_000_000 + seconds * 1000)
    }

    #[test]
    fn samples_are_spaced_and_kept_for_an_hour() {
        let histories = WorkerHistories::default();
        for second in (0..4000).step_by(5) {
            histories.record(1, sample(second as u64), at(second));
        }
        let kept = histories.of(1, at(4000));
        // One per 10 s, the last hour only.
        assert_eq!(kept.len(), 360);
        assert_eq!(kept[0].at, Some(at(400)));
        assert_eq!(kept.last().unwrap().at, Some(at(3990)));
        assert!(kept
            .windows(2)
            .all(|w| w[1].at.unwrap().as_millis() - w[0].at.unwrap().as_millis() == 10_000));
        assert!(histories.of(2, at(4000)).is_empty());
    }

    #[test]
    fn the_spacing_grows_with_the_fleet_to_keep_the_total_bounded() {
        assert_eq!(spacing_for(1), SPACING);
        assert_eq!(spacing_for(333), SPACING);
        assert_eq!(spacing_for(1_000), Duration::from_secs(30));
        assert_eq!(spacing_for(10_000), Duration::from_secs(300));
        for workers in [1, 10, 500, 2_000, 10_000, 100_000] {
            let per_worker = KEPT_FOR.as_secs() / spacing_for(workers).as_secs();
            assert!(
                per_worker as usize * workers <= MAX_SAMPLES.max(workers),
                "{workers}"
            );
        }
    }

    #[test]
    fn silent_workers_are_forgotten_and_parts_merge_in_order() {
        let histories = WorkerHistories::default();
        histories.record(1, sample(1), at(0));
        histories.record(2, sample(2), at(4000));
        // The prune ran at the second record: worker 1 has said nothing for over an hour.
        assert!(!histories.inner.lock().unwrap().by_worker.contains_key(&1));
        histories.forget(2);
        assert!(histories.of(2, at(4000)).is_empty());

        let mut a = sample(1);
        a.at = Some(at(20));
        let mut b = sample(2);
        b.at = Some(at(10));
        let merged = merge([vec![a.clone()], vec![b.clone(), a.clone()]]);
        assert_eq!(merged, vec![b, a]);
    }
}
