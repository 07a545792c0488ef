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
//! doubled its throughput.
//!
//! A connection that finished its response cleanly goes back to its instance's idle
//! list (newest first); one whose response was abandoned (the client went away) is
//! dropped, which closes the socket and so cancels the backend's work. Idle connections
//! are checked when taken out (closed by the instance, or idle longer than
//! [`POOL_IDLE_TIMEOUT`]) and swept by the routing task.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::{Connection, SendRequest};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

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
    #[error("HTTP handshake with {address}: {source}")]
    Handshake {
        address: String,
        source: hyper::Error,
    },
}

/// One HTTP/1.1 connection to an instance.
pub struct UpstreamConnection {
    sender: SendRequest<Full<Bytes>>,
    driver: Connection<TokioIo<TcpStream>, Full<Bytes>>,
    /// The driver has finished (the connection is closed); it must not be polled again.
    closed: bool,
    /// It carried an earlier request (and may have been closed by the instance since).
    pub reused: bool,
}

impl std::fmt::Debug for UpstreamConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamConnection")
            .field("closed", &self.closed)
            .field("reused", &self.reused)
            .finish_non_exhaustive()
    }
}

impl UpstreamConnection {
    /// Opens a connection (TCP_NODELAY: small SSE chunks must not wait).
    pub async fn connect(address: &str) -> Result<Self, ConnectError> {
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
        let (sender, driver) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|source| ConnectError::Handshake {
                address: address.to_string(),
                source,
            })?;
        Ok(Self {
            sender,
            driver,
            closed: false,
            reused: false,
        })
    }

    /// Polls the connection's IO: writes the request, reads the response into the
    /// response body. Call it whenever the task using the connection is polled.
    pub fn drive(&mut self, cx: &mut Context<'_>) {
        if self.closed {
            return;
        }
        if let Poll::Ready(result) = Pin::new(&mut self.driver).poll(cx) {
            if let Err(e) = result {
                tracing::debug!(error = %e, "connection to an instance ended with an error");
            }
            self.closed = true;
        }
    }

    /// Lets the connection settle after a response and says whether it can carry
    /// another request.
    fn settle(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        self.drive(&mut cx);
        !self.closed && self.sender.is_ready()
    }

    /// Sends a request (origin-form URI, `Host` set) and waits for the response head,
    /// driving the connection meanwhile. The body is read by driving it further.
    pub async fn send(
        &mut self,
        request: Request<Full<Bytes>>,
    ) -> Result<Response<Incoming>, hyper::Error> {
        let mut response = pin!(self.sender.send_request(request));
        poll_fn(|cx| {
            self.drive(cx);
            response.as_mut().poll(cx)
        })
        .await
    }
}

struct Idle {
    connection: UpstreamConnection,
    since: Instant,
}

/// The idle connections of one instance.
#[derive(Default)]
pub struct ConnectionPool {
    idle: Mutex<Vec<Idle>>,
}

impl std::fmt::Debug for ConnectionPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionPool")
            .field("idle", &self.idle_count())
            .finish()
    }
}

impl ConnectionPool {
    /// The most recently used idle connection that is still open.
    pub fn take(&self) -> Option<UpstreamConnection> {
        loop {
            let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop()?;
            if idle.since.elapsed() > POOL_IDLE_TIMEOUT {
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

    /// Keeps a connection whose response ended cleanly for the next request.
    pub fn give_back(&self, mut connection: UpstreamConnection) {
        if !connection.settle() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE_PER_INSTANCE {
            idle.push(Idle {
                connection,
                since: Instant::now(),
            });
        }
    }

    /// Closes connections idle for longer than [`POOL_IDLE_TIMEOUT`] or closed by the
    /// instance.
    pub fn sweep(&self) {
        let taken = std::mem::take(&mut *self.idle.lock().unwrap_or_else(|e| e.into_inner()));
        let kept: Vec<Idle> = taken
            .into_iter()
            .filter_map(|mut idle| {
                (idle.since.elapsed() <= POOL_IDLE_TIMEOUT && idle.connection.settle())
                    .then_some(idle)
            })
            .collect();
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        // Connections given back during the sweep stay; the oldest come first.
        let returned = std::mem::replace(&mut *idle, kept);
        idle.extend(returned);
    }

    pub fn idle_count(&self) -> usize {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}
