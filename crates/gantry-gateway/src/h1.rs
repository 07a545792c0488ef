//! HTTP/1.1 on the wire, as far as the proxy path needs it: request and response heads
//! parsed in place (`httparse`, no header map), message bodies framed by length, by
//! chunks or by the connection's end, and the few bytes the gateway writes itself.
//!
//! The upstream client (`upstream.rs`) and the hot-route front (`front.rs`) both use it;
//! everything else on the server's port goes through hyper.

use std::ops::Range;

use bytes::{Buf, Bytes, BytesMut};

/// Most header lines a head may have.
pub const MAX_HEADERS: usize = 96;
/// Longest head accepted (request line or status line and every header).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Longest chunk-size line (with extensions) or trailer section accepted.
const MAX_CHUNK_LINE: usize = 4096;

/// A message that breaks HTTP/1.1 (or gantry's limits on it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ProtocolError(pub String);

impl ProtocolError {
    fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// One header of a parsed head: where its name and value are in [`Head::raw`].
#[derive(Debug, Clone)]
pub struct HeaderAt {
    pub name: Range<usize>,
    pub value: Range<usize>,
}

/// A parsed request or response head, kept as the bytes it arrived as.
#[derive(Debug, Clone)]
pub struct Head {
    /// The head's bytes, through the blank line.
    pub raw: Bytes,
    pub headers: Vec<HeaderAt>,
    /// HTTP/1.x's minor version.
    pub minor_version: u8,
}

impl Head {
    /// Every header as (name, value).
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.headers
            .iter()
            .map(|h| (&self.raw[h.name.clone()], &self.raw[h.value.clone()]))
    }

    /// The first value of the header `name` (lower case).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v)
    }

    /// Every value of the header `name` (lower case).
    pub fn get_all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v)
    }

    /// Whether a comma-separated header (`Connection`, `Transfer-Encoding`) lists
    /// `token`.
    pub fn has_token(&self, name: &str, token: &str) -> bool {
        self.get_all(name).any(|value| {
            value
                .split(|b| *b == b',')
                .any(|item| item.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
        })
    }

    /// Whether the connection stays open after this message (HTTP/1.1 unless
    /// `Connection: close`; HTTP/1.0 only with `Connection: keep-alive`).
    pub fn keeps_alive(&self) -> bool {
        if self.minor_version == 0 {
            self.has_token("connection", "keep-alive")
        } else {
            !self.has_token("connection", "close")
        }
    }

    /// `Content-Length` as a number: `Ok(None)` when absent, an error when it is not
    /// one number (several different values included).
    pub fn content_length(&self) -> Result<Option<u64>, ProtocolError> {
        let mut found: Option<u64> = None;
        for value in self.get_all("content-length") {
            for item in value.split(|b| *b == b',') {
                let text = std::str::from_utf8(item.trim_ascii())
                    .ok()
                    .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()));
                let Some(n) = text.and_then(|t| t.parse::<u64>().ok()) else {
                    return Err(ProtocolError::new("Content-Length is not a number"));
                };
                if found.is_some_and(|f| f != n) {
                    return Err(ProtocolError::new("Content-Length has different values"));
                }
                found = Some(n);
            }
        }
        Ok(found)
    }

    /// Whether the message is sent in chunks (`Transfer-Encoding` ends in `chunked`);
    /// an error for any other transfer coding.
    pub fn is_chunked(&self) -> Result<bool, ProtocolError> {
        let mut last: Option<&[u8]> = None;
        for value in self.get_all("transfer-encoding") {
            for item in value.split(|b| *b == b',') {
                let item = item.trim_ascii();
                if !item.is_empty() {
                    last = Some(item);
                }
            }
        }
        match last {
            None => Ok(false),
            Some(coding) if coding.eq_ignore_ascii_case(b"chunked") => Ok(true),
            Some(_) => Err(ProtocolError::new(
                "Transfer-Encoding other than chunked is not supported",
            )),
        }
    }
}

/// A parsed request head.
#[derive(Debug, Clone)]
pub struct RequestHead {
    pub head: Head,
    pub method: Range<usize>,
    pub target: Range<usize>,
}

