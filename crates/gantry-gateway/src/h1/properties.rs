//! Property tests of the HTTP/1.1 codec, the code in front of every gateway request: any
//! byte stream, split anywhere, parses to the same messages or the same error; bodies
//! framed by length or by chunks come back byte for byte, pipelined messages stay apart;
//! limits on heads and header counts hold; malformed input is an error, never a panic.
#![allow(clippy::unwrap_used)]

use bytes::BytesMut;
use proptest::prelude::*;

use super::*;

/// How a generated message's body travels.
#[derive(Debug, Clone)]
enum BodyFraming {
    Length,
    /// In these chunk sizes (the rest of the body in one last chunk), with a chunk
    /// extension and a trailer when asked.
    Chunked {
        sizes: Vec<usize>,
        extension: bool,
        trailer: bool,
    },
}

/// A request as the front reads them (bodies by `Content-Length`: a chunked request is
/// handed to the general server), or a response as the upstream client reads them
/// (bodies by length or by chunks).
#[derive(Debug, Clone)]
struct GeneratedMessage {
    /// The request line or the status line, without its CRLF.
    start_line: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    framing: BodyFraming,
}

impl GeneratedMessage {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.start_line.as_bytes());
        out.extend_from_slice(b"\r\n");
        for (name, value) in &self.headers {
            put_header(out, name.as_bytes(), value.as_bytes());
        }
        match &self.framing {
            BodyFraming::Length => {
                put_number_header(out, b"content-length", self.body.len() as u64);
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(&self.body);
            }
            BodyFraming::Chunked {
                sizes,
                extension,
                trailer,
            } => {
                put_header(out, b"transfer-encoding", b"chunked");
                out.extend_from_slice(b"\r\n");
                let mut rest = &self.body[..];
                for size in sizes.iter().copied().chain(std::iter::once(usize::MAX)) {
                    let (chunk, after) = rest.split_at(size.min(rest.len()));
                    if *extension && !chunk.is_empty() {
                        // put_chunk writes no extensions; this one is written by hand.
                        out.extend_from_slice(
                            format!("{:X};name=value\r\n", chunk.len()).as_bytes(),
                        );
                        out.extend_from_slice(chunk);
                        out.extend_from_slice(b"\r\n");
                    } else {
                        put_chunk(out, chunk);
                    }
                    rest = after;
                    if rest.is_empty() {
                        break;
                    }
                }
                if *trailer {
                    out.extend_from_slice(b"0\r\nx-checksum: abc\r\n\r\n");
                } else {
                    out.extend_from_slice(LAST_CHUNK);
                }
            }
        }
    }
}

fn token() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9-]{0,15}"
}

fn headers() -> impl Strategy<Value = Vec<(String, String)>> {
    // The framing headers are written from the body; a value's surrounding spaces are
    // not part of it on the wire.
    let header = (token(), "[ -~]{0,40}").prop_filter("no framing headers", |(name, _)| {
        name != "content-length" && name != "transfer-encoding"
    });
    proptest::collection::vec(header, 0..8).prop_map(|headers| {
        headers
            .into_iter()
            .map(|(n, v)| (n, v.trim().to_owned()))
            .collect()
    })
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..300)
}

fn request() -> impl Strategy<Value = GeneratedMessage> {
    let method = prop_oneof![Just("GET"), Just("POST"), Just("PUT"), Just("DELETE")];
    let target = "/[a-z0-9/]{0,30}(\\?[a-z0-9=&]{0,20})?";
    (method, target, headers(), body()).prop_map(|(method, target, headers, body)| {
        GeneratedMessage {
            start_line: format!("{method} {target} HTTP/1.1"),
            headers,
            body,
            framing: BodyFraming::Length,
        }
    })
}

