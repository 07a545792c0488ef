//! The gateway's hot routes served straight off the connection: every connection to the
//! server's port starts here, and requests for `POST /v1/chat/completions`,
//! `/v1/completions` and `/v1/embeddings` are read, proxied and answered with gantry's
//! own HTTP/1.1 (`h1.rs`) — the head parsed in place, the headers passed on as the
//! bytes they arrived as, the backend's answer written back as it comes, with no
//! request or response object, header map or boxed body in between.
//!
//! The first request that is anything else — another path or method, HTTP/1.0, a
//! chunked or oversized body, an `Upgrade`, a head that does not parse — hands the
//! connection, with the bytes read so far ([`Rewind`]), to the general HTTP server
//! (hyper and the axum router), which serves it from then on. Keep-alive and pipelined
//! requests, `Expect: 100-continue` and `Connection: close` are handled here; while the
//! server drains, answers carry `Connection: close`.
//!
//! A client that goes away while its request waits for a backend is noticed (its
//! connection is read meanwhile): the request is dropped, which closes the backend's
//! connection and so cancels its work, as when the client leaves mid-stream.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::error::OpenAiError;
use crate::h1::{self, RequestHead};
use crate::proxy::{
    self, Answer, BackendAnswer, ClientRequest, Endpoint, KeyMemo, INSTANCE_HEADER, TARGET_HEADER,
};
use crate::upstream::RequestError;
use crate::Gateway;

/// What a read asks room for.
const READ_CHUNK: usize = 8 * 1024;
/// A read goes into the buffer's spare room when it has at least this much. The head
/// and body of the request being answered are still held (as `Bytes`) when the
/// connection is watched for the client going away; asking for a full `READ_CHUNK`
/// then would allocate a new buffer for every request.
const MIN_READ_ROOM: usize = 2 * 1024;
/// Answer bytes gathered before they are written even though more are ready.
const WRITE_BATCH: usize = 64 * 1024;
/// How long a request may take to arrive once its first bytes are in (a client that
/// trickles a head, or never sends the body it announced, holds a connection no
/// longer).
const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// A hot-route request the front serves itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hot {
    endpoint: Endpoint,
    length: usize,
    expect_continue: bool,
    /// The client asked to close after the answer (or spoke HTTP/1.0).
    close: bool,
}

/// The endpoint of a hot-route request the front can serve itself, given the
/// gateway's body limit; `None` for anything the general server should see.
fn hot(request: &RequestHead, limit: usize) -> Option<Hot> {
    if request.method() != b"POST" || request.head.minor_version != 1 {
        return None;
    }
    let endpoint = Endpoint::at(request.path())?;
    if request.head.get("transfer-encoding").is_some() || request.head.get("upgrade").is_some() {
        return None;
    }
    if request
        .query()
        .is_some_and(|q| std::str::from_utf8(q).is_err())
    {
        return None;
    }
    let length = request.head.content_length().ok()??;
    if length > limit as u64 {
        return None;
    }
    let expect_continue = match request.head.get("expect") {
        None => false,
        Some(value) if value.eq_ignore_ascii_case(b"100-continue") => true,
        Some(_) => return None,
    };
    Some(Hot {
        endpoint,
        length: length as usize,
        expect_continue,
        close: !request.head.keeps_alive(),
    })
}

/// The caller's token: the bearer token, else the session cookie's (the console's
/// playground), as `proxy::authenticate` reads them.
fn token(request: &RequestHead) -> Option<&str> {
    if let Some(value) = request.head.get("authorization") {
        return gantry_types::auth::bearer_token(std::str::from_utf8(value).ok()?);
    }
    gantry_types::auth::session_cookie(
        request
            .head
            .get_all("cookie")
            .filter_map(|value| std::str::from_utf8(value).ok()),
    )
}

/// Whether answers close their connections: set once the server drains or shuts down.
/// Every answer reads it, so it is one atomic load rather than a cancellation token's
/// lock (two per request, on a lock every connection shares).
#[derive(Debug, Clone, Default)]
pub struct Closing(Arc<AtomicBool>);

