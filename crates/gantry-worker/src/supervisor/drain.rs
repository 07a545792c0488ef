//! Draining: before a serving instance is stopped, its backend finishes the requests it is
//! answering.
//!
//! The gateways stop routing to an instance as soon as it leaves `running` (or leaves the
//! cluster), and close their idle connections to it; the worker learns the same change
//! through its assignment stream, usually a little later. What the backend has already
//! accepted would be cut by SIGTERM (llama.cpp's server exits at once), so the stop first
//! waits until the backend has no request [`IDLE_IN_A_ROW`] readings in a row, read every
//! [`DRAIN_POLL`] for at most half the stop grace period, from one of two sources:
//!
//! * the backend's own load endpoint ([`LoadProbe`]: llama.cpp's slots, vLLM's and
//!   SGLang's gauges), one per rank;
//! * for a backend that does not tell its load (a custom command), the TCP connections
//!   open to its ports (`/proc/net/tcp`, `/proc/net/tcp6`): a gateway holds a connection
//!   to an instance out of routing only while a request on it is under way, and the
//!   worker's own probes keep none open. A client that talks to the backend directly and
//!   keeps an idle connection holds the stop up to the end of the drain budget.

use std::time::Duration;

use gantry_backends::LoadProbe;
use tokio::time::Instant;

use super::host::{GetError, Host};
use super::readiness::PROBE_TIMEOUT;

/// How often the load is read while draining.
pub(crate) const DRAIN_POLL: Duration = Duration::from_millis(50);

/// Idle answers in a row that end the drain: a request a gateway sent just before it saw
/// the change may still be on its way when the first idle answer comes.
pub(crate) const IDLE_IN_A_ROW: u32 = 2;

/// Where a drain reads what the backend is doing.
#[derive(Debug, Clone, Copy)]
pub(crate) enum LoadSource<'a> {
    /// The backend's load endpoint at `urls` (one per rank).
    Probe {
        probe: LoadProbe,
        urls: &'a [String],
    },
    /// The established TCP connections to `ports` (one per rank).
    Connections { ports: &'a [u16] },
}

impl LoadSource<'_> {
    /// What an idle reading says.
    pub(crate) fn nothing(&self) -> &'static str {
        match self {
            LoadSource::Probe { .. } => "no request in progress",
            LoadSource::Connections { .. } => "no connection open",
        }
    }

    /// What a reading of `n` says.
    pub(crate) fn some(&self, n: u64) -> String {
        match self {
            LoadSource::Probe { .. } => format!("{n} request(s) still in progress"),
            LoadSource::Connections { .. } => format!("{n} connection(s) still open"),
        }
    }
}

/// How a drain ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Drained {
    /// Nothing in progress on any rank.
    Idle,
    /// The backend's load could not be read: why.
    Unknown(String),
    /// Requests (or connections) were still there when the time was up: how many.
    Busy(u64),
}

/// Reads `source` until it shows nothing in progress, or `budget` is spent.
pub(crate) async fn drain(host: &dyn Host, source: LoadSource<'_>, budget: Duration) -> Drained {
    let deadline = Instant::now() + budget;
    let mut idle_in_a_row = 0;
    loop {
        let in_progress = match source {
            LoadSource::Probe { probe, urls } => {
                let mut in_progress = 0;
                for url in urls {
                    match load(host, url, probe).await {
                        Ok(Some(n)) => in_progress += n,
                        // Too busy to answer: llama.cpp serves from a few threads, which
                        // requests (and clients' idle keep-alive connections) may all hold.
                        Ok(None) => in_progress += 1,
                        Err(reason) => return Drained::Unknown(reason),
                    }
                }
                in_progress
            }
            LoadSource::Connections { ports } => match host.open_connections(ports) {
                Ok(n) => n,
                Err(reason) => return Drained::Unknown(reason),
            },
        };
        if in_progress == 0 {
            idle_in_a_row += 1;
            if idle_in_a_row >= IDLE_IN_A_ROW {
                return Drained::Idle;
            }
        } else {
            idle_in_a_row = 0;
        }
        if Instant::now() + DRAIN_POLL > deadline {
            return Drained::Busy(in_progress);
        }
        tokio::time::sleep(DRAIN_POLL).await;
    }
}

