//! The worker agent's endpoints, called with the worker's credential (registration with
//! the cluster's registration token the first time).

use gantry_types::{
    InstanceStateReport, ModelInstance, Worker, WorkerRegister, WorkerRegistered, WorkerStatus,
};
use reqwest::{Method, StatusCode};

use crate::transport::{decode, Call};
use crate::watch::WATCH_UPGRADE;
use crate::{Client, ClientError, WatchStream};

/// Only `watch=true`: the assignment stream has no other filter.
#[derive(serde::Serialize)]
struct Watch {
    watch: bool,
}

impl Client {
    /// Registers a worker with `token` (the registration token, or the worker's own
    /// credential to register again). `true` when the worker is new.
    pub async fn register_worker(
        &self,
        token: &str,
        request: &WorkerRegister,
    ) -> Result<(WorkerRegistered, bool), ClientError> {
        let mut call = Call::new(Method::POST, "/api/v1/workers/register")
            .body(request)
            .bearer(token)
            .answering(&[StatusCode::OK, StatusCode::CREATED]);
        call.timeout = Some(crate::transport::DEFAULT_TIMEOUT);
        let response = self.send(call).await?;
        let created = response.status() == StatusCode::CREATED;
        Ok((decode(response).await?, created))
    }

    /// Records a heartbeat of the calling worker.
    pub async fn heartbeat(&self) -> Result<Worker, ClientError> {
        self.json(Call::new(Method::POST, "/api/v1/worker/heartbeat"))
            .await
    }

    /// Records a heartbeat, giving each server `timeout` to answer before the next one is
    /// tried: a server that hangs (stopped, overloaded, cut off) is left within one
    /// heartbeat instead of after the default timeout.
    /// [`Client::heartbeat_within`] with how busy the worker is, which the server keeps
    /// (its history); also answers how long to wait before the next sample (the server's
    /// `x-gantry-sample-interval`), when it says.
    pub async fn heartbeat_with_sample(
        &self,
        timeout: std::time::Duration,
        sample: &gantry_types::WorkerSample,
    ) -> Result<(Worker, Option<std::time::Duration>), ClientError> {
        let body = gantry_types::WorkerHeartbeat {
            sample: Some(sample.clone()),
        };
        let mut call = Call::new(Method::POST, "/api/v1/worker/heartbeat").body(&body);
        call.timeout = Some(timeout);
        let response = self.send(call).await?;
        let every = response
            .headers()
            .get(gantry_types::worker::SAMPLE_INTERVAL_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .map(std::time::Duration::from_secs);
        Ok((crate::transport::decode(response).await?, every))
    }

    /// With `sample`, the server keeps how busy the worker is (its history).
    pub async fn heartbeat_within(
        &self,
        timeout: std::time::Duration,
        sample: Option<&gantry_types::WorkerSample>,
    ) -> Result<Worker, ClientError> {
        let call = Call::new(Method::POST, "/api/v1/worker/heartbeat");
        let Some(sample) = sample else {
            let mut call = call;
            call.timeout = Some(timeout);
            return self.json(call).await;
        };
        let body = gantry_types::WorkerHeartbeat {
            sample: Some(sample.clone()),
        };
        let mut call = call.body(&body);
        call.timeout = Some(timeout);
        self.json(call).await
    }

    /// The active servers of the cluster, lowest load score first.
    pub async fn worker_servers(&self) -> Result<gantry_types::ServerDirectory, ClientError> {
        self.json(Call::new(Method::GET, "/api/v1/worker/servers"))
            .await
    }

    /// Stores the calling worker's hardware report.
    pub async fn report_status(&self, status: &WorkerStatus) -> Result<Worker, ClientError> {
        self.json(Call::new(Method::PUT, "/api/v1/worker/status").body(status))
            .await
    }

    /// Where to download a complete upload: its name, size, SHA-256 and a signed URL,
    /// made absolute (a path is joined with the URL of the server that answered).
    pub async fn staged_upload(&self, id: i64) -> Result<gantry_types::StagedUpload, ClientError> {
        let response = self
            .send(Call::new(
                Method::GET,
                &format!("/api/v1/worker/uploads/{id}"),
            ))
            .await?;
        let origin = response.url().origin().ascii_serialization();
        let mut staged: gantry_types::StagedUpload = decode(response).await?;
        if staged.url.starts_with('/') {
            staged.url = format!("{origin}{}", staged.url);
        }
        Ok(staged)
    }

    /// The instances placed on the calling worker, each with what it runs.
    pub async fn assignments(&self) -> Result<Vec<ModelInstance>, ClientError> {
        self.json(Call::new(Method::GET, "/api/v1/worker/assignments"))
            .await
    }

    /// The assignments and their changes; `DELETED` when an instance leaves this worker.
    /// Asks for the stream on the bare connection (`Upgrade: gantry-watch`), which costs
    /// the server less for a stream it holds as long as the worker runs; a server that
    /// answers as usual is read as usual.
    pub async fn watch_assignments(&self) -> Result<WatchStream<ModelInstance>, ClientError> {
        let response = self
            .send(
                Call::new(Method::GET, "/api/v1/worker/assignments")
                    .query(&Watch { watch: true })
                    .streaming()
                    .upgrading(WATCH_UPGRADE),
            )
            .await?;
        WatchStream::open(response).await
    }

    /// Reports the state of an instance placed on the calling worker.
    pub async fn report_state(
        &self,
        instance_id: i64,
        report: &InstanceStateReport,
    ) -> Result<ModelInstance, ClientError> {
        let path = format!("/api/v1/worker/instances/{instance_id}/state");
        self.json(Call::new(Method::POST, &path).body(report)).await
    }

    /// The calling worker is going away (it is marked `not_ready`).
    pub async fn goodbye(&self) -> Result<(), ClientError> {
        self.empty(Call::new(Method::POST, "/api/v1/worker/goodbye"))
            .await
    }
}