impl RequestHead {
    pub fn method(&self) -> &[u8] {
        &self.head.raw[self.method.clone()]
    }

    /// The request target as sent (origin form: path and query).
    pub fn target(&self) -> &[u8] {
        &self.head.raw[self.target.clone()]
    }

    /// The path, without the query.
    pub fn path(&self) -> &[u8] {
        let target = self.target();
        match memchr::memchr(b'?', target) {
            Some(at) => &target[..at],
            None => target,
        }
    }

    /// The query, without the `?`.
    pub fn query(&self) -> Option<&[u8]> {
        let target = self.target();
        memchr::memchr(b'?', target).map(|at| &target[at + 1..])
    }
}

/// Makes room in `buf` for a read: nothing when `min` bytes are spare already, else
/// room for `chunk`. Heads and bodies are split off `buf` as `Bytes` that share its
/// allocation; reserving while they are alive allocates a new buffer, and reserving
/// after they are dropped reuses the old one, so asking only when room runs low keeps
/// one allocation serving request after request.
pub fn make_room(buf: &mut BytesMut, min: usize, chunk: usize) {
    if buf.capacity() - buf.len() < min {
        buf.reserve(chunk);
    }
}

/// Parses a request head from the front of `buf`, taking it out when complete.
/// `Ok(None)`: more bytes are needed. The head's list of headers is `spare`'s
/// allocation when it has one (the last head's, handed back), so a connection's
/// requests do not allocate one each.
pub fn parse_request(
    buf: &mut BytesMut,
    spare: &mut Vec<HeaderAt>,
) -> Result<Option<RequestHead>, ProtocolError> {
    let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut storage);
    let status = request
        .parse(buf)
        .map_err(|e| ProtocolError::new(format!("bad request head: {e}")))?;
    let httparse::Status::Complete(length) = status else {
        return incomplete(buf, "request");
    };
    let (Some(method), Some(path), Some(version)) = (request.method, request.path, request.version)
    else {
        return Err(ProtocolError::new("incomplete request line"));
    };
    let base = buf.as_ptr() as usize;
    let method = offsets(base, method.as_bytes());
    let target = offsets(base, path.as_bytes());
    let headers = header_offsets(base, request.headers, spare);
    Ok(Some(RequestHead {
        head: Head {
            raw: buf.split_to(length).freeze(),
            headers,
            minor_version: version,
        },
        method,
        target,
    }))
}

/// A parsed response head.
#[derive(Debug, Clone)]
pub struct ResponseHead {
    pub head: Head,
    pub status: u16,
}

/// Parses a response head from the front of `buf`, taking it out when complete (its
/// list of headers in `spare`'s allocation, as for [`parse_request`]).
pub fn parse_response(
    buf: &mut BytesMut,
    spare: &mut Vec<HeaderAt>,
) -> Result<Option<ResponseHead>, ProtocolError> {
    let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut storage);
    let status = response
        .parse(buf)
        .map_err(|e| ProtocolError::new(format!("bad response head: {e}")))?;
    let httparse::Status::Complete(length) = status else {
        return incomplete(buf, "response");
    };
    let (Some(code), Some(version)) = (response.code, response.version) else {
        return Err(ProtocolError::new("incomplete status line"));
    };
    let headers = header_offsets(buf.as_ptr() as usize, response.headers, spare);
    Ok(Some(ResponseHead {
        head: Head {
            raw: buf.split_to(length).freeze(),
            headers,
            minor_version: version,
        },
        status: code,
    }))
}

/// A head not complete yet: more bytes are needed, unless it is already too long.
fn incomplete<T>(buf: &[u8], what: &str) -> Result<Option<T>, ProtocolError> {
    if buf.len() > MAX_HEAD_BYTES {
        return Err(ProtocolError::new(format!(
            "{what} head is longer than {MAX_HEAD_BYTES} bytes"
        )));
    }
    Ok(None)
}

/// Where `part`, a slice of the buffer that starts at address `base`, lies in it.
fn offsets(base: usize, part: &[u8]) -> Range<usize> {
    let start = part.as_ptr() as usize - base;
    start..start + part.len()
}

