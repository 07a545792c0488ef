//! HTTP/1.1 keep-alive connections to instances, pooled per instance and driven by the
//! request that uses them.
//!
//! hyper's pooled client (hyper-util) runs every connection in a task of its own and
//! hands requests, responses and body chunks across task boundaries: several task
//! wake-ups — and, on a busy machine, several thread switches — per request. Here the
//! connection's IO is polled by the request's own task instead (the server connection
//! task that is answering the client): the instance's readiness wakes that task
//! directly, and a response streams through with no hand-over. Measured under
//! `scripts/bench-gateway.sh`'s load (64 connections, 2 CPUs), this took the gateway
//! from 11.6 to 5.8 system calls and from 5.8 to 1.7 context switches per request, and
//! doubled its throughput. The HTTP/1.1 on it is gantry's own (`h1.rs`): the request is
//! written from the client's headers as they arrived (one write for head and body), the
//! response head parsed in place, with no header map and no channel between a request
//! handle and a connection driver as in hyper's client.
//!
//! A connection that finished its response cleanly goes back to its instance's idle
//! list (newest first; one list per thread, see [`ConnectionPool`]); one whose response
//! was abandoned (the client went away) is dropped, which closes the socket and so
//! cancels the backend's work. Idle connections
//! are checked when taken out (closed by the instance, or idle longer than
//! [`POOL_IDLE_TIMEOUT`]) and swept by the routing task.
//!
//! Instances are reached over plain TCP; model providers may be `https://`, reached
//! over TLS (rustls, the system's root certificates) through the same connection type.

use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::h1::{self, Framing, ProtocolError, ResponseHead};
use crate::shard::{self, Sharded};

/// How long connecting to an instance may take before the next one is tried.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an idle keep-alive connection to an instance is kept.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Most idle connections kept per instance.
pub const MAX_IDLE_PER_INSTANCE: usize = 1024;

/// Why no connection could be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("connect to {address}: {source}")]
    Io {
        address: String,
        source: std::io::Error,
    },
    #[error("connect to {address}: timed out after {CONNECT_TIMEOUT:?}")]
    Timeout { address: String },
    #[error("TLS handshake with {address}: {source}")]
    Tls {
        address: String,
        source: std::io::Error,
    },
    #[error("TLS to {address}: {message}")]
    TlsSetup { address: String, message: String },
}

/// A connection's byte stream: plain TCP, or TLS over TCP.
pub enum UpstreamIo {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for UpstreamIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpstreamIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_write(cx, buf),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            UpstreamIo::Plain(s) => s.is_write_vectored(),
            UpstreamIo::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_flush(cx),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The TLS client set-up shared by every `https://` provider: the system's root
/// certificates (read once), HTTP/1.1 by ALPN.
fn tls_connector() -> Result<TlsConnector, String> {
    static CONNECTOR: OnceLock<Result<TlsConnector, String>> = OnceLock::new();
    CONNECTOR
        .get_or_init(|| {
            let mut roots = rustls::RootCertStore::empty();
            let found = rustls_native_certs::load_native_certs();
            for certificate in found.certs {
                let _ = roots.add(certificate);
            }
            if roots.is_empty() {
                return Err(format!(
                    "no root certificates found on this machine (install the ca-certificates package){}",
                    found
                        .errors
                        .first()
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default()
                ));
            }
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_root_certificates(roots)
                .with_no_client_auth();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Ok(TlsConnector::from(Arc::new(config)))
        })
        .clone()
}

/// Why a request on a connection failed.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The connection closed (or was reset) before any byte of a response: on a reused
    /// connection, the instance closed it as the request went, without processing it.
    #[error("the connection closed before a response arrived")]
    ClosedEarly,
    #[error("the connection closed in the middle of the response")]
    Incomplete,
    #[error(transparent)]
    Io(std::io::Error),
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
}

impl RequestError {
    fn from_io(e: std::io::Error, received_any: bool) -> Self {
        use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset};
        if !received_any && matches!(e.kind(), BrokenPipe | ConnectionReset | ConnectionAborted) {
            Self::ClosedEarly
        } else {
            Self::Io(e)
        }
    }

    /// A reused connection failed this way before the instance saw the request: it
    /// goes again on a new connection.
    pub fn is_closed_early(&self) -> bool {
        matches!(self, Self::ClosedEarly)
    }
}

