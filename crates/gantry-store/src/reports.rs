//! Workers' instance state reports, written together when they arrive together (group
//! commit).
//!
//! A fleet that starts many instances at once reports each of them `starting` and then
//! `running` within seconds: two single-row `UPDATE`s per instance, each a statement and
//! a commit of its own, which on PostgreSQL compete for the database with the scheduler
//! writing the rest of the placements. So reports queue
//! here, and one task at a time writes whatever has queued (up to
//! [`MOST_PER_STATEMENT`]) as one `UPDATE … FROM (VALUES …)`, then answers each report.
//! A report that finds no write under way is written at once, alone: nothing waits for
//! company, and the statements grow only while the database is the bottleneck.
//!
//! * Each report is judged on its own row: it applies only while the instance is placed
//!   on the reporting worker, and one that does not is `NotFound`, as when written alone.
//! * An instance appears at most once per statement; a second report of it waits for the
//!   next statement, so the reports of one instance apply in the order they came.
//! * A statement that fails is tried again report by report, so that each report gets
//!   its own answer and one bad report does not fail the others.
//! * The writes run in a task of their own: a caller that goes away (its client
//!   disconnected) leaves the others' reports written and answered.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;

use gantry_types::{InstanceStateReport, ModelInstance, Timestamp};
use tokio::sync::oneshot;

use crate::changes::{Change, ChangeKind};
use crate::instances::{decode, RETURNING};
use crate::rows::to_json;
use crate::scheduling::values_rows;
use crate::{Store, StoreError};

/// Most reports in one statement (ten parameters each).
pub(crate) const MOST_PER_STATEMENT: usize = 64;

/// Reports waiting for their statement, and whether a task is writing.
#[derive(Default)]
pub(crate) struct ReportQueue {
    state: Mutex<QueueState>,
}

#[derive(Default)]
struct QueueState {
    waiting: VecDeque<Queued>,
    /// A writer task is running; it takes whatever is waiting until nothing is.
    writing: bool,
}

/// One report and where its answer goes.
struct Queued {
    id: i64,
    worker_id: i64,
    report: InstanceStateReport,
    answer: oneshot::Sender<Result<ModelInstance, StoreError>>,
}

impl Queued {
    /// Sends the report its answer: the instance as its statement wrote it, else why not.
    fn answer(self, written: Result<&HashMap<i64, ModelInstance>, StoreError>) {
        let outcome = written.and_then(|written| {
            written
                .get(&self.id)
                .cloned()
                .ok_or_else(|| not_placed_there(self.id, self.worker_id))
        });
        let _ = self.answer.send(outcome);
    }
}

impl ReportQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        // The state is a queue and a flag, consistent after every statement that
        // changes it: a panic elsewhere leaves nothing half done.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues a report; `true` when no writer is running, so the caller starts one.
    fn push(&self, queued: Queued) -> bool {
        let mut state = self.lock();
        state.waiting.push_back(queued);
        !std::mem::replace(&mut state.writing, true)
    }

    /// The next statement's reports: the oldest waiting ones, up to the limit, and
    /// stopping before a second report of an instance already taken.
    fn next_batch(&self) -> Vec<Queued> {
        let mut state = self.lock();
        let mut ids = HashSet::new();
        let mut batch = Vec::new();
        while batch.len() < MOST_PER_STATEMENT {
            match state.waiting.front() {
                Some(front) if ids.insert(front.id) => {
                    batch.extend(state.waiting.pop_front());
                }
                _ => break,
            }
        }
        if batch.is_empty() {
            state.writing = false;
        }
        batch
    }
}

/// A writer task's turn. It ends when [`WriterTurn::next_batch`] finds nothing waiting
/// (the flag is cleared under the same lock, so a report queued after that starts a new
/// writer). Should the task end any other way (the runtime shutting down, a panic), the
/// drop ends it: what waits is dropped, whose callers then hear that the writer stopped,
/// and the flag is cleared so that the next report starts a writer. A turn that ended
/// normally touches nothing when dropped: by then another writer may own the queue.
struct WriterTurn<'a> {
    queue: &'a ReportQueue,
    ended: bool,
}