/// Where each parsed header's name and value lie in the buffer at address `base`, in
/// `spare`'s allocation.
fn header_offsets(
    base: usize,
    headers: &[httparse::Header<'_>],
    spare: &mut Vec<HeaderAt>,
) -> Vec<HeaderAt> {
    let mut list = std::mem::take(spare);
    list.clear();
    list.extend(headers.iter().map(|h| HeaderAt {
        name: offsets(base, h.name.as_bytes()),
        value: offsets(base, h.value),
    }));
    list
}

/// How a message's body is delimited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    Empty,
    /// This many bytes are left.
    Length(u64),
    Chunked(ChunkedState),
    /// Until the connection closes (a response only).
    UntilClose,
}

impl Framing {
    /// How a response to a request with a body is delimited (RFC 9112 §6.3).
    pub fn of_response(response: &ResponseHead) -> Result<Self, ProtocolError> {
        if response.status == 204 || response.status == 304 || response.status < 200 {
            return Ok(Self::Empty);
        }
        if response.head.is_chunked()? {
            return Ok(Self::Chunked(ChunkedState::Size));
        }
        match response.head.content_length()? {
            Some(0) => Ok(Self::Empty),
            Some(n) => Ok(Self::Length(n)),
            None => Ok(Self::UntilClose),
        }
    }

    /// The body is complete.
    pub fn is_done(&self) -> bool {
        matches!(self, Self::Empty | Self::Chunked(ChunkedState::Done))
    }

    /// The number of body bytes left, when known.
    pub fn remaining(&self) -> Option<u64> {
        match self {
            Self::Empty => Some(0),
            Self::Length(n) => Some(*n),
            Self::Chunked(ChunkedState::Done) => Some(0),
            _ => None,
        }
    }

    /// Takes the next piece of body out of `buf`: `Some(data)` (possibly empty when
    /// only framing was consumed), or `None` when more bytes are needed or the body is
    /// done (see [`Framing::is_done`]).
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Bytes>, ProtocolError> {
        match self {
            Self::Empty => Ok(None),
            Self::Length(left) => {
                if buf.is_empty() {
                    return Ok(None);
                }
                let take = usize::try_from(*left).unwrap_or(usize::MAX).min(buf.len());
                *left -= take as u64;
                let data = buf.split_to(take).freeze();
                if *left == 0 {
                    *self = Self::Empty;
                }
                Ok(Some(data))
            }
            Self::UntilClose => {
                if buf.is_empty() {
                    return Ok(None);
                }
                Ok(Some(buf.split().freeze()))
            }
            Self::Chunked(state) => state.decode(buf),
        }
    }
}

/// Where a chunked body's decoding stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChunkedState {
    /// At a chunk-size line.
    Size,
    /// Inside a chunk, this many bytes left.
    Data(u64),
    /// After a chunk's data, at its CRLF.
    DataEnd,
    /// After the last (zero) chunk: trailer lines until a blank one.
    Trailers,
    Done,
}

/// The index just past the next LF in `buf`, within `limit` bytes.
fn line_end(buf: &[u8], what: &str) -> Result<Option<usize>, ProtocolError> {
    match memchr::memchr(b'\n', buf) {
        Some(at) if at < MAX_CHUNK_LINE => Ok(Some(at + 1)),
        Some(_) => Err(ProtocolError::new(format!("{what} is too long"))),
        None if buf.len() >= MAX_CHUNK_LINE => {
            Err(ProtocolError::new(format!("{what} is too long")))
        }
        None => Ok(None),
    }
}

