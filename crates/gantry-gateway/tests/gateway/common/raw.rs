//! HTTP/1.1 read and written by hand, independent of the gateway's own codec and of
//! reqwest: raw responses (content-length and chunked), raw requests, SSE payloads.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::Value;
use tokio::io::AsyncReadExt;

/// Reads a whole SSE response into its events' data payloads.
pub async fn sse_payloads(response: reqwest::Response) -> Vec<String> {
    assert!(
        response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream")),
        "{:?}",
        response.headers()
    );
    let mut text = String::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    text.split("\n\n")
        .filter(|event| !event.trim().is_empty())
        .map(|event| {
            event
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not a data event: {event:?}"))
                .to_string()
        })
        .collect()
}

/// One HTTP/1.1 response as read off a raw connection.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    /// Header names lowercased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }
}

/// Reads more of `stream` into `buf`; fails the test on EOF or after 30 s.
async fn read_more(stream: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) {
    let mut chunk = [0u8; 8192];
    let n = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut chunk))
        .await
        .expect("the gateway answers within 30 s")
        .unwrap();
    assert!(
        n > 0,
        "the connection closed mid-response: {:?}",
        String::from_utf8_lossy(buf)
    );
    buf.extend_from_slice(&chunk[..n]);
}

/// Reads one response off `stream` (what follows it stays in `buf`): a plain
/// HTTP/1.1 parser, independent of the gateway's, with content-length and chunked
/// bodies.
pub async fn read_raw_response(
    stream: &mut tokio::net::TcpStream,
    buf: &mut Vec<u8>,
) -> RawResponse {
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        read_more(stream, buf).await;
    };
    let head = String::from_utf8(buf.drain(..head_end).collect()).unwrap();
    let mut lines = head.trim_end().split("\r\n");
    let status_line = lines.next().unwrap();
    assert!(status_line.starts_with("HTTP/1.1 "), "{head}");
    let status: u16 = status_line[9..12].parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .map(|line| {
            let (name, value) = line.split_once(':').unwrap();
            (name.trim().to_ascii_lowercase(), value.trim().to_string())
        })
        .collect();
    let mut response = RawResponse {
        status,
        headers,
        body: Vec::new(),
    };
    if status == 100 {
        return response;
    }
    if let Some(length) = response.header("content-length") {
        let length: usize = length.parse().unwrap();
        while buf.len() < length {
            read_more(stream, buf).await;
        }
        response.body = buf.drain(..length).collect();
        return response;
    }
    assert_eq!(
        response.header("transfer-encoding"),
        Some("chunked"),
        "{head}"
    );
    loop {
        let line_end = loop {
            if let Some(at) = buf.windows(2).position(|w| w == b"\r\n") {
                break at;
            }
            read_more(stream, buf).await;
        };
        let size_text = String::from_utf8(buf.drain(..line_end + 2).collect()).unwrap();
        let size = usize::from_str_radix(size_text.trim_end().split(';').next().unwrap(), 16)
            .unwrap_or_else(|e| panic!("chunk size {size_text:?}: {e}"));
        while buf.len() < size + 2 {
            read_more(stream, buf).await;
        }
        response.body.extend(buf.drain(..size));
        assert_eq!(buf.drain(..2).collect::<Vec<u8>>(), b"\r\n");
        if size == 0 {
            return response;
        }
    }
}

/// A request with a content-length body, as raw bytes.
pub fn raw_post(path: &str, key: &str, body: &Value, extra: &str) -> Vec<u8> {
    let body = body.to_string();
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nhost: gantry\r\nauthorization: Bearer {key}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{extra}\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body.as_bytes());
    request
}
