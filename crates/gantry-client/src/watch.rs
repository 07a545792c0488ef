//! A `?watch=true` answer as a stream of typed watch events.

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::pin::Pin;

use bytes::BytesMut;
use futures_util::{Stream, StreamExt};
use gantry_types::WatchEvent;
use serde::de::DeserializeOwned;

use crate::error::ClientError;

type Chunks = Pin<Box<dyn Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>;

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
    pub(crate) fn new(response: reqwest::Response) -> Self {
        WatchStream {
            url: response.url().to_string(),
            chunks: Box::pin(response.bytes_stream()),
            buffer: BytesMut::new(),
            ready: VecDeque::new(),
            done: false,
            _items: PhantomData,
        }
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
