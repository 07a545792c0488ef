//! The OpenAI-compatible gateway (`/v1/…`), as far as gantry's own tools call it: a chat
//! completion streamed as server-sent events (`data: {…}` lines, then `data: [DONE]`),
//! read as the pieces of text the model writes.
//!
//! The gateway passes the backend's answer through as it comes; these types name only
//! the fields the client reads, so what else a backend adds does not matter.

use std::pin::Pin;

use bytes::BytesMut;
use futures_util::{Stream, StreamExt};
use reqwest::Method;
use serde::{Deserialize, Serialize};

use crate::transport::Call;
use crate::{Client, ClientError};

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn user(content: impl Into<String>) -> Self {
        Self {
            role: "user".to_owned(),
            content: content.into(),
        }
    }

    pub fn assistant(content: impl Into<String>) -> Self {
        Self {
            role: "assistant".to_owned(),
            content: content.into(),
        }
    }
}

/// `POST /v1/chat/completions`, streamed (the client sets `stream`).
#[derive(Debug, Clone, Serialize)]
pub struct ChatRequest {
    /// The model's name.
    pub model: String,
    pub messages: Vec<ChatMessage>,
    /// The most tokens to generate; the backend's default when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    stream: bool,
}

impl ChatRequest {
    pub fn new(model: impl Into<String>, messages: Vec<ChatMessage>) -> Self {
        Self {
            model: model.into(),
            messages,
            max_tokens: None,
            stream: true,
        }
    }
}

/// One `data:` event of the stream: a chunk of the answer, or the backend's error.
#[derive(Debug, Deserialize)]
struct StreamEvent {
    #[serde(default)]
    choices: Vec<StreamChoice>,
    #[serde(default)]
    error: Option<StreamError>,
}

#[derive(Debug, Deserialize)]
struct StreamChoice {
    #[serde(default)]
    delta: StreamDelta,
}

#[derive(Debug, Default, Deserialize)]
struct StreamDelta {
    #[serde(default)]
    content: Option<String>,
}

#[derive(Debug, Deserialize)]
struct StreamError {
    message: String,
}

type Chunks = Pin<Box<dyn Stream<Item = Result<bytes::Bytes, String>> + Send>>;

/// The pieces of text of a streamed chat answer, in order, until `data: [DONE]` or the
/// end of the response.
pub struct ChatStream {
    url: String,
    chunks: Chunks,
    buffer: BytesMut,
    done: bool,
}

impl std::fmt::Debug for ChatStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatStream")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl ChatStream {
    /// The next piece of text; `None` once the answer is complete. An event that does not
    /// decode, or the backend's error event, is an `Err` that ends the stream.
    pub async fn next(&mut self) -> Option<Result<String, ClientError>> {
        loop {
            if self.done {
                return None;
            }
            while let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
                let line = self.buffer.split_to(end + 1);
                match self.event(&line[..end]) {
                    Event::Text(text) => return Some(Ok(text)),
                    Event::Nothing => {}
                    Event::Done => {
                        self.done = true;
                        return None;
                    }
                    Event::Failed(error) => {
                        self.done = true;
                        return Some(Err(error));
                    }
                }
            }
            match self.chunks.next().await {
                Some(Ok(chunk)) => self.buffer.extend_from_slice(&chunk),
                Some(Err(e)) => {
                    self.done = true;
                    return Some(Err(self.decode_error(format!("the stream broke: {e}"))));
                }
                None => {
                    // An unterminated last line is still an event.
                    self.done = true;
                    let rest = self.buffer.split();
                    return match self.event(&rest) {
                        Event::Text(text) => Some(Ok(text)),
                        Event::Failed(error) => Some(Err(error)),
                        Event::Nothing | Event::Done => None,
                    };
                }
            }
        }
    }

    /// What one line of the event stream says.
    fn event(&self, line: &[u8]) -> Event {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        // Comments (`:`), blank separators and other fields (`event:`, `id:`) carry no text.
        let Some(data) = line.strip_prefix(b"data:") else {
            return Event::Nothing;
        };
        let data = data.strip_prefix(b" ").unwrap_or(data);
        if data == b"[DONE]" {
            return Event::Done;
        }
        match serde_json::from_slice::<StreamEvent>(data) {
            Ok(StreamEvent {
                error: Some(error), ..
            }) => Event::Failed(
                self.decode_error(format!("the model failed mid-answer: {}", error.message)),
            ),
            Ok(event) => {
                let text: String = event
                    .choices
                    .into_iter()
                    .filter_map(|choice| choice.delta.content)
                    .collect();
                if text.is_empty() {
                    Event::Nothing
                } else {
                    Event::Text(text)
                }
            }
            Err(e) => {
                Event::Failed(self.decode_error(format!("an event that is not a chunk: {e}")))
            }
        }
    }

    fn decode_error(&self, message: String) -> ClientError {
        ClientError::Decode {
            url: self.url.clone(),
            message,
        }
    }
}

