//! Event loops of their own for the server's plain-TCP connections: one thread per CPU,
//! each with a current-thread tokio runtime, its own epoll and its own connections, as
//! nginx runs one worker process per CPU.
//!
//! Why: in the shared multi-thread runtime only one worker at a time polls the IO
//! driver. While that worker runs tasks, events that are already in sit unread and the
//! other workers, parked, have nothing to do, so under load the CPUs idle while
//! requests wait. A loop per CPU polls its own connections and keeps its CPU busy.
//!
//! The accept loop (`listener.rs`) stays on the shared runtime and hands each
//! accepted connection to the loops in turn. A connection is served there by the
//! gateway's front (`front.rs`) — its upstream connections are made, and
//! so polled, by the same loop — and a connection whose request the front does not
//! serve goes back to the shared runtime for hyper and the router, which may block or
//! spawn as they like there. TLS connections stay on the shared runtime.
//!
//! Shutdown: the loops stop taking connections when the server shuts down, let every
//! connection finish the request it is answering, and end; the server's task tracker
//! waits for them. If the shared runtime goes away without a shutdown (a test dropping
//! a server), each loop drops its connections at once, as the runtime would have.

use std::net::SocketAddr;

use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::front;
use crate::listener::Dispatch;

/// A connection handed to a loop.
struct Accepted {
    tcp: std::net::TcpStream,
    peer: SocketAddr,
    service: Dispatch,
}

/// The loops, and which one takes the next connection (owned by the accept loop).
pub(crate) struct CoreLoops {
    loops: Vec<mpsc::UnboundedSender<Accepted>>,
    next: usize,
}

impl CoreLoops {
    /// Starts one loop per CPU. Their threads end after `shutdown` once their
    /// connections have finished, or at once when every handle on the loops is gone
    /// without a shutdown; `tasks` (the server's tracker) waits for them.
    pub(crate) fn start(
        shutdown: &CancellationToken,
        tasks: &TaskTracker,
    ) -> std::io::Result<Self> {
        let count = std::thread::available_parallelism().map_or(1, usize::from);
        let shared = tokio::runtime::Handle::current();
        let mut loops = Vec::with_capacity(count);
        for index in 0..count {
            let (sender, receiver) = mpsc::unbounded_channel();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (ended, ended_wait) = tokio::sync::oneshot::channel::<()>();
            let shutdown = shutdown.clone();
            let shared = shared.clone();
            let tasks_for_loop = tasks.clone();
            std::thread::Builder::new()
                .name(format!("gantry-conn-{index}"))
                .spawn(move || {
                    runtime.block_on(run(receiver, shutdown, shared, tasks_for_loop));
                    // Dropping the runtime drops what is still on it.
                    drop(runtime);
                    let _ = ended.send(());
                })?;
            // The server's shutdown waits until the loop has drained and ended.
            tasks.spawn(async move {
                let _ = ended_wait.await;
            });
            loops.push(sender);
        }
        tracing::debug!(loops = count, "connection loops started");
        Ok(Self { loops, next: 0 })
    }

    /// Hands an accepted connection to the next loop. Gives it back when no loop takes
    /// it any more (the server is shutting down): the caller serves it itself.
    pub(crate) fn serve(
        &mut self,
        tcp: TcpStream,
        peer: SocketAddr,
        service: Dispatch,
    ) -> Option<(TcpStream, Dispatch)> {
        let tcp = match tcp.into_std() {
            Ok(tcp) => tcp,
            Err(e) => {
                tracing::debug!(error = %e, %peer, "could not take a connection off the accept loop's runtime; closing it");
                return None;
            }
        };
        let index = self.next % self.loops.len();
        self.next = self.next.wrapping_add(1);
        let mpsc::error::SendError(refused) = self.loops[index]
            .send(Accepted { tcp, peer, service })
            .err()?;
        match TcpStream::from_std(refused.tcp) {
            Ok(tcp) => Some((tcp, refused.service)),
            Err(e) => {
                tracing::debug!(error = %e, %peer, "could not take a connection back; closing it");
                None
            }
        }
    }
}

/// One loop: serves the connections it is handed until the server shuts down (then
/// lets them finish) or its senders are gone without a shutdown (then drops them).
async fn run(
    mut receiver: mpsc::UnboundedReceiver<Accepted>,
    shutdown: CancellationToken,
    shared: tokio::runtime::Handle,
    tasks: TaskTracker,
) {
    let connections = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = receiver.recv() => accepted,
        };
        let Some(Accepted { tcp, peer, service }) = accepted else {
            if shutdown.is_cancelled() {
                break;
            }
            // The shared runtime is gone: so are the server's connections.
            return;
        };
        let tcp = match TcpStream::from_std(tcp) {
            Ok(tcp) => tcp,
            Err(e) => {
                tracing::debug!(error = %e, %peer, "could not take a connection onto its loop");
                continue;
            }
        };
        let shutdown = shutdown.clone();
        let shared = shared.clone();
        let tasks = tasks.clone();
        connections.spawn(serve_connection(
            tcp, peer, service, shutdown, shared, tasks,
        ));
    }
    connections.close();
    connections.wait().await;
}

/// Serves a connection's hot-route requests here; hands it to the shared runtime for
/// the general server when a request is anything else.
async fn serve_connection(
    tcp: TcpStream,
    peer: SocketAddr,
    service: Dispatch,
    shutdown: CancellationToken,
    shared: tokio::runtime::Handle,
    tasks: TaskTracker,
) {
    let Some(rest) = front::serve(tcp, &service.gateway, &service.closing, &shutdown).await else {
        return;
    };
    let (prefix, tcp) = rest.into_parts();
    let tcp = match tcp.into_std() {
        Ok(tcp) => tcp,
        Err(e) => {
            tracing::debug!(error = %e, %peer, "could not hand a connection to the general server");
            return;
        }
    };
    shared.spawn(tasks.track_future(async move {
        match TcpStream::from_std(tcp) {
            Ok(tcp) => {
                let rest = front::Rewind::from_parts(prefix, tcp);
                gantry_tls::serve_http1(rest, service, shutdown, peer).await;
            }
            Err(e) => {
                tracing::debug!(error = %e, %peer, "could not take a connection onto the shared runtime");
            }
        }
    }));
}