/// The requests in progress at `url`: `None` when it gave no answer in time, an error
/// when its answer does not tell.
async fn load(host: &dyn Host, url: &str, probe: LoadProbe) -> Result<Option<u64>, String> {
    let answer = match host.get(url, PROBE_TIMEOUT).await {
        Ok(answer) => answer,
        Err(GetError::Timeout) => return Ok(None),
        Err(GetError::Refused) => return Err(format!("GET {url}: connection refused")),
        Err(GetError::Other(e)) => return Err(format!("GET {url}: {e}")),
    };
    if !answer.status.is_success() {
        return Err(format!("GET {url} answered {}", answer.status));
    }
    match (probe.read)(&answer.body) {
        Some(n) => Ok(Some(n)),
        None => Err(format!("GET {url}: the answer does not tell the load")),
    }
}

/// The established TCP connections whose local end is one of `ports`, in this network
/// namespace (IPv4 and IPv6). Connections the backend makes itself come from other ports.
pub(crate) fn open_connections(ports: &[u16]) -> Result<u64, String> {
    let mut open = 0;
    for (table, required) in [("/proc/net/tcp", true), ("/proc/net/tcp6", false)] {
        match std::fs::read_to_string(table) {
            Ok(text) => open += established_to(&text, ports),
            // No IPv6 on this machine.
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot read {table} to count the connections: {e}")),
        }
    }
    Ok(open)
}

/// TCP state `ESTABLISHED` in `/proc/net/tcp`'s `st` column.
const TCP_ESTABLISHED: &str = "01";

/// Counts the rows of a `/proc/net/tcp{,6}` table that are established with a local port
/// among `ports`. A row: `sl local_address rem_address st …`, addresses as `HEXIP:HEXPORT`.
fn established_to(table: &str, ports: &[u16]) -> u64 {
    let mut count = 0;
    for row in table.lines().skip(1) {
        let mut fields = row.split_whitespace().skip(1);
        let (Some(local), Some(_remote), Some(state)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let port = local
            .rsplit_once(':')
            .and_then(|(_, port)| u16::from_str_radix(port, 16).ok());
        if state == TCP_ESTABLISHED && port.is_some_and(|port| ports.contains(&port)) {
            count += 1;
        }
    }
    count
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn established_rows_to_the_ports_are_counted_and_nothing_else() {
        // Port 0x9C41 = 40001 listening, one connection to it (and that connection's
        // other end, local port 0xA2F0), one closing, one to another port; then IPv6.
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:9C41 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 0100007F:9C41 0100007F:A2F0 01 00000000:00000000 00:00000000 00000000     0        0 2 1
   2: 0100007F:A2F0 0100007F:9C41 01 00000000:00000000 00:00000000 00000000     0        0 3 1
   3: 0100007F:9C41 0100007F:A2F2 08 00000000:00000000 00:00000000 00000000     0        0 4 1
   4: 0100007F:1F90 0100007F:A2F4 01 00000000:00000000 00:00000000 00000000     0        0 5 1
";
        assert_eq!(established_to(tcp, &[40001]), 1);
        assert_eq!(established_to(tcp, &[40001, 8080]), 2);
        assert_eq!(established_to(tcp, &[40002]), 0);
        let tcp6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue
   0: 00000000000000000000000001000000:9C41 00000000000000000000000001000000:A2F6 01 00000000:00000000
";
        assert_eq!(established_to(tcp6, &[40001]), 1);
        assert_eq!(established_to("", &[40001]), 0);
    }

    #[test]
    fn a_connection_to_a_listening_port_is_seen_until_it_closes() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert_eq!(open_connections(&[port]).unwrap(), 0);
        let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (server, _) = listener.accept().unwrap();
        assert_eq!(open_connections(&[port]).unwrap(), 1);
        drop(client);
        drop(server);
        assert_eq!(open_connections(&[port]).unwrap(), 0);
    }
}