fn response() -> impl Strategy<Value = GeneratedMessage> {
    let status = prop_oneof![
        Just((200, "OK")),
        Just((201, "Created")),
        Just((400, "Bad Request")),
        Just((429, "Too Many Requests")),
        Just((500, "Internal Server Error")),
        Just((503, "Service Unavailable")),
    ];
    let framing = prop_oneof![
        Just(BodyFraming::Length),
        (
            proptest::collection::vec(1usize..64, 0..6),
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(|(sizes, extension, trailer)| BodyFraming::Chunked {
                sizes,
                extension,
                trailer
            }),
    ];
    (status, headers(), body(), framing).prop_map(|((code, reason), headers, body, framing)| {
        GeneratedMessage {
            start_line: format!("HTTP/1.1 {code} {reason}"),
            headers,
            body,
            framing,
        }
    })
}

/// One message as read: its start line's parts (method and target, or the status),
/// its headers and its body.
type ReadMessage = (Vec<u8>, Vec<u8>, Vec<(Vec<u8>, Vec<u8>)>, Vec<u8>);

/// What a connection reads: the messages, in order, an error if one came, and what
/// is left when the input ends.
#[derive(Debug, PartialEq, Eq)]
struct Read {
    messages: Vec<ReadMessage>,
    error: Option<ProtocolError>,
    leftover: Vec<u8>,
}

/// Which side of the gateway reads the stream.
#[derive(Debug, Clone, Copy)]
enum Side {
    /// The front reading a client's requests: the head, then `Content-Length` bytes.
    Front,
    /// The upstream client reading a backend's responses: the head, then the body by
    /// its framing.
    Upstream,
}

/// Reads messages off a stream that arrives in pieces of `step` bytes, a head and then
/// its body, and the next head after it.
fn read_stream(side: Side, input: &[u8], step: usize) -> Read {
    let mut buf = BytesMut::new();
    let mut messages = Vec::new();
    let mut current: Option<(ReadMessage, Framing)> = None;
    let mut spare = Vec::new();
    let failed = |messages, error, buf: &BytesMut| Read {
        messages,
        error: Some(error),
        leftover: buf.to_vec(),
    };
    for piece in input.chunks(step.max(1)) {
        buf.extend_from_slice(piece);
        loop {
            let Some((message, framing)) = current.as_mut() else {
                let head = match side {
                    Side::Front => parse_request(&mut buf, &mut spare).and_then(|head| {
                        let Some(request) = head else { return Ok(None) };
                        let length = request.head.content_length()?.unwrap_or(0);
                        let framing = match length {
                            0 => Framing::Empty,
                            n => Framing::Length(n),
                        };
                        let start = (request.method().to_vec(), request.target().to_vec());
                        Ok(Some((start, request.head, framing)))
                    }),
                    Side::Upstream => parse_response(&mut buf, &mut spare).and_then(|head| {
                        let Some(response) = head else {
                            return Ok(None);
                        };
                        let framing = Framing::of_response(&response)?;
                        let start = (response.status.to_string().into_bytes(), Vec::new());
                        Ok(Some((start, response.head, framing)))
                    }),
                };
                match head {
                    Ok(Some(((first, second), head, framing))) => {
                        let headers = head.iter().map(|(n, v)| (n.to_vec(), v.to_vec())).collect();
                        current = Some(((first, second, headers, Vec::new()), framing));
                        continue;
                    }
                    Ok(None) => break,
                    Err(error) => return failed(messages, error, &buf),
                }
            };
            if framing.is_done() {
                let (message, _) = current.take().expect("a message is being read");
                messages.push(message);
                continue;
            }
            match framing.decode(&mut buf) {
                Ok(Some(data)) => message.3.extend_from_slice(&data),
                Ok(None) if framing.is_done() => {}
                Ok(None) => break,
                Err(error) => return failed(messages, error, &buf),
            }
        }
    }
    Read {
        messages,
        error: None,
        leftover: buf.to_vec(),
    }
}

/// Checks that `read` holds exactly `sent`, in order.
fn same_messages(read: &Read, sent: &[GeneratedMessage]) -> Result<(), TestCaseError> {
    prop_assert_eq!(&read.error, &None);
    prop_assert!(read.leftover.is_empty(), "left over: {:?}", read.leftover);
    prop_assert_eq!(read.messages.len(), sent.len());
    for (got, sent) in read.messages.iter().zip(sent) {
        let mut words = sent.start_line.split(' ');
        let first = words.next().unwrap_or_default();
        let second = words.next().unwrap_or_default();
        if first.starts_with("HTTP/") {
            prop_assert_eq!(&got.0, second.as_bytes(), "status");
        } else {
            prop_assert_eq!(&got.0, first.as_bytes(), "method");
            prop_assert_eq!(&got.1, second.as_bytes(), "target");
        }
        for (name, value) in &sent.headers {
            prop_assert!(
                got.2
                    .iter()
                    .any(|(n, v)| n == name.as_bytes() && v == value.as_bytes()),
                "header {} lost",
                name
            );
        }
        prop_assert_eq!(&got.3, &sent.body);
    }
    Ok(())
}

/// A valid stream of `messages` with one byte replaced: a near miss of real traffic.
fn with_a_byte_flipped(messages: Vec<GeneratedMessage>, at: usize, byte: u8) -> Vec<u8> {
    let mut wire = Vec::new();
    for message in &messages {
        message.encode(&mut wire);
    }
    let at = at % wire.len();
    wire[at] = byte;
    wire
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Pipelined requests come back one by one with their method, target, headers and
    /// body, however the stream is split, as the front reads them.
    #[test]
    fn pipelined_requests_come_back_whole_however_the_stream_is_split(
        requests in proptest::collection::vec(request(), 1..5),
        step in 1usize..200,
    ) {
        let mut wire = Vec::new();
        for request in &requests {
            request.encode(&mut wire);
        }
        same_messages(&read_stream(Side::Front, &wire, step), &requests)?;
    }

    /// A backend's keep-alive responses, framed by length or by chunks (with extensions
    /// and trailers), come back one by one whole, as the upstream client reads them.
    #[test]
    fn pipelined_responses_come_back_whole_however_the_stream_is_split(
        responses in proptest::collection::vec(response(), 1..5),
        step in 1usize..200,
    ) {
        let mut wire = Vec::new();
        for response in &responses {
            response.encode(&mut wire);
        }
        same_messages(&read_stream(Side::Upstream, &wire, step), &responses)?;
    }

    /// Splitting the stream differently never changes what is read: the same messages,
    /// an error or none, the same leftover. Any input, malformed included, and never a
    /// panic — on both sides.
    #[test]
    fn any_input_reads_the_same_whatever_the_split(
        requests in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..400),
            (proptest::collection::vec(request(), 1..3), any::<usize>(), any::<u8>())
                .prop_map(|(messages, at, byte)| with_a_byte_flipped(messages, at, byte)),
        ],
        responses in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..400),
            (proptest::collection::vec(response(), 1..3), any::<usize>(), any::<u8>())
                .prop_map(|(messages, at, byte)| with_a_byte_flipped(messages, at, byte)),
        ],
        step in 1usize..64,
    ) {
        for (side, input) in [(Side::Front, &requests), (Side::Upstream, &responses)] {
            let whole = read_stream(side, input, input.len().max(1));
            let split = read_stream(side, input, step);
            prop_assert_eq!(&split.messages, &whole.messages, "{:?}", side);
            prop_assert_eq!(split.error.is_some(), whole.error.is_some(), "{:?}", side);
            if whole.error.is_none() {
                prop_assert_eq!(&split.leftover, &whole.leftover, "{:?}", side);
            }
        }
    }

    /// A chunked body decodes to exactly its data, whatever the chunk sizes and however
    /// the bytes arrive, and what follows it stays in the buffer.
    #[test]
    fn chunked_bodies_round_trip(
        body in proptest::collection::vec(any::<u8>(), 0..2000),
        sizes in proptest::collection::vec(1usize..700, 0..8),
        step in 1usize..300,
    ) {
        let mut wire = Vec::new();
        let mut rest = &body[..];
        for size in sizes.into_iter().chain(std::iter::once(usize::MAX)) {
            let (chunk, after) = rest.split_at(size.min(rest.len()));
            put_chunk(&mut wire, chunk);
            rest = after;
        }
        wire.extend_from_slice(LAST_CHUNK);
        wire.extend_from_slice(b"GET /next HTTP/1.1\r\n");
        let mut framing = Framing::Chunked(ChunkedState::Size);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for piece in wire.chunks(step) {
            buf.extend_from_slice(piece);
            while let Some(data) = framing.decode(&mut buf).unwrap() {
                out.extend_from_slice(&data);
            }
        }
        prop_assert!(framing.is_done());
        prop_assert_eq!(out, body);
        prop_assert_eq!(&buf[..], &b"GET /next HTTP/1.1\r\n"[..]);
    }

    /// A head with more header lines than the limit is refused, one within it is read.
    #[test]
    fn header_count_is_limited(count in 0usize..(2 * MAX_HEADERS)) {
        let mut wire = b"GET / HTTP/1.1\r\n".to_vec();
        for n in 0..count {
            put_header(&mut wire, format!("x-h{n}").as_bytes(), b"v");
        }
        wire.extend_from_slice(b"\r\n");
        let result = parse_request(&mut BytesMut::from(&wire[..]), &mut Vec::new());
        if count <= MAX_HEADERS {
            prop_assert_eq!(result.unwrap().unwrap().head.headers.len(), count);
        } else {
            prop_assert!(result.is_err());
        }
    }

    /// An unfinished head is waited for until it passes the size limit, then refused;
    /// the limit holds however the bytes arrive.
    #[test]
    fn an_unfinished_head_is_refused_past_the_limit(step in 512usize..8192) {
        let mut buf = BytesMut::from(&b"GET / HTTP/1.1\r\nx-long: "[..]);
        let mut refused_at = None;
        while buf.len() <= MAX_HEAD_BYTES + step {
            buf.extend_from_slice(&vec![b'a'; step]);
            if parse_request(&mut buf.clone(), &mut Vec::new()).is_err() {
                refused_at = Some(buf.len());
                break;
            }
        }
        let refused_at = refused_at.expect("a head past the limit is refused");
        prop_assert!(refused_at > MAX_HEAD_BYTES && refused_at <= MAX_HEAD_BYTES + step);
    }

    /// Content-Length: one number (repeated or listed equal) is the length; differing
    /// values or anything but digits are errors, never a guess.
    #[test]
    fn content_length_is_one_number_or_an_error(
        values in proptest::collection::vec(
            prop_oneof![
                (0u64..1_000_000).prop_map(|n| n.to_string()),
                "[0-9a-z +-]{0,8}",
            ],
            1..4,
        ),
    ) {
        let mut wire = b"POST / HTTP/1.1\r\n".to_vec();
        for value in &values {
            put_header(&mut wire, b"content-length", value.as_bytes());
        }
        wire.extend_from_slice(b"\r\n");
        let Ok(Some(request)) = parse_request(&mut BytesMut::from(&wire[..]), &mut Vec::new()) else {
            // httparse itself refused the value (a control character, say).
            return Ok(());
        };
        let numbers: Option<Vec<u64>> = values
            .iter()
            .flat_map(|v| v.trim().split(','))
            .map(|item| {
                let item = item.trim_ascii();
                (!item.is_empty() && item.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| item.parse::<u64>().ok())
                    .flatten()
            })
            .collect();
        let expected = numbers.filter(|n| n.windows(2).all(|w| w[0] == w[1])).map(|n| n[0]);
        match request.head.content_length() {
            Ok(Some(n)) => prop_assert_eq!(Some(n), expected),
            Ok(None) => prop_assert!(false, "a present header read as absent"),
            Err(_) => prop_assert_eq!(expected, None),
        }
    }

    /// Numbers are written as `to_string` writes them.
    #[test]
    fn numbers_are_written_in_decimal(n in any::<u64>()) {
        let mut out = Vec::new();
        put_number(&mut out, n);
        prop_assert_eq!(out, n.to_string().into_bytes());
    }
}