/// A request to send: its method, target and host, the headers passed on (encoded as
/// `name: value\r\n` lines) and its body.
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    pub method: &'static str,
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub host: &'a [u8],
    pub headers: &'a [u8],
    pub body: &'a [u8],
}

/// A body this long or shorter is copied behind the head and both go in one write.
const INLINE_BODY_BYTES: usize = 16 * 1024;
/// What a read asks room for.
const READ_CHUNK: usize = 16 * 1024;
/// A read goes into the buffer's spare room when it has at least this much (the last
/// response's head may still be held as `Bytes`; see `h1::make_room`).
const MIN_READ_ROOM: usize = 4 * 1024;

/// One HTTP/1.1 connection to an instance (its own small HTTP/1 client: `h1.rs`).
pub struct UpstreamConnection {
    io: UpstreamIo,
    /// Bytes read and not yet consumed.
    buf: BytesMut,
    /// The request being written.
    out: Vec<u8>,
    /// The list of header positions the next response head is parsed into (the last
    /// one's, handed back once written: [`UpstreamConnection::recycle_headers`]).
    spare_headers: Vec<h1::HeaderAt>,
    /// The response body being read; `Empty` between requests.
    body: Framing,
    /// The last response lets the connection carry another request.
    keep_alive: bool,
    /// It carried an earlier request (and may have been closed by the instance since).
    pub reused: bool,
}

impl std::fmt::Debug for UpstreamConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamConnection")
            .field("body", &self.body)
            .field("keep_alive", &self.keep_alive)
            .field("reused", &self.reused)
            .finish_non_exhaustive()
    }
}

impl UpstreamConnection {
    /// Opens a plain connection (TCP_NODELAY: small SSE chunks must not wait).
    pub async fn connect(address: &str) -> Result<Self, ConnectError> {
        Self::connect_with(address, None).await
    }