impl Closing {
    /// A flag that a task sets as soon as `draining` or `shutdown` is cancelled.
    pub fn once_either(draining: &CancellationToken, shutdown: &CancellationToken) -> Self {
        let closing = Self::default();
        let flag = Arc::clone(&closing.0);
        let (draining, shutdown) = (draining.clone(), shutdown.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = draining.cancelled() => {}
                () = shutdown.cancelled() => {}
            }
            flag.store(true, Ordering::Relaxed);
        });
        closing
    }

    /// Whether the server drains or shuts down.
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Serves hot-route requests on `io` until it closes or a request needs the general
/// server; then returns the connection with what was read of it. Answers close their
/// connection once `closing` is set; an idle connection closes at `shutdown`.
pub async fn serve<I>(
    mut io: I,
    gateway: &Gateway,
    closing: &Closing,
    shutdown: &CancellationToken,
) -> Option<Rewind<I>>
where
    I: AsyncRead + AsyncWrite + Unpin,
{
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut out: Vec<u8> = Vec::new();
    let mut headers: Vec<u8> = Vec::new();
    // The last request's (and, handed back, answer's) list of header positions, reused.
    let mut spare_headers: Vec<h1::HeaderAt> = Vec::new();
    // The last request's API key, taken again without asking while it holds.
    let mut key = KeyMemo::default();
    // When the request being read must be in by; set only once a read leaves it
    // incomplete, so a request that arrives whole arms no timer.
    let mut read_by: Option<Instant> = None;
    // One wait for shutdown for the connection's life, not one per request (each
    // takes and leaves a place in the token's list of waiters, under its lock), and on
    // a token of the connection's own: checking the server's token takes a lock every
    // connection shares (two per idle wait), the child's one that only this connection
    // does, and the server's is locked only when the connection opens and closes.
    let shutdown = shutdown.child_token();
    let mut shutdown_wait = pin!(shutdown.cancelled());
    loop {
        let mut request = match next_head(
            &mut io,
            &mut buf,
            &mut spare_headers,
            shutdown_wait.as_mut(),
            &mut read_by,
        )
        .await
        {
            NextHead::Head(request) => request,
            // The general server answers it (400).
            NextHead::Unparsable => return Some(Rewind::new(buf.freeze(), io)),
            NextHead::Closed => return None,
        };
        let Some(hot) = hot(&request, gateway.config.max_request_body) else {
            return Some(Rewind::with_head(request.head.raw, buf, io));
        };

        if hot.expect_continue && buf.len() < hot.length {
            if io
                .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                .await
                .is_err()
            {
                return None;
            }
            let _ = io.flush().await;
        }
        if !read_body(&mut io, &mut buf, hot.length, &mut read_by).await {
            return None;
        }
        read_by = None;
        let body = buf.split_to(hot.length).freeze();

        headers.clear();
        for (name, value) in request.head.iter() {
            if !h1::is_withheld_request_header(name) {
                h1::put_header(&mut headers, name, value);
            }
        }
        let query = request.query().and_then(|q| std::str::from_utf8(q).ok());
        let started = Instant::now();
        let in_flight = gateway.metrics.start_request();
        let token = token(&request);
        let work = proxy::authenticate_then_proxy(gateway, token, &mut key, started, |caller| {
            ClientRequest {
                endpoint: hot.endpoint,
                caller,
                query,
                headers: &headers,
                body,
                started,
                in_flight,
            }
        });
        let answer = {
            let mut work = pin!(work);
            let watched = poll_fn(|cx| {
                if let Poll::Ready(answer) = work.as_mut().poll(cx) {
                    return Poll::Ready(Some(answer));
                }
                if client_gone(&mut io, &mut buf, cx) {
                    return Poll::Ready(None);
                }
                Poll::Pending
            })
            .await;
            match watched {
                Some(answer) => answer,
                // Dropping the request closed its backend connection.
                None => return None,
            }
        };

        let close = hot.close || closing.is_set();
        out.clear();
        let written = match answer {
            Answer::Error(error) => {
                put_error(&mut out, &error, close);
                write(&mut io, &mut out).await
            }
            Answer::Backend(mut answer) => {
                let length = answer.body.known_length();
                put_answer_head(&mut out, &answer, length, close);
                answer
                    .body
                    .recycle_headers(std::mem::take(&mut answer.head.head.headers));
                pump(
                    &mut io,
                    &mut buf,
                    &mut out,
                    &mut answer.body,
                    length.is_none(),
                )
                .await
            }
        };
        if !written || close {
            let _ = io.shutdown().await;
            return None;
        }
        spare_headers = std::mem::take(&mut request.head.headers);
    }
}