impl ChunkedState {
    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Bytes>, ProtocolError> {
        loop {
            match self {
                Self::Size => {
                    let Some(end) = line_end(buf, "a chunk-size line")? else {
                        return Ok(None);
                    };
                    let line = &buf[..end];
                    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
                    if digits == 0 || digits > 15 {
                        return Err(ProtocolError::new("bad chunk size"));
                    }
                    let rest = line[digits..].trim_ascii();
                    if !rest.is_empty() && !rest.starts_with(b";") {
                        return Err(ProtocolError::new("bad chunk size"));
                    }
                    let size = std::str::from_utf8(&line[..digits])
                        .ok()
                        .and_then(|d| u64::from_str_radix(d, 16).ok())
                        .ok_or_else(|| ProtocolError::new("bad chunk size"))?;
                    buf.advance(end);
                    *self = if size == 0 {
                        Self::Trailers
                    } else {
                        Self::Data(size)
                    };
                }
                Self::Data(left) => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let take = usize::try_from(*left).unwrap_or(usize::MAX).min(buf.len());
                    *left -= take as u64;
                    let data = buf.split_to(take).freeze();
                    if *left == 0 {
                        *self = Self::DataEnd;
                    }
                    return Ok(Some(data));
                }
                Self::DataEnd => {
                    if buf.first() == Some(&b'\r') {
                        if buf.len() < 2 {
                            return Ok(None);
                        }
                        if buf[1] != b'\n' {
                            return Err(ProtocolError::new("chunk data not followed by CRLF"));
                        }
                        buf.advance(2);
                    } else if buf.first() == Some(&b'\n') {
                        buf.advance(1);
                    } else if buf.is_empty() {
                        return Ok(None);
                    } else {
                        return Err(ProtocolError::new("chunk data not followed by CRLF"));
                    }
                    *self = Self::Size;
                }
                Self::Trailers => {
                    let Some(end) = line_end(buf, "a trailer line")? else {
                        return Ok(None);
                    };
                    let blank = buf[..end].trim_ascii().is_empty();
                    buf.advance(end);
                    if blank {
                        *self = Self::Done;
                        return Ok(None);
                    }
                }
                Self::Done => return Ok(None),
            }
        }
    }
}

/// Response headers never passed from a backend to a client: hop-by-hop ones, and the
/// framing the gateway sets itself.
pub fn is_hop_by_hop_response_header(name: &[u8]) -> bool {
    const DROPPED: [&[u8]; 8] = [
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"upgrade",
        b"transfer-encoding",
        b"content-length",
    ];
    DROPPED.iter().any(|d| d.eq_ignore_ascii_case(name))
}

/// Request headers never passed from a client to a backend: hop-by-hop headers, the
/// caller's gantry credentials, what the gateway sets itself (host, length), and
/// `accept-encoding`, so that backends answer uncompressed and usage can be read.
pub fn is_withheld_request_header(name: &[u8]) -> bool {
    const WITHHELD: [&[u8]; 14] = [
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"expect",
        b"host",
        b"content-length",
        b"authorization",
        b"cookie",
        b"accept-encoding",
    ];
    WITHHELD.iter().any(|w| w.eq_ignore_ascii_case(name))
}

/// Appends `name: value\r\n`.
pub fn put_header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Appends a header line whose value is a decimal number.
pub fn put_number_header(out: &mut Vec<u8>, name: &[u8], n: u64) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    put_number(out, n);
    out.extend_from_slice(b"\r\n");
}