    /// Opens a connection, over TLS to `tls_name` when given.
    pub async fn connect_with(
        address: &str,
        tls_name: Option<&ServerName<'static>>,
    ) -> Result<Self, ConnectError> {
        let stream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address)).await
        {
            Ok(Ok(stream)) => stream,
            Ok(Err(source)) => {
                return Err(ConnectError::Io {
                    address: address.to_string(),
                    source,
                })
            }
            Err(_) => {
                return Err(ConnectError::Timeout {
                    address: address.to_string(),
                })
            }
        };
        // Without it only latency suffers; not a reason to fail the request.
        let _ = stream.set_nodelay(true);
        let io = match tls_name {
            None => UpstreamIo::Plain(stream),
            Some(name) => {
                let connector = tls_connector().map_err(|message| ConnectError::TlsSetup {
                    address: address.to_string(),
                    message,
                })?;
                let handshake = connector.connect(name.clone(), stream);
                let tls = tokio::time::timeout(CONNECT_TIMEOUT, handshake)
                    .await
                    .map_err(|_| ConnectError::Timeout {
                        address: address.to_string(),
                    })?
                    .map_err(|source| ConnectError::Tls {
                        address: address.to_string(),
                        source,
                    })?;
                UpstreamIo::Tls(Box::new(tls))
            }
        };
        Ok(Self {
            io,
            buf: BytesMut::with_capacity(READ_CHUNK),
            out: Vec::with_capacity(1024),
            spare_headers: Vec::new(),
            body: Framing::Empty,
            keep_alive: true,
            reused: false,
        })
    }

    /// Sends a request and waits for the response head (informational `1xx` heads
    /// are skipped). The body is read with [`UpstreamConnection::poll_body`].
    pub async fn send(&mut self, request: Outgoing<'_>) -> Result<ResponseHead, RequestError> {
        self.keep_alive = false;
        self.out.clear();
        let out = &mut self.out;
        out.extend_from_slice(request.method.as_bytes());
        out.push(b' ');
        out.extend_from_slice(request.path.as_bytes());
        if let Some(query) = request.query {
            out.push(b'?');
            out.extend_from_slice(query.as_bytes());
        }
        out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
        out.extend_from_slice(request.host);
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(request.headers);
        if request.method != "GET" || !request.body.is_empty() {
            h1::put_number_header(out, b"content-length", request.body.len() as u64);
        }
        out.extend_from_slice(b"\r\n");
        let inline = request.body.len() <= INLINE_BODY_BYTES;
        if inline {
            out.extend_from_slice(request.body);
        }
        let write = async {
            self.io.write_all(&self.out).await?;
            if !inline {
                self.io.write_all(request.body).await?;
            }
            self.io.flush().await
        };
        write.await.map_err(|e| RequestError::from_io(e, false))?;
        loop {
            if let Some(head) = h1::parse_response(&mut self.buf, &mut self.spare_headers)? {
                if head.status < 200 {
                    continue;
                }
                self.body = Framing::of_response(&head)?;
                self.keep_alive =
                    head.head.keeps_alive() && !matches!(self.body, Framing::UntilClose);
                return Ok(head);
            }
            h1::make_room(&mut self.buf, MIN_READ_ROOM, READ_CHUNK);
            let received_any = !self.buf.is_empty();
            match self.io.read_buf(&mut self.buf).await {
                Ok(0) if received_any => return Err(RequestError::Incomplete),
                Ok(0) => return Err(RequestError::ClosedEarly),
                Ok(_) => {}
                Err(e) => return Err(RequestError::from_io(e, received_any)),
            }
        }
    }

    /// The next piece of the response body, `None` at its end.
    pub fn poll_body(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, RequestError>>> {
        loop {
            match self.body.decode(&mut self.buf) {
                Ok(Some(data)) if data.is_empty() => continue,
                Ok(Some(data)) => return Poll::Ready(Some(Ok(data))),
                Ok(None) if self.body.is_done() => return Poll::Ready(None),
                Ok(None) => {}
                Err(e) => {
                    self.keep_alive = false;
                    return Poll::Ready(Some(Err(e.into())));
                }
            }
            h1::make_room(&mut self.buf, MIN_READ_ROOM, READ_CHUNK);
            match ready!(tokio_util::io::poll_read_buf(
                Pin::new(&mut self.io),
                cx,
                &mut self.buf
            )) {
                Ok(0) => {
                    self.keep_alive = false;
                    if matches!(self.body, Framing::UntilClose) {
                        self.body = Framing::Empty;
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Err(RequestError::Incomplete)));
                }
                Ok(_) => {}
                Err(e) => {
                    self.keep_alive = false;
                    return Poll::Ready(Some(Err(RequestError::Io(e))));
                }
            }
        }
    }

    /// Takes back a response head's list of header positions, for the next head.
    pub fn recycle_headers(&mut self, headers: Vec<h1::HeaderAt>) {
        if self.spare_headers.capacity() == 0 {
            self.spare_headers = headers;
        }
    }

    /// The whole body of a length-delimited response when all of it came in with the
    /// head, taken (the body then reads as done).
    pub fn take_whole_body(&mut self) -> Option<Bytes> {
        let h1::Framing::Length(length) = self.body else {
            return None;
        };
        if (self.buf.len() as u64) < length {
            return None;
        }
        self.body.decode(&mut self.buf).ok().flatten()
    }

    /// The response body has been read to its end.
    pub fn body_done(&self) -> bool {
        self.body.is_done()
    }

    /// The response body's bytes left, when known.
    pub fn body_remaining(&self) -> Option<u64> {
        self.body.remaining()
    }

    /// The last response was read to its end, allowed another request, and nothing
    /// unasked followed it.
    fn finished_cleanly(&self) -> bool {
        self.keep_alive && self.body.is_done() && self.buf.is_empty()
    }

    /// Whether the connection can carry another request: the last response was read
    /// to its end, allowed it, and the instance has not closed it (or sent anything
    /// unasked) since.
    fn settle(&mut self) -> bool {
        if !self.finished_cleanly() {
            return false;
        }
        let mut cx = Context::from_waker(Waker::noop());
        let mut probe = [0u8; 1];
        let mut probe = ReadBuf::new(&mut probe);
        match Pin::new(&mut self.io).poll_read(&mut cx, &mut probe) {
            Poll::Pending => true,
            // Closed (or an unasked byte, or an error): not fit for another request.
            Poll::Ready(_) => {
                self.keep_alive = false;
                false
            }
        }
    }
}