/// What reading a connection for its next request head came to.
enum NextHead {
    Head(RequestHead),
    /// Bytes that are not an HTTP/1.1 request head (they stay in the buffer).
    Unparsable,
    /// The client closed, or the server shut down while the connection was idle, or a
    /// head began and did not finish in time.
    Closed,
}

/// Reads `io` into `buf` until it holds a request head, and takes the head off `buf`.
/// While nothing of a request has arrived the connection may idle until `shutdown`;
/// once part of one is in, the rest must follow by `read_by` (set here on the first
/// incomplete read, so a request that arrives whole arms no timer).
async fn next_head<I>(
    io: &mut I,
    buf: &mut BytesMut,
    spare: &mut Vec<h1::HeaderAt>,
    mut shutdown: Pin<&mut WaitForCancellationFuture<'_>>,
    read_by: &mut Option<Instant>,
) -> NextHead
where
    I: AsyncRead + Unpin,
{
    loop {
        match h1::parse_request(buf, spare) {
            Ok(Some(request)) => return NextHead::Head(request),
            Ok(None) => {}
            Err(_) => return NextHead::Unparsable,
        }
        h1::make_room(buf, MIN_READ_ROOM, READ_CHUNK);
        let read = if buf.is_empty() {
            tokio::select! {
                // Bytes already there are read without asking about shutdown; an idle
                // connection waits for either.
                biased;
                read = io.read_buf(buf) => read,
                () = shutdown.as_mut() => return NextHead::Closed,
            }
        } else {
            let deadline = *read_by.get_or_insert_with(|| Instant::now() + READ_TIMEOUT);
            match tokio::time::timeout_at(deadline, io.read_buf(buf)).await {
                Ok(read) => read,
                Err(_) => {
                    tracing::debug!(
                        received = buf.len(),
                        "a request head did not arrive in time; closing the connection"
                    );
                    return NextHead::Closed;
                }
            }
        };
        match read {
            Ok(0) | Err(_) => return NextHead::Closed,
            Ok(_) => {}
        }
    }
}

/// Reads `io` into `buf` until it holds `length` bytes of body, by `read_by` (set here
/// if the body is not in yet); false when the client closed or was too slow.
async fn read_body<I>(
    io: &mut I,
    buf: &mut BytesMut,
    length: usize,
    read_by: &mut Option<Instant>,
) -> bool
where
    I: AsyncRead + Unpin,
{
    while buf.len() < length {
        buf.reserve(length - buf.len());
        let deadline = *read_by.get_or_insert_with(|| Instant::now() + READ_TIMEOUT);
        match tokio::time::timeout_at(deadline, io.read_buf(buf)).await {
            Ok(Ok(0) | Err(_)) => return false,
            Ok(Ok(_)) => {}
            Err(_) => {
                tracing::debug!(
                    length,
                    received = buf.len(),
                    "a request body did not arrive in time; closing the connection"
                );
                return false;
            }
        }
    }
    true
}

/// What the body pump does next.
enum Step {
    Chunk(Option<Result<Bytes, RequestError>>),
    /// Nothing more is ready: write what is gathered.
    Flush,
    /// The client closed its connection.
    Gone,
}

