//! The server's port: one accept loop for the gateway, the management API and the
//! console, and the one entry point the hosting server calls, [`serve`].
//!
//! Every connection starts in the gateway's front (`front.rs`), which serves the hot
//! routes (`POST /v1/chat/completions`, `/v1/completions`, `/v1/embeddings`) with its own
//! HTTP/1.1; the first request that is anything else hands the connection to hyper.
//! There too the hot routes are matched on method and path and go straight to
//! [`crate::proxy::forward`]; every other request goes to the gateway's own router
//! (`/v1/models`, `/metrics`, errors for other `/v1` paths) and, past it, to the router
//! the server handed in. Either way, while the server drains, responses carry
//! `Connection: close` so that clients move to another server.
//!
//! Plain-TCP connections are served on connection loops of their own, one per CPU
//! (`core_loops.rs`); a connection handed to hyper goes back to the shared runtime.
//!
//! hyper serves its connections directly (as `axum::serve` does, without its generic
//! layers), with `TCP_NODELAY` so that small writes (SSE chunks, watch lines) leave at
//! once, and through TLS when the server has a certificate (the handshake runs in the
//! connection's task, never in the accept loop). On shutdown the loop stops accepting
//! and every connection finishes the request it is answering, then closes; the
//! connections are tasks of the server's [`TaskTracker`], which shutdown waits for.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;

use axum::body::Body;
use axum::http::{header, HeaderValue, Method, Request, Response};
use axum::Router;
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::Service;

use crate::core_loops::CoreLoops;
use crate::front;
use crate::proxy::{self, Endpoint};
use crate::Gateway;

/// The gateway endpoint a request is for, when it is one of the hot routes.
fn hot_route(method: &Method, path: &str) -> Option<Endpoint> {
    if method != Method::POST {
        return None;
    }
    Endpoint::at(path.as_bytes())
}

/// Routes one request: a hot route to the proxy, anything else to the router.
#[derive(Clone)]
pub(crate) struct Dispatch {
    router: Router,
    pub(crate) gateway: Gateway,
    /// Cancelled once the server drains.
    draining: CancellationToken,
    /// Set once the server drains or shuts down (what the front's answers read).
    pub(crate) closing: front::Closing,
    /// The client's address, set per connection; handlers read it as axum's
    /// `ConnectInfo<SocketAddr>` (failed-login limits).
    peer: Option<std::net::SocketAddr>,
}

type ResponseFuture = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

impl hyper::service::Service<Request<Incoming>> for Dispatch {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let draining = self.draining.clone();
        match hot_route(request.method(), request.uri().path()) {
            Some(endpoint) => {
                let gateway = self.gateway.clone();
                Box::pin(async move {
                    let response = proxy::forward(gateway, endpoint, request.map(Body::new)).await;
                    Ok(close_while_draining(&draining, response))
                })
            }
            None => {
                let mut router = self.router.clone();
                let mut request = request;
                if let Some(peer) = self.peer {
                    request
                        .extensions_mut()
                        .insert(axum::extract::ConnectInfo(peer));
                }
                Box::pin(async move {
                    let response = match router.call(request).await {
                        Ok(response) => response,
                        Err(never) => match never {},
                    };
                    Ok(close_while_draining(&draining, response))
                })
            }
        }
    }
}

/// While the server drains, tells the client to close the connection after this response.
fn close_while_draining(
    draining: &CancellationToken,
    mut response: Response<Body>,
) -> Response<Body> {
    if draining.is_cancelled() {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// How [`serve`] serves the server's port, besides the gateway itself.
pub struct ServeConfig {
    /// Answers every request that is not the gateway's: the management API and the
    /// console.
    pub fallback: Router,
    /// TLS on the port, when the server has a certificate.
    pub tls: Option<TlsAcceptor>,
    /// Cancelled once the server drains: from then on every answer carries
    /// `Connection: close`.
    pub draining: CancellationToken,
    /// Cancelled at shutdown: the accept loop stops and connections end after the
    /// request they are answering.
    pub shutdown: CancellationToken,
    /// Owns every connection's task; the server waits for it at shutdown.
    pub tasks: TaskTracker,
}

/// Accepts connections on `listener` and serves them until shutdown: the gateway's
/// routes by `gateway`, everything else by the fallback router.
pub async fn serve(listener: TcpListener, gateway: Gateway, config: ServeConfig) {
    let ServeConfig {
        fallback,
        tls,
        draining,
        shutdown,
        tasks,
    } = config;
    let dispatch = Dispatch {
        router: crate::router(&gateway).merge(fallback),
        closing: front::Closing::once_either(&draining, &shutdown),
        gateway,
        draining,
        peer: None,
    };
    // Plain connections are served on loops of their own (`core_loops.rs`).
    let mut loops = match tls {
        Some(_) => None,
        None => match CoreLoops::start(&shutdown, &tasks) {
            Ok(loops) => Some(loops),
            Err(e) => {
                tracing::warn!(error = %e, "could not start the connection loops; serving every connection on the shared runtime");
                None
            }
        },
    };
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (mut tcp, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors or a connection reset before accept: wait a
                // moment rather than spin, as hyper's and axum's loops do.
                tracing::warn!(error = %e, "accepting a connection failed; retrying in 100 ms");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, %peer, "could not set TCP_NODELAY on an accepted connection");
        }
        let mut service = Dispatch {
            peer: Some(peer),
            ..dispatch.clone()
        };
        if let Some(loops) = &mut loops {
            match loops.serve(tcp, peer, service) {
                None => continue,
                Some(refused) => (tcp, service) = refused,
            }
        }
        let shutdown = shutdown.clone();
        let tls = tls.clone();
        tasks.spawn(async move {
            let Some(tls) = tls else {
                return serve_connection(tcp, service, shutdown, peer).await;
            };
            if let Some(stream) = gantry_tls::handshake(&tls, tcp, peer, &shutdown).await {
                serve_connection(stream, service, shutdown, peer).await;
            }
        });
    }
}

/// Serves one connection: the gateway's front while it brings hot-route requests, then
/// (from the first request that is anything else) hyper with the router.
async fn serve_connection<I>(
    io: I,
    service: Dispatch,
    shutdown: CancellationToken,
    peer: std::net::SocketAddr,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let rest = front::serve(io, &service.gateway, &service.closing, &shutdown).await;
    if let Some(rest) = rest {
        gantry_tls::serve_http1(rest, service, shutdown, peer).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_posts_to_the_three_openai_endpoints_are_hot() {
        assert_eq!(
            hot_route(&Method::POST, "/v1/chat/completions"),
            Some(Endpoint::ChatCompletions)
        );
        assert_eq!(
            hot_route(&Method::POST, "/v1/completions"),
            Some(Endpoint::Completions)
        );
        assert_eq!(
            hot_route(&Method::POST, "/v1/embeddings"),
            Some(Endpoint::Embeddings)
        );
        assert_eq!(hot_route(&Method::GET, "/v1/chat/completions"), None);
        assert_eq!(hot_route(&Method::POST, "/v1/models"), None);
        assert_eq!(hot_route(&Method::POST, "/v1/chat/completions/"), None);
        assert_eq!(hot_route(&Method::POST, "/api/v1/models"), None);
    }

    #[test]
    fn draining_closes_connections() {
        let draining = CancellationToken::new();
        let response = close_while_draining(&draining, Response::new(Body::empty()));
        assert!(response.headers().get(header::CONNECTION).is_none());
        draining.cancel();
        let response = close_while_draining(&draining, Response::new(Body::empty()));
        assert_eq!(response.headers()[header::CONNECTION], "close");
    }
}
