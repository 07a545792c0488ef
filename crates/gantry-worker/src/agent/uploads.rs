//! Where this worker downloads `upload` sources from: it asks the server it talks to for
//! a signed URL of the file (`GET /api/v1/worker/uploads/{id}`), through the client that
//! fails over between servers.

use futures_util::future::BoxFuture;
use gantry_client::{Client, ClientError};
use gantry_source::{SourceError, StagedFiles};
use gantry_types::StagedUpload;

pub(crate) struct ServerUploads {
    pub client: Client,
}

impl StagedFiles for ServerUploads {
    fn describe(&self, id: i64) -> BoxFuture<'_, Result<StagedUpload, SourceError>> {
        Box::pin(async move {
            self.client.staged_upload(id).await.map_err(|e| match e {
                ClientError::Unreachable { .. } => {
                    SourceError::Unavailable(format!("cannot ask a server for upload {id}: {e}"))
                }
                e => SourceError::Invalid(format!("upload {id}: {e}")),
            })
        })
    }
}