struct Idle {
    connection: UpstreamConnection,
    since: Instant,
}

/// The idle connections of one instance, one stack per shard (`shard.rs`): a request
/// takes the connection its own thread gave back last, so the connection's state (its
/// buffers, the socket's wait lists) stays in that CPU's cache and the lock is one no
/// other CPU takes meanwhile. A thread with none idle takes another's before connecting.
#[derive(Default)]
pub struct ConnectionPool {
    idle: Sharded<Mutex<Vec<Idle>>>,
}

impl std::fmt::Debug for ConnectionPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionPool")
            .field("idle", &self.idle_count())
            .finish()
    }
}

fn lock(idle: &Mutex<Vec<Idle>>) -> std::sync::MutexGuard<'_, Vec<Idle>> {
    idle.lock().unwrap_or_else(|e| e.into_inner())
}

impl ConnectionPool {
    /// The most recently used idle connection that is still open: this thread's,
    /// else another's. `now` is the caller's reading of the clock (a request's own,
    /// read once for all that it times).
    pub fn take(&self, now: Instant) -> Option<UpstreamConnection> {
        Self::take_from(self.idle.local(), now).or_else(|| {
            self.idle
                .others()
                .find_map(|idle| Self::take_from(idle, now))
        })
    }

    fn take_from(idle: &Mutex<Vec<Idle>>, now: Instant) -> Option<UpstreamConnection> {
        loop {
            let idle = lock(idle).pop()?;
            if now.saturating_duration_since(idle.since) > POOL_IDLE_TIMEOUT {
                continue;
            }
            let mut connection = idle.connection;
            // Polled outside the lock: it may read the instance's FIN.
            if connection.settle() {
                connection.reused = true;
                return Some(connection);
            }
        }
    }

    /// Keeps a connection whose response ended cleanly for the next request. Whether
    /// the instance has closed it is asked when it is taken ([`ConnectionPool::take`]),
    /// not here as well. `now` is the caller's reading of the clock: when it went idle.
    pub fn give_back(&self, connection: UpstreamConnection, now: Instant) {
        if !connection.finished_cleanly() {
            return;
        }
        // The bound is shared out among the shards; a full one passes the connection
        // to another rather than close it.
        let limit = MAX_IDLE_PER_INSTANCE.div_ceil(shard::count());
        let mut idle = lock(self.idle.local());
        if idle.len() >= limit {
            drop(idle);
            let Some(other) = self.idle.others().find(|idle| lock(idle).len() < limit) else {
                return;
            };
            idle = lock(other);
        }
        idle.push(Idle {
            connection,
            since: now,
        });
    }

    /// Closes connections idle for longer than [`POOL_IDLE_TIMEOUT`] or closed by the
    /// instance.
    pub fn sweep(&self) {
        for shard in self.idle.iter() {
            let taken = std::mem::take(&mut *lock(shard));
            let kept: Vec<Idle> = taken
                .into_iter()
                .filter_map(|mut idle| {
                    (idle.since.elapsed() <= POOL_IDLE_TIMEOUT && idle.connection.settle())
                        .then_some(idle)
                })
                .collect();
            let mut idle = lock(shard);
            // Connections given back during the sweep stay; the oldest come first.
            let returned = std::mem::replace(&mut *idle, kept);
            idle.extend(returned);
        }
    }

    /// Closes every idle connection.
    pub fn close_idle(&self) {
        for shard in self.idle.iter() {
            // Dropped outside the lock.
            let closed = std::mem::take(&mut *lock(shard));
            drop(closed);
        }
    }

    pub fn idle_count(&self) -> usize {
        self.idle.iter().map(|idle| lock(idle).len()).sum()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::future::poll_fn;

    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    fn request() -> Outgoing<'static> {
        Outgoing {
            method: "POST",
            path: "/v1/chat/completions",
            query: None,
            host: b"instance",
            headers: b"content-type: application/json\r\n",
            body: b"{}",
        }
    }

