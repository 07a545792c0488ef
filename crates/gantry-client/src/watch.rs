//! A `?watch=true` answer as a stream of typed watch events.

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::pin::Pin;

use bytes::BytesMut;
use futures_util::{Stream, StreamExt};
use gantry_types::WatchEvent;
use serde::de::DeserializeOwned;
use tokio_util::io::ReaderStream;

use crate::error::ClientError;

type Chunks = Pin<Box<dyn Stream<Item = Result<bytes::Bytes, String>> + Send>>;

/// The `Upgrade` protocol of a watch on the bare connection (the server's
/// `api::watch::UPGRADE_PROTOCOL`): after `101 Switching Protocols` the same NDJSON lines
/// follow without HTTP framing, until the connection closes.
pub const WATCH_UPGRADE: &str = "gantry-watch";

/// The events of one watch stream, in order. It ends when the server closes the stream;
/// an `ERROR` event is the last one the server sends.
pub struct WatchStream<T> {
    url: String,
    chunks: Chunks,
    buffer: BytesMut,
    ready: VecDeque<Result<WatchEvent<T>, ClientError>>,
    done: bool,
    _items: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for WatchStream<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchStream")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl<T: DeserializeOwned> WatchStream<T> {
    /// The stream of a successful watch answer: its body, or after `101 Switching
    /// Protocols` the connection itself.
    pub(crate) async fn open(response: reqwest::Response) -> Result<Self, ClientError> {
        let url = response.url().to_string();
        let chunks: Chunks = if response.status() == reqwest::StatusCode::SWITCHING_PROTOCOLS {
            let connection = response.upgrade().await.map_err(|e| ClientError::Decode {
                url: url.clone(),
                message: format!("the watch connection could not be taken over: {e}"),
            })?;
            Box::pin(ReaderStream::new(connection).map(|chunk| chunk.map_err(|e| e.to_string())))
        } else {
            Box::pin(
                response
                    .bytes_stream()
                    .map(|chunk| chunk.map_err(|e| e.to_string())),
            )
        };
        Ok(WatchStream {
            url,
            chunks,
            buffer: BytesMut::new(),
            ready: VecDeque::new(),
            done: false,
            _items: PhantomData,
        })
    }

    /// The next event; `None` once the server closed the stream. A line that does not
    /// decode is an `Err` and the stream goes on.
    pub async fn next(&mut self) -> Option<Result<WatchEvent<T>, ClientError>> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Some(event);
            }
            if self.done {
                return None;
            }
            match self.chunks.next().await {
                None => self.done = true,
                Some(Err(e)) => {
                    self.done = true;
                    return Some(Err(ClientError::Decode {
                        url: self.url.clone(),
                        message: format!("the stream broke: {e}"),
                    }));
                }
                Some(Ok(chunk)) => {
                    self.buffer.extend_from_slice(&chunk);
                    while let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
                        let line = self.buffer.split_to(end + 1);
                        let line = &line[..end];
                        if line.iter().all(u8::is_ascii_whitespace) {
                            continue;
                        }
                        self.ready
                            .push_back(serde_json::from_slice(line).map_err(|e| {
                                ClientError::Decode {
                                    url: self.url.clone(),
                                    message: format!("a watch line that is not an event: {e}"),
                                }
                            }));
                    }
                }
            }
        }
    }
}
