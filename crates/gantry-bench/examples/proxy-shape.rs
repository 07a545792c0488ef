//! EXPERIMENT (not shipped): the same minimal HTTP/1.1 keep-alive proxy run two ways —
//! one multi-thread tokio runtime, or one current-thread runtime per thread each with
//! its own SO_REUSEPORT listener and its own upstream pool — to see what the runtime's
//! shape alone costs per request.
//!
//! `proxy-shape --port P --upstream 127.0.0.1:U --mode multi|percore [--threads 2]`
//!
//! It forwards only what `scripts/bench-gateway.sh` sends (requests and answers framed
//! by `content-length`), with no authentication, routing, accounting or error
//! handling: the floor under what any proxy on this machine can cost.
//! `BENCH_BARE=1 scripts/bench-gateway.sh` measures both shapes beside nginx and the
//! gateway.

#![allow(clippy::unwrap_used)] // an experiment: any failure ends it

use std::cell::RefCell;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

trait Pool: Clone + 'static {
    fn take(&self) -> Option<TcpStream>;
    fn give(&self, s: TcpStream);
}

#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<TcpStream>>>);
impl Pool for Shared {
    fn take(&self) -> Option<TcpStream> {
        self.0.lock().unwrap().pop()
    }
    fn give(&self, s: TcpStream) {
        self.0.lock().unwrap().push(s)
    }
}

thread_local! { static LOCAL: RefCell<Vec<TcpStream>> = const { RefCell::new(Vec::new()) }; }
#[derive(Clone, Default)]
struct Local;
impl Pool for Local {
    fn take(&self) -> Option<TcpStream> {
        LOCAL.with(|p| p.borrow_mut().pop())
    }
    fn give(&self, s: TcpStream) {
        LOCAL.with(|p| p.borrow_mut().push(s))
    }
}

fn head_end(buf: &[u8]) -> Option<usize> {
    memchr::memmem::find(buf, b"\r\n\r\n").map(|i| i + 4)
}

fn content_length(head: &[u8]) -> usize {
    for line in head.split(|&b| b == b'\n') {
        if line.len() > 15 && line[..15].eq_ignore_ascii_case(b"content-length:") {
            return std::str::from_utf8(&line[15..])
                .unwrap()
                .trim()
                .parse()
                .unwrap();
        }
    }
    0
}

async fn read_message(io: &mut TcpStream, buf: &mut BytesMut) -> Option<BytesMut> {
    loop {
        if let Some(end) = head_end(buf) {
            let total = end + content_length(&buf[..end]);
            while buf.len() < total {
                buf.reserve(8192);
                if io.read_buf(buf).await.ok()? == 0 {
                    return None;
                }
            }
            return Some(buf.split_to(total));
        }
        buf.reserve(8192);
        if io.read_buf(buf).await.ok()? == 0 {
            return None;
        }
    }
}

async fn serve<P: Pool>(mut client: TcpStream, upstream: SocketAddr, pool: P) {
    let mut buf = BytesMut::with_capacity(8192);
    let mut out = Vec::with_capacity(1024);
    let mut ubuf = BytesMut::with_capacity(16384);
    while let Some(request) = read_message(&mut client, &mut buf).await {
        let end = head_end(&request).unwrap();
        out.clear();
        let first = memchr::memchr(b'\n', &request).unwrap() + 1;
        out.extend_from_slice(&request[..first]);
        out.extend_from_slice(b"host: upstream\r\n");
        for line in request[first..end - 2].split_inclusive(|&b| b == b'\n') {
            if line.len() >= 5 && line[..5].eq_ignore_ascii_case(b"host:") {
                continue;
            }
            out.extend_from_slice(line);
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&request[end..]);
        let mut up = match pool.take() {
            Some(s) => s,
            None => {
                let s = TcpStream::connect(upstream).await.unwrap();
                s.set_nodelay(true).unwrap();
                s
            }
        };
        up.write_all(&out).await.unwrap();
        ubuf.clear();
        let Some(response) = read_message(&mut up, &mut ubuf).await else {
            return;
        };
        pool.give(up);
        if client.write_all(&response).await.is_err() {
            return;
        }
    }
}

fn listener(address: SocketAddr) -> TcpListener {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_reuseport(true).unwrap();
    socket.set_reuseaddr(true).unwrap();
    socket.bind(address).unwrap();
    socket.listen(1024).unwrap()
}

async fn accept_shared(listener: TcpListener, upstream: SocketAddr, pool: Shared) {
    loop {
        let (s, _) = listener.accept().await.unwrap();
        s.set_nodelay(true).unwrap();
        tokio::spawn(serve(s, upstream, pool.clone()));
    }
}

async fn accept_local(listener: TcpListener, upstream: SocketAddr) {
    loop {
        let (s, _) = listener.accept().await.unwrap();
        s.set_nodelay(true).unwrap();
        tokio::task::spawn_local(serve(s, upstream, Local));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .map(|i| args[i + 1].clone())
    };
    let port: u16 = arg("--port").unwrap().parse().unwrap();
    let upstream: SocketAddr = arg("--upstream").unwrap().parse().unwrap();
    let threads: usize = arg("--threads").map_or(2, |t| t.parse().unwrap());
    let address: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    match arg("--mode").as_deref() {
        Some("multi") => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(threads)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                accept_shared(listener(address), upstream, Shared::default()).await
            });
        }
        Some("percore") => {
            let handles: Vec<_> = (0..threads)
                .map(|_| {
                    std::thread::spawn(move || {
                        let rt = tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()
                            .unwrap();
                        let local = tokio::task::LocalSet::new();
                        local.block_on(&rt, async move {
                            accept_local(listener(address), upstream).await
                        });
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
        }
        _ => panic!("--mode multi|percore"),
    }
}