enum Event {
    Text(String),
    Nothing,
    Done,
    Failed(ClientError),
}

impl Client {
    /// A chat completion through the gateway, streamed: the answer's text as it is
    /// generated. Errors before the first byte (an unknown model, a bad key) are the
    /// gateway's OpenAI-shaped answer, as [`ClientError::Status`].
    pub async fn chat_stream(&self, request: &ChatRequest) -> Result<ChatStream, ClientError> {
        let response = self
            .send(
                Call::new(Method::POST, "/v1/chat/completions")
                    .body(request)
                    .streaming(),
            )
            .await?;
        let url = response.url().to_string();
        Ok(ChatStream {
            url,
            chunks: Box::pin(
                response
                    .bytes_stream()
                    .map(|chunk| chunk.map_err(|e| e.to_string())),
            ),
            buffer: BytesMut::new(),
            done: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream_of(parts: &[&'static str]) -> ChatStream {
        let chunks: Vec<Result<bytes::Bytes, String>> = parts
            .iter()
            .map(|part| Ok(bytes::Bytes::from_static(part.as_bytes())))
            .collect();
        ChatStream {
            url: "http://gateway/v1/chat/completions".to_owned(),
            chunks: Box::pin(futures_util::stream::iter(chunks)),
            buffer: BytesMut::new(),
            done: false,
        }
    }

    async fn texts(mut stream: ChatStream) -> Vec<Result<String, String>> {
        let mut texts = Vec::new();
        while let Some(piece) = stream.next().await {
            texts.push(piece.map_err(|e| e.to_string()));
        }
        texts
    }

    #[tokio::test]
    async fn pieces_of_text_come_in_order_across_split_chunks_until_done() {
        let stream = stream_of(&[
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":null}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\r\n\r\n: keep-alive\n",
            "data: {\"choices\":[{\"del",
            "ta\":{\"content\":\"lo\"}}]}\n\ndata: [DONE]\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"after done\"}}]}\n\n",
        ]);
        assert_eq!(
            texts(stream).await,
            vec![Ok("Hel".to_owned()), Ok("lo".to_owned())]
        );
    }

    #[tokio::test]
    async fn an_error_event_ends_the_stream_with_its_message() {
        let stream = stream_of(&[
            "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
            "data: {\"error\":{\"message\":\"context full\"}}\n\n",
        ]);
        let texts = texts(stream).await;
        assert_eq!(texts[0], Ok("a".to_owned()));
        let error = texts[1].as_ref().unwrap_err();
        assert!(error.contains("context full"), "{error}");
        assert_eq!(texts.len(), 2);
    }

    #[tokio::test]
    async fn an_unterminated_last_event_is_read() {
        let stream = stream_of(&["data: {\"choices\":[{\"delta\":{\"content\":\"end\"}}]}"]);
        assert_eq!(texts(stream).await, vec![Ok("end".to_owned())]);
    }

    #[test]
    fn the_request_asks_for_a_stream() {
        let request = ChatRequest::new("tiny", vec![ChatMessage::user("hi")]);
        let json = serde_json::to_value(&request).expect("a request serialises");
        assert_eq!(json["stream"], true);
        assert_eq!(json["messages"][0]["role"], "user");
        assert!(json.get("max_tokens").is_none());
    }
}