    async fn read_body(connection: &mut UpstreamConnection) -> Vec<u8> {
        let mut body = Vec::new();
        while let Some(data) = poll_fn(|cx| connection.poll_body(cx)).await {
            body.extend_from_slice(&data.unwrap());
        }
        body
    }

    /// An instance that reads requests on one connection and answers each with the
    /// next of `answers`, then waits to be told to close.
    async fn instance(
        answers: Vec<&'static [u8]>,
    ) -> (
        String,
        tokio::sync::oneshot::Sender<()>,
        tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let (close, closed) = tokio::sync::oneshot::channel::<()>();
        let (seen, requests) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buffer = vec![0u8; 4096];
            for answer in answers {
                let mut read = Vec::new();
                while !read.windows(6).any(|w| w == b"\r\n\r\n{}") {
                    let n = socket.read(&mut buffer).await.unwrap();
                    read.extend_from_slice(&buffer[..n]);
                }
                seen.send(read).unwrap();
                socket.write_all(answer).await.unwrap();
            }
            let _ = closed.await;
            drop(socket);
        });
        (address, close, requests)
    }

    #[tokio::test]
    async fn requests_are_written_whole_and_answers_read_in_any_framing() {
        let (address, _close, mut seen) = instance(vec![
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nx-a: b\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        ])
        .await;
        let mut connection = UpstreamConnection::connect(&address).await.unwrap();
        let head = connection.send(request()).await.unwrap();
        assert_eq!(head.status, 200);
        assert_eq!(connection.body_remaining(), Some(2));
        assert_eq!(read_body(&mut connection).await, b"ok");
        let written = seen.recv().await.unwrap();
        assert_eq!(
            written,
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: instance\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
        );
        assert!(connection.settle(), "reusable after a complete answer");

        let head = connection.send(request()).await.unwrap();
        assert_eq!(head.head.get("x-a"), Some(&b"b"[..]));
        assert_eq!(connection.body_remaining(), None);
        assert_eq!(read_body(&mut connection).await, b"abcde");
        assert!(connection.settle());
    }

    #[tokio::test]
    async fn a_request_on_a_connection_closed_before_it_was_written_fails_as_closed_early() {
        let (address, close, _seen) =
            instance(vec![b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"]).await;
        let mut connection = UpstreamConnection::connect(&address).await.unwrap();
        connection.send(request()).await.unwrap();
        read_body(&mut connection).await;
        let pool = ConnectionPool::default();
        pool.give_back(connection, Instant::now());
        // Taken while still open; the instance closes it before the next request goes.
        let mut connection = pool
            .take(Instant::now())
            .expect("the connection is open and idle");
        assert!(connection.reused);
        close.send(()).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let outcome = tokio::time::timeout(Duration::from_secs(5), connection.send(request()))
            .await
            .expect("the request fails at once rather than waiting for a closed connection");
        let e = outcome.expect_err("the connection is closed");
        assert!(e.is_closed_early(), "a retryable error: {e:?}");
        // A closed idle connection is not handed out again.
        pool.give_back(connection, Instant::now());
        assert_eq!(pool.idle_count(), 0);
    }

    #[tokio::test]
    async fn a_body_cut_short_is_an_error_and_a_close_delimited_one_is_not() {
        let (address, _close, _seen) = instance(vec![
            b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\nconnection: close\r\n\r\nshort",
        ])
        .await;
        let mut connection = UpstreamConnection::connect(&address).await.unwrap();
        connection.send(request()).await.unwrap();
        // The instance keeps the socket open; nothing more arrives. Read what came.
        let first = poll_fn(|cx| connection.poll_body(cx))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&first[..], b"short");
        assert!(!connection.settle(), "connection: close is honoured");

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buffer = vec![0u8; 4096];
            let _ = socket.read(&mut buffer).await.unwrap();
            socket
                .write_all(b"HTTP/1.0 200 OK\r\n\r\nuntil the end")
                .await
                .unwrap();
        });
        let mut connection = UpstreamConnection::connect(&address).await.unwrap();
        connection.send(request()).await.unwrap();
        assert_eq!(read_body(&mut connection).await, b"until the end");
        assert!(!connection.settle());
    }
}