impl<'a> WriterTurn<'a> {
    fn new(queue: &'a ReportQueue) -> Self {
        WriterTurn {
            queue,
            ended: false,
        }
    }

    /// The next statement's reports, or `None` (and the turn over) when none wait.
    fn next_batch(&mut self) -> Option<Vec<Queued>> {
        let batch = self.queue.next_batch();
        if batch.is_empty() {
            self.ended = true;
            return None;
        }
        Some(batch)
    }
}

impl Drop for WriterTurn<'_> {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let mut state = self.queue.lock();
        state.writing = false;
        state.waiting.clear();
    }
}

impl Store {
    /// Applies a worker's report about an instance placed on it. `NotFound` when the
    /// instance does not exist or is no longer placed on that worker (a late report
    /// from a worker the instance was moved away from changes nothing). Reports that
    /// arrive while others are being written are written together (see `reports.rs`).
    pub async fn report_instance_state(
        &self,
        id: i64,
        worker_id: i64,
        report: &InstanceStateReport,
    ) -> Result<ModelInstance, StoreError> {
        let (answer, answered) = oneshot::channel();
        let start_writer = self.reports.push(Queued {
            id,
            worker_id,
            report: report.clone(),
            answer,
        });
        if start_writer {
            tokio::spawn(self.clone().write_reports());
        }
        answered.await.unwrap_or_else(|_| {
            Err(StoreError::Unreachable(
                "the writer of instance reports stopped (the server is shutting down)".into(),
            ))
        })
    }

    /// Writes what waits, a statement at a time, until nothing does.
    async fn write_reports(self) {
        let queue = std::sync::Arc::clone(&self.reports);
        let mut turn = WriterTurn::new(&queue);
        loop {
            // Reports that come meanwhile join the next statement.
            self.write_priority.yield_to_leader().await;
            let Some(batch) = turn.next_batch() else {
                return;
            };
            self.write_report_batch(batch).await;
        }
    }

    /// Writes `batch` as one statement and answers each report; if the statement fails
    /// and holds several, each report is written again on its own, for its own answer.
    async fn write_report_batch(&self, batch: Vec<Queued>) {
        match self.write_report_statement(&batch).await {
            Ok(written) => {
                for queued in batch {
                    queued.answer(Ok(&written));
                }
            }
            Err(e) if batch.len() > 1 => {
                tracing::warn!(
                    reports = batch.len(),
                    error = %e,
                    "writing instance reports together failed; writing them one by one"
                );
                for queued in batch {
                    match self
                        .write_report_statement(std::slice::from_ref(&queued))
                        .await
                    {
                        Ok(written) => queued.answer(Ok(&written)),
                        Err(e) => queued.answer(Err(e)),
                    }
                }
            }
            Err(e) => {
                if let Some(queued) = batch.into_iter().next() {
                    queued.answer(Err(e));
                }
            }
        }
    }