/// Appends a decimal number.
pub fn put_number(out: &mut Vec<u8>, n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// Appends one chunk of a chunked body (nothing for empty data: an empty chunk would
/// end the body). The front gathers its chunks with [`OpenChunk`]; the tests write
/// theirs with this.
#[cfg(test)]
pub fn put_chunk(out: &mut Vec<u8>, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    let (size, at) = chunk_size_digits(data.len());
    out.extend_from_slice(&size[at..]);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// A chunk's size in hexadecimal: the digits are `size[at..]`.
fn chunk_size_digits(mut n: usize) -> ([u8; 16], usize) {
    let mut size = [0u8; 16];
    let mut at = size.len();
    loop {
        at -= 1;
        size[at] = b"0123456789abcdef"[n % 16];
        n /= 16;
        if n == 0 {
            break;
        }
    }
    (size, at)
}

/// Room kept for an open chunk's size line: the most hexadecimal digits a size has,
/// and its CRLF.
const CHUNK_SIZE_LINE_ROOM: usize = 16 + 2;

/// A chunk of a chunked body being gathered at the end of an output buffer, so that
/// pieces of a body that are ready together go out as one chunk rather than one each:
/// a client pays per chunk (hyper's, for one, hands each chunk from the connection's
/// task to the request's), and the chunk boundaries carry no meaning. Started with
/// [`OpenChunk::start`], then the data is appended to the buffer as it comes, and
/// [`OpenChunk::finish`] writes the size line in front of it before the buffer goes
/// out.
#[derive(Debug)]
pub struct OpenChunk {
    /// Where the room for the size line starts; the chunk's data follows the room.
    at: usize,
}

impl OpenChunk {
    /// Opens a chunk at the end of `out`: appends the room for its size line.
    pub fn start(out: &mut Vec<u8>) -> Self {
        let at = out.len();
        out.resize(at + CHUNK_SIZE_LINE_ROOM, 0);
        Self { at }
    }

    /// Closes the chunk: everything appended to `out` since it was opened is its data.
    /// The size line goes in front of the data (which moves up to meet it) and the
    /// CRLF after; a chunk with no data leaves nothing (an empty chunk would end the
    /// body).
    pub fn finish(self, out: &mut Vec<u8>) {
        let data = self.at + CHUNK_SIZE_LINE_ROOM;
        let length = out.len() - data;
        if length == 0 {
            out.truncate(self.at);
            return;
        }
        let (size, at) = chunk_size_digits(length);
        let digits = &size[at..];
        let line = digits.len() + 2;
        out[self.at..self.at + digits.len()].copy_from_slice(digits);
        out[self.at + digits.len()..self.at + line].copy_from_slice(b"\r\n");
        out.copy_within(data.., self.at + line);
        out.truncate(self.at + line + length);
        out.extend_from_slice(b"\r\n");
    }
}

/// The end of a chunked body.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// Appends `HTTP/1.1 <status> <reason>\r\n`.
pub fn put_status_line(out: &mut Vec<u8>, status: u16) {
    out.extend_from_slice(b"HTTP/1.1 ");
    put_number(out, u64::from(status));
    out.push(b' ');
    let reason = axum::http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Unknown");
    out.extend_from_slice(reason.as_bytes());
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod properties;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn decode_all(framing: &mut Framing, input: &[u8], step: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = BytesMut::new();
        for piece in input.chunks(step) {
            buf.extend_from_slice(piece);
            while let Some(data) = framing.decode(&mut buf).unwrap() {
                out.extend_from_slice(&data);
            }
        }
        out
    }

    #[test]
    fn room_is_made_only_when_it_runs_low_and_heads_reuse_the_spare_list() {
        let mut buf = BytesMut::with_capacity(8192);
        buf.extend_from_slice(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: a\r\ncontent-length: 2\r\n\r\n{}",
        );
        let mut spare = Vec::with_capacity(8);
        let spare_at = spare.as_ptr();
        let request = parse_request(&mut buf, &mut spare).unwrap().unwrap();
        assert_eq!(
            request.head.headers.as_ptr(),
            spare_at,
            "the spare list is used"
        );
        assert_eq!(request.head.headers.len(), 2);
        let body = buf.split_to(2).freeze();
        // The head and body still share the buffer: with room left, no new one.
        let at = buf.as_ptr();
        make_room(&mut buf, 2048, 8192);
        assert_eq!(buf.as_ptr(), at, "enough room: the buffer is kept");
        // Room runs low: room for a chunk is made.
        buf.extend_from_slice(&vec![b'x'; buf.capacity() - 100]);
        make_room(&mut buf, 2048, 8192);
        assert!(buf.capacity() - buf.len() >= 8192);
        drop((request, body));
    }

    #[test]
    fn chunked_bodies_decode_whatever_way_they_are_split() {
        let body = b"5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nx-trailer: 1\r\n\r\nNEXT";
        for step in 1..body.len() {
            let mut framing = Framing::Chunked(ChunkedState::Size);
            let out = decode_all(&mut framing, &body[..body.len() - 4], step);
            assert_eq!(out, b"hello, world", "split every {step} bytes");
            assert!(framing.is_done());
        }
        // What follows the body stays in the buffer.
        let mut framing = Framing::Chunked(ChunkedState::Size);
        let mut buf = BytesMut::from(&body[..]);
        while framing.decode(&mut buf).unwrap().is_some() {}
        assert!(framing.is_done());
        assert_eq!(&buf[..], b"NEXT");
    }

    #[test]
    fn bad_chunks_are_errors() {
        for bad in [&b"zz\r\n"[..], b"5\r\nhelloXX", b"5 x\r\n"] {
            let mut framing = Framing::Chunked(ChunkedState::Size);
            let mut buf = BytesMut::from(bad);
            let mut result = Ok(None);
            for _ in 0..4 {
                result = framing.decode(&mut buf);
                if result.is_err() {
                    break;
                }
            }
            assert!(result.is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn a_length_body_stops_at_its_length() {
        let mut framing = Framing::Length(5);
        let mut buf = BytesMut::from(&b"helloHTTP/1.1"[..]);
        assert_eq!(&framing.decode(&mut buf).unwrap().unwrap()[..], b"hello");
        assert!(framing.is_done());
        assert_eq!(&buf[..], b"HTTP/1.1");
    }

    #[test]
    fn request_heads_parse_in_place() {
        let mut buf = BytesMut::from(
            &b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nConnection: keep-alive, Close\r\n\r\n{}"[..],
        );
        let request = parse_request(&mut buf, &mut Vec::new()).unwrap().unwrap();
        assert_eq!(request.method(), b"POST");
        assert_eq!(request.path(), b"/v1/chat/completions");
        assert_eq!(request.query(), Some(&b"x=1"[..]));
        assert_eq!(request.head.get("host"), Some(&b"a"[..]));
        assert_eq!(request.head.content_length().unwrap(), Some(2));
        assert!(!request.head.keeps_alive());
        assert_eq!(&buf[..], b"{}");

        let mut partial = BytesMut::from(&b"POST / HTTP/1.1\r\nHost: a\r\n"[..]);
        assert!(parse_request(&mut partial, &mut Vec::new())
            .unwrap()
            .is_none());
        assert_eq!(partial.len(), 26);
    }

    #[test]
    fn response_framing_follows_the_rfc() {
        let head = |text: &[u8]| {
            parse_response(&mut BytesMut::from(text), &mut Vec::new())
                .unwrap()
                .unwrap()
        };
        let ok = head(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\n");
        assert_eq!(Framing::of_response(&ok).unwrap(), Framing::Length(3));
        let chunked = head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert!(matches!(
            Framing::of_response(&chunked).unwrap(),
            Framing::Chunked(_)
        ));
        let close = head(b"HTTP/1.0 200 OK\r\n\r\n");
        assert_eq!(Framing::of_response(&close).unwrap(), Framing::UntilClose);
        assert!(!close.head.keeps_alive());
        let empty = head(b"HTTP/1.1 204 No Content\r\n\r\n");
        assert_eq!(Framing::of_response(&empty).unwrap(), Framing::Empty);
        let conflicting =
            head(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\n");
        assert!(Framing::of_response(&conflicting).is_err());
    }

    #[test]
    fn numbers_and_chunks_are_written_as_http_wants_them() {
        let mut out = Vec::new();
        put_number(&mut out, 0);
        out.push(b' ');
        put_number(&mut out, 1234567);
        assert_eq!(out, b"0 1234567");
        let mut out = Vec::new();
        put_chunk(&mut out, &[b'a'; 26]);
        put_chunk(&mut out, b"");
        assert_eq!(&out[..4], b"1a\r\n");
        let mut out = Vec::new();
        put_status_line(&mut out, 429);
        assert_eq!(out, b"HTTP/1.1 429 Too Many Requests\r\n");
    }

    #[test]
    fn pieces_gathered_in_an_open_chunk_go_out_as_one_chunk_and_an_empty_one_as_nothing() {
        let mut out = b"head\r\n\r\n".to_vec();
        let chunk = OpenChunk::start(&mut out);
        out.extend_from_slice(b"data: one\n\n");
        out.extend_from_slice(&[b'x'; 300]);
        chunk.finish(&mut out);
        let mut expected = b"head\r\n\r\n".to_vec();
        let mut data = b"data: one\n\n".to_vec();
        data.extend_from_slice(&[b'x'; 300]);
        put_chunk(&mut expected, &data);
        assert_eq!(out, expected);

        let chunk = OpenChunk::start(&mut out);
        chunk.finish(&mut out);
        assert_eq!(out, expected);
    }
}