/// Passes the backend's body to the client as it arrives (chunked when its length is
/// not known), writing whatever is ready in one go: the pieces of a chunked body that
/// are ready together go out as one chunk. False when the answer could not be
/// completed (the client went away, the backend broke off): the connection closes.
async fn pump<I>(
    io: &mut I,
    buf: &mut BytesMut,
    out: &mut Vec<u8>,
    body: &mut crate::body::ObservedBody,
    chunked: bool,
) -> bool
where
    I: AsyncRead + AsyncWrite + Unpin,
{
    // The chunk the data gathered in `out` belongs to; closed before `out` is written.
    let mut open: Option<h1::OpenChunk> = None;
    let close = |out: &mut Vec<u8>, open: &mut Option<h1::OpenChunk>| {
        if let Some(chunk) = open.take() {
            chunk.finish(out);
        }
    };
    loop {
        let step = poll_fn(|cx| match body.poll_chunk(cx) {
            Poll::Ready(chunk) => Poll::Ready(Step::Chunk(chunk)),
            Poll::Pending if !out.is_empty() => Poll::Ready(Step::Flush),
            Poll::Pending if client_gone(io, buf, cx) => Poll::Ready(Step::Gone),
            Poll::Pending => Poll::Pending,
        })
        .await;
        match step {
            Step::Chunk(Some(Ok(data))) => {
                if chunked && open.is_none() {
                    open = Some(h1::OpenChunk::start(out));
                }
                out.extend_from_slice(&data);
                if out.len() >= WRITE_BATCH {
                    close(out, &mut open);
                    if !write(io, out).await {
                        return false;
                    }
                }
            }
            Step::Chunk(Some(Err(e))) => {
                // The head (and part of the body) may be out: the only way left to
                // tell the client is to cut the connection.
                tracing::debug!(error = %e, "backend broke off a response; closing the client's connection");
                close(out, &mut open);
                let _ = write(io, out).await;
                return false;
            }
            Step::Chunk(None) => {
                close(out, &mut open);
                if chunked {
                    out.extend_from_slice(h1::LAST_CHUNK);
                }
                return write(io, out).await;
            }
            Step::Flush => {
                close(out, &mut open);
                if !write(io, out).await {
                    return false;
                }
            }
            Step::Gone => return false,
        }
    }
}

/// Writes and clears `out`; false when the client is gone.
async fn write<I>(io: &mut I, out: &mut Vec<u8>) -> bool
where
    I: AsyncWrite + Unpin,
{
    let ok = io.write_all(out).await.is_ok() && io.flush().await.is_ok();
    out.clear();
    ok
}