    /// One statement for every report of `batch` (an instance at most once): the instances
    /// written, by id, each published.
    async fn write_report_statement(
        &self,
        batch: &[Queued],
    ) -> Result<HashMap<i64, ModelInstance>, StoreError> {
        let sql = format!(
            "UPDATE model_instances SET state = v.column3, state_message = v.column4, \
             port = v.column5, address = v.column6, restart_count = v.column7, \
             updated_at = $1, download = v.column8, install = v.column9, \
             backend_version = COALESCE(v.column10, model_instances.backend_version) \
             FROM (VALUES {}) AS v \
             WHERE model_instances.id = v.column1 AND model_instances.worker_id = v.column2 \
             RETURNING {RETURNING}",
            values_rows(
                batch.len(),
                &[
                    "BIGINT", "BIGINT", "TEXT", "TEXT", "BIGINT", "TEXT", "BIGINT", "TEXT", "TEXT",
                    "TEXT"
                ],
                2
            )
        );
        let query = batch.iter().fold(
            sqlx::query(&sql).bind(Timestamp::now().as_millis()),
            |query, queued| {
                let report = &queued.report;
                query
                    .bind(queued.id)
                    .bind(queued.worker_id)
                    .bind(report.state.as_str())
                    .bind(report.state_message.as_str())
                    .bind(report.port.map(i64::from))
                    .bind(report.address.as_deref())
                    .bind(i64::from(report.restart_count))
                    .bind(report.download.map(|d| to_json(&d)))
                    .bind(report.install.as_ref().map(to_json))
                    .bind(report.backend_version.as_deref())
            },
        );
        let began = std::time::Instant::now();
        let rows = query.fetch_all(&self.writes).await?;
        tracing::debug!(
            reports = batch.len(),
            written = rows.len(),
            ms = began.elapsed().as_secs_f64() * 1e3,
            "instance reports written together"
        );
        let mut written = HashMap::with_capacity(rows.len());
        for row in &rows {
            let instance = decode(row)?;
            written.insert(instance.id, instance);
        }
        // Published in the order the reports came.
        for queued in batch {
            if let Some(instance) = written.get(&queued.id) {
                self.publish(Change::Instance(ChangeKind::Updated, instance.clone()));
            }
        }
        Ok(written)
    }
}

fn not_placed_there(id: i64, worker_id: i64) -> StoreError {
    StoreError::not_found("model instance", format!("{id} on worker {worker_id}"))
}

#[cfg(test)]
mod tests {
    use gantry_types::InstanceState;

    use super::*;

    fn queued(id: i64) -> (Queued, oneshot::Receiver<Result<ModelInstance, StoreError>>) {
        let (answer, answered) = oneshot::channel();
        let queued = Queued {
            id,
            worker_id: 1,
            report: InstanceStateReport::new(InstanceState::Running, ""),
            answer,
        };
        (queued, answered)
    }

    /// A report queued just after a writer found the queue empty, but before that
    /// writer's task ended, belongs to the next writer: the first one's end must
    /// neither drop it nor clear the flag the next writer runs under; otherwise the
    /// report's caller gets "the writer of instance reports stopped" (a 503), and two
    /// writers can run at once.
    #[test]
    fn a_writer_that_ends_leaves_the_next_writers_reports_alone() {
        let queue = ReportQueue::default();
        let (first, _first_answer) = queued(1);
        assert!(queue.push(first), "the first report starts a writer");
        let mut turn = WriterTurn::new(&queue);
        assert_eq!(turn.next_batch().map(|batch| batch.len()), Some(1));
        assert!(turn.next_batch().is_none(), "nothing else waits");
        let (second, mut second_answer) = queued(2);
        assert!(queue.push(second), "the writer has ended: a new one starts");
        drop(turn);
        assert!(
            matches!(
                second_answer.try_recv(),
                Err(oneshot::error::TryRecvError::Empty)
            ),
            "the report is still waiting for its writer"
        );
        let state = queue.lock();
        assert_eq!(state.waiting.len(), 1);
        assert!(state.writing, "the new writer's flag stays set");
    }

    /// A writer task that ends without finishing (a panic, the runtime shutting down)
    /// answers what waits with an error and lets the next report start a writer.
    #[test]
    fn a_writer_that_stops_midway_releases_the_queue() {
        let queue = ReportQueue::default();
        let (first, _first_answer) = queued(1);
        let (second, mut second_answer) = queued(2);
        assert!(queue.push(first));
        assert!(!queue.push(second), "one writer at a time");
        let mut turn = WriterTurn::new(&queue);
        let batch = turn.next_batch().expect("two reports wait");
        assert_eq!(batch.len(), 2);
        let (third, mut third_answer) = queued(3);
        assert!(!queue.push(third));
        drop(turn);
        assert!(matches!(
            third_answer.try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        ));
        drop(batch);
        assert!(matches!(
            second_answer.try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        ));
        let (fourth, _fourth_answer) = queued(4);
        assert!(queue.push(fourth), "the next report starts a writer");
    }
}