/// Whether the client closed its connection, reading what it sends meanwhile (a
/// pipelined request, kept in `buf`) up to a head's worth.
fn client_gone<I>(io: &mut I, buf: &mut BytesMut, cx: &mut Context<'_>) -> bool
where
    I: AsyncRead + Unpin,
{
    while buf.len() < h1::MAX_HEAD_BYTES {
        h1::make_room(buf, MIN_READ_ROOM, READ_CHUNK);
        match tokio_util::io::poll_read_buf(Pin::new(&mut *io), cx, buf) {
            Poll::Pending => return false,
            Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return true,
            Poll::Ready(Ok(_)) => {}
        }
    }
    false
}

/// A backend answer's head: the backend's status and end-to-end headers, which
/// instance and target answered, and the body's framing (`length`, else chunked).
fn put_answer_head(out: &mut Vec<u8>, answer: &BackendAnswer, length: Option<u64>, close: bool) {
    h1::put_status_line(out, answer.status());
    for (name, value) in answer.headers() {
        h1::put_header(out, name, value);
    }
    if let Some(completion) = answer.body.completion() {
        h1::put_header(
            out,
            INSTANCE_HEADER.as_str().as_bytes(),
            completion.instance_header().as_bytes(),
        );
        h1::put_header(
            out,
            TARGET_HEADER.as_str().as_bytes(),
            completion.target_header().as_bytes(),
        );
    }
    match length {
        Some(n) => h1::put_number_header(out, b"content-length", n),
        None => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// An error answer, as `OpenAiError::into_response` makes it.
fn put_error(out: &mut Vec<u8>, error: &OpenAiError, close: bool) {
    let body = error.body();
    h1::put_status_line(out, error.status.as_u16());
    out.extend_from_slice(b"content-type: application/json\r\n");
    if let Some(seconds) = error.retry_after_seconds() {
        h1::put_number_header(out, b"retry-after", seconds);
    }
    h1::put_number_header(out, b"content-length", body.len() as u64);
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&body);
}

/// A connection handed on with the bytes already read from it, which are read again
/// first.
#[derive(Debug)]
pub struct Rewind<I> {
    prefix: Bytes,
    inner: I,
}

impl<I> Rewind<I> {
    fn new(prefix: Bytes, inner: I) -> Self {
        Self { prefix, inner }
    }

    /// A connection whose next bytes to read are `prefix`, then `inner`'s.
    pub fn from_parts(prefix: Bytes, inner: I) -> Self {
        Self::new(prefix, inner)
    }

    /// The bytes read ahead, and the connection (to move it elsewhere).
    pub fn into_parts(self) -> (Bytes, I) {
        (self.prefix, self.inner)
    }

    fn with_head(head: Bytes, rest: BytesMut, inner: I) -> Self {
        if rest.is_empty() {
            return Self::new(head, inner);
        }
        let mut prefix = BytesMut::with_capacity(head.len() + rest.len());
        prefix.extend_from_slice(&head);
        prefix.extend_from_slice(&rest);
        Self::new(prefix.freeze(), inner)
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Rewind<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(out.remaining());
            out.put_slice(&this.prefix[..n]);
            this.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, out)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Rewind<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, data)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn head(text: &str) -> RequestHead {
        h1::parse_request(&mut BytesMut::from(text.as_bytes()), &mut Vec::new())
            .unwrap()
            .unwrap()
    }

    #[test]
    fn only_simple_posts_to_the_three_endpoints_are_served_here() {
        let ok = head("POST /v1/chat/completions HTTP/1.1\r\ncontent-length: 2\r\n\r\n");
        assert_eq!(
            hot(&ok, 100),
            Some(Hot {
                endpoint: Endpoint::ChatCompletions,
                length: 2,
                expect_continue: false,
                close: false
            })
        );
        let expect = head(
            "POST /v1/embeddings?x=1 HTTP/1.1\r\ncontent-length: 2\r\nexpect: 100-continue\r\nconnection: close\r\n\r\n",
        );
        let served = hot(&expect, 100).unwrap();
        assert_eq!(served.endpoint, Endpoint::Embeddings);
        assert!(served.expect_continue && served.close);
        for other in [
            "GET /v1/chat/completions HTTP/1.1\r\n\r\n",
            "POST /v1/models HTTP/1.1\r\ncontent-length: 2\r\n\r\n",
            "POST /v1/chat/completions/ HTTP/1.1\r\ncontent-length: 2\r\n\r\n",
            "POST /api/v1/models HTTP/1.1\r\ncontent-length: 2\r\n\r\n",
            "POST /v1/completions HTTP/1.0\r\ncontent-length: 2\r\n\r\n",
            "POST /v1/completions HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n",
            "POST /v1/completions HTTP/1.1\r\n\r\n",
            "POST /v1/completions HTTP/1.1\r\ncontent-length: 101\r\n\r\n",
            "POST /v1/completions HTTP/1.1\r\ncontent-length: 2\r\nexpect: something\r\n\r\n",
            "POST /v1/completions HTTP/1.1\r\ncontent-length: 2\r\nupgrade: x\r\n\r\n",
        ] {
            assert_eq!(hot(&head(other), 100), None, "{other}");
        }
    }

    #[test]
    fn the_token_is_the_bearer_else_the_session_cookie() {
        let bearer = head(
            "POST / HTTP/1.1\r\nauthorization: Bearer abc\r\ncookie: gantry_session=s\r\n\r\n",
        );
        assert_eq!(token(&bearer), Some("abc"));
        let cookie = head("POST / HTTP/1.1\r\ncookie: a=b; gantry_session=s\r\n\r\n");
        assert_eq!(token(&cookie), Some("s"));
        let none = head("POST / HTTP/1.1\r\n\r\n");
        assert_eq!(token(&none), None);
    }

    #[tokio::test]
    async fn closing_is_set_once_the_server_drains_or_shuts_down() {
        for which in 0..2 {
            let (draining, shutdown) = (CancellationToken::new(), CancellationToken::new());
            let closing = Closing::once_either(&draining, &shutdown);
            tokio::task::yield_now().await;
            assert!(!closing.is_set());
            [&draining, &shutdown][which].cancel();
            tokio::time::timeout(std::time::Duration::from_secs(5), async {
                while !closing.is_set() {
                    tokio::task::yield_now().await;
                }
            })
            .await
            .expect("set within a moment");
        }
    }

    #[tokio::test]
    async fn a_rewound_connection_reads_the_taken_bytes_first() {
        let (mut near, far) = tokio::io::duplex(64);
        let mut rewound = Rewind::with_head(
            Bytes::from_static(b"GET / HTTP/1.1\r\n\r\n"),
            BytesMut::from(&b"GE"[..]),
            far,
        );
        near.write_all(b"T /x").await.unwrap();
        let mut read = vec![0u8; 24];
        rewound.read_exact(&mut read).await.unwrap();
        assert_eq!(read, b"GET / HTTP/1.1\r\n\r\nGET /x");
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_waits_for_shutdown_and_a_started_head_does_not() {
        let shutdown = CancellationToken::new();
        let (mut near, mut far) = tokio::io::duplex(1024);
        // Nothing sent: a minute later it still waits, until the server shuts down.
        {
            let mut buf = BytesMut::new();
            let mut read_by = None;
            let idle = async {
                let mut wait = pin!(shutdown.cancelled());
                next_head(
                    &mut far,
                    &mut buf,
                    &mut Vec::new(),
                    wait.as_mut(),
                    &mut read_by,
                )
                .await
            };
            let mut idle = pin!(idle);
            assert!(
                tokio::time::timeout(std::time::Duration::from_secs(60), idle.as_mut())
                    .await
                    .is_err(),
                "an idle connection is not timed out"
            );
            shutdown.cancel();
            assert!(matches!(idle.await, NextHead::Closed));
        }

        // Part of a head, then nothing: closed once READ_TIMEOUT has passed.
        let shutdown = CancellationToken::new();
        let mut buf = BytesMut::new();
        let mut read_by = None;
        near.write_all(b"POST /v1/completions HTTP/1.1\r\n")
            .await
            .unwrap();
        let began = Instant::now();
        let mut wait = pin!(shutdown.cancelled());
        let outcome = next_head(
            &mut far,
            &mut buf,
            &mut Vec::new(),
            wait.as_mut(),
            &mut read_by,
        )
        .await;
        assert!(matches!(outcome, NextHead::Closed));
        assert!(began.elapsed() >= READ_TIMEOUT, "{:?}", began.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_in_pieces_within_the_time_is_read_and_the_body_must_follow() {
        let shutdown = CancellationToken::new();
        let (mut near, mut far) = tokio::io::duplex(1024);
        let writer = tokio::spawn(async move {
            near.write_all(b"POST /v1/completions HTTP/1.1\r\n")
                .await
                .unwrap();
            tokio::time::sleep(std::time::Duration::from_secs(10)).await;
            near.write_all(b"content-length: 10\r\n\r\n012")
                .await
                .unwrap();
            near
        });
        let mut buf = BytesMut::new();
        let mut read_by = None;
        let mut wait = pin!(shutdown.cancelled());
        let NextHead::Head(request) = next_head(
            &mut far,
            &mut buf,
            &mut Vec::new(),
            wait.as_mut(),
            &mut read_by,
        )
        .await
        else {
            panic!("the head arrived within the time");
        };
        assert_eq!(request.path(), b"/v1/completions");
        assert_eq!(&buf[..], b"012");
        let _near = writer.await.unwrap();

        // The deadline set by the head's first piece still holds for the body: 7 of 10
        // bytes never come.
        let began = Instant::now();
        assert!(!read_body(&mut far, &mut buf, 10, &mut read_by).await);
        let waited = began.elapsed();
        assert!(
            waited >= READ_TIMEOUT - std::time::Duration::from_secs(10) && waited < READ_TIMEOUT,
            "{waited:?}"
        );
    }

    #[tokio::test]
    async fn a_body_already_read_needs_no_more_reading() {
        let (_near, mut far) = tokio::io::duplex(64);
        let mut buf = BytesMut::from(&b"0123456789"[..]);
        let mut read_by = None;
        assert!(read_body(&mut far, &mut buf, 10, &mut read_by).await);
        assert!(
            read_by.is_none(),
            "no timer for a request that arrived whole"
        );
    }
}
