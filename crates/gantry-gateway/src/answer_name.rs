//! The answer names the model the client asked for: the `model` field at the top of a
//! completion (a JSON body, or each event of a stream) is set to the public name — the
//! deployed model's or the route's — whatever the backend called it (a file path, a
//! provider's dated version, a route target's own name).
//!
//! Finding the field takes one pass over the object's structure, strings skipped with
//! `memchr`; a key at a deeper level (inside `choices`, say) is never touched, and a
//! body whose field already reads the public name is passed on as it came, without a
//! copy. A body that is not a JSON object, or whose `model` is not a string, is left as
//! it is.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

/// Where a JSON object's top-level string field is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    /// The value's characters, between its quotes (escapes as they are in the text).
    Found(Range<usize>),
    /// The object ends without it, or the text is not an object, or the field's value is
    /// not a string.
    Absent,
    /// The text ends before either is known.
    Incomplete,
}

/// The end (the closing quote's index) of a string whose characters start at `from`.
fn string_end(json: &[u8], mut from: usize) -> Option<usize> {
    loop {
        let at = from + memchr::memchr2(b'"', b'\\', json.get(from..)?)?;
        if json[at] == b'"' {
            return Some(at);
        }
        // An escape: the next byte is part of it (`\"`, `\\`, `\u…`).
        from = at + 2;
    }
}

fn skip_whitespace(json: &[u8], mut at: usize) -> usize {
    while json.get(at).is_some_and(|b| b.is_ascii_whitespace()) {
        at += 1;
    }
    at
}

/// Finds the string value of `key` among the top-level fields of the JSON object in
/// `json` (the first such key).
pub fn top_level_string(json: &[u8], key: &[u8]) -> Field {
    let mut at = skip_whitespace(json, 0);
    match json.get(at) {
        None => return Field::Incomplete,
        Some(b'{') => at += 1,
        Some(_) => return Field::Absent,
    }
    let mut depth = 1usize;
    // At depth 1, the next string is a key (after `{` or `,`).
    let mut expect_key = true;
    while let Some(&byte) = json.get(at) {
        match byte {
            b'"' => {
                let Some(end) = string_end(json, at + 1) else {
                    return Field::Incomplete;
                };
                if depth == 1 && expect_key {
                    expect_key = false;
                    if &json[at + 1..end] == key {
                        return value_after_key(json, end + 1);
                    }
                }
                at = end + 1;
            }
            b'{' | b'[' => {
                depth += 1;
                at += 1;
            }
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    return Field::Absent;
                }
                at += 1;
            }
            b',' => {
                expect_key |= depth == 1;
                at += 1;
            }
            _ => at += 1,
        }
    }
    Field::Incomplete
}

/// The string value after a key that ends just before `at`.
fn value_after_key(json: &[u8], at: usize) -> Field {
    let colon = skip_whitespace(json, at);
    match json.get(colon) {
        None => return Field::Incomplete,
        Some(b':') => {}
        Some(_) => return Field::Absent,
    }
    let value = skip_whitespace(json, colon + 1);
    match json.get(value) {
        None => Field::Incomplete,
        Some(b'"') => match string_end(json, value + 1) {
            Some(end) => Field::Found(value + 1..end),
            None => Field::Incomplete,
        },
        Some(_) => Field::Absent,
    }
}

/// The public name as the characters of a JSON string: the name itself unless it has
/// a character that must be escaped.
pub fn json_characters(name: &str) -> Cow<'_, [u8]> {
    if !name.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
        return Cow::Borrowed(name.as_bytes());
    }
    let quoted = serde_json::to_vec(name).unwrap_or_else(|_| b"\"\"".to_vec());
    Cow::Owned(quoted[1..quoted.len() - 1].to_vec())
}

/// What renaming a complete JSON text comes to: `None` when it is left as it is.
fn renamed(json: &[u8], public: &str) -> Option<BytesMut> {
    let Field::Found(span) = top_level_string(json, b"model") else {
        return None;
    };
    let public = json_characters(public);
    if json[span.clone()] == *public {
        return None;
    }
    let mut out = BytesMut::with_capacity(json.len() - span.len() + public.len());
    out.extend_from_slice(&json[..span.start]);
    out.extend_from_slice(&public);
    out.extend_from_slice(&json[span.end..]);
    Some(out)
}

/// A whole JSON body with its `model` set to `public` (the same bytes when nothing
/// changes).
pub fn rename_json(body: Bytes, public: &str) -> Bytes {
    match renamed(&body, public) {
        Some(out) => out.freeze(),
        None => body,
    }
}

/// Where the `model` value of one server-sent event line is, when it must change: the
/// span within `line` (a `data:` line holding a JSON object).
pub fn sse_line_span(line: &[u8], public: &str) -> Option<Range<usize>> {
    let payload = line.strip_prefix(b"data:")?;
    let offset = line.len() - payload.len();
    match top_level_string(payload, b"model") {
        Field::Found(span) if payload[span.clone()] != *json_characters(public) => {
            Some(span.start + offset..span.end + offset)
        }
        _ => None,
    }
}

/// A JSON body that arrives in pieces (its length was not in hand when the head went
/// out): held back until its top-level `model` has passed, then passed on as it comes.
#[derive(Debug)]
pub struct JsonRename {
    public: Arc<str>,
    /// Still looking: what has arrived so far.
    held: Option<BytesMut>,
}

/// Beyond this much of a body without its `model` field, it is passed on as it is.
pub const MAX_HELD_BYTES: usize = 1024 * 1024;

impl JsonRename {
    pub fn new(public: Arc<str>) -> Self {
        Self {
            public,
            held: Some(BytesMut::new()),
        }
    }

    /// The name the body's `model` is set to.
    pub fn public_name(&self) -> &Arc<str> {
        &self.public
    }

    /// Takes a piece of the body; returns what to pass on (empty while holding).
    pub fn on_data(&mut self, data: Bytes) -> Bytes {
        let Some(held) = self.held.as_mut() else {
            return data;
        };
        held.extend_from_slice(&data);
        match top_level_string(held, b"model") {
            Field::Incomplete if held.len() <= MAX_HELD_BYTES => Bytes::new(),
            _ => {
                let held = self.held.take().unwrap_or_default();
                match renamed(&held, &self.public) {
                    Some(out) => out.freeze(),
                    None => held.freeze(),
                }
            }
        }
    }

    /// Whether part of the body is held back.
    pub fn holds_back(&self) -> bool {
        self.held.as_ref().is_some_and(|h| !h.is_empty())
    }

    /// The body ended: what is held, as it is.
    pub fn finish(&mut self) -> Option<Bytes> {
        self.held
            .take()
            .filter(|h| !h.is_empty())
            .map(BytesMut::freeze)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn value(json: &str) -> Option<String> {
        match top_level_string(json.as_bytes(), b"model") {
            Field::Found(span) => Some(json[span].to_owned()),
            _ => None,
        }
    }

    #[test]
    fn the_top_level_model_is_found_and_nested_ones_are_not() {
        assert_eq!(value(r#"{"model":"a"}"#).as_deref(), Some("a"));
        assert_eq!(
            value(r#" { "id" : 1 , "model" : "x/y.gguf" , "n": [1,2]}"#).as_deref(),
            Some("x/y.gguf")
        );
        // Inside `choices`, and as a value, it is not the field.
        assert_eq!(
            value(r#"{"choices":[{"model":"inner","text":"model"}],"model":"outer"}"#).as_deref(),
            Some("outer")
        );
        assert_eq!(value(r#"{"x":{"model":"inner"}}"#), None);
        assert_eq!(value(r#"{"x":"model","y":"z"}"#), None);
        // Quotes and the key's name inside a string are characters.
        assert_eq!(
            value(r#"{"text":"say \"model\": \"no\"","model":"m\"q"}"#).as_deref(),
            Some(r#"m\"q"#)
        );
        assert_eq!(
            value(r#"{"text":"ends with a backslash \\","model":"m"}"#).as_deref(),
            Some("m")
        );
    }

    #[test]
    fn what_is_not_an_object_or_not_a_string_is_absent_and_a_cut_text_incomplete() {
        for json in [
            r#"[{"model":"a"}]"#,
            r#""model""#,
            r#"{"model":null}"#,
            r#"{"model":3}"#,
            "{}",
        ] {
            assert_eq!(
                top_level_string(json.as_bytes(), b"model"),
                Field::Absent,
                "{json}"
            );
        }
        let whole = r#"{"id":"x","choices":[{"text":"a \"b"}],"model":"m"}"#;
        for end in 0..whole.len() - 1 {
            assert_eq!(
                top_level_string(&whole.as_bytes()[..end], b"model"),
                Field::Incomplete,
                "{}",
                &whole[..end]
            );
        }
    }

    #[test]
    fn a_body_is_renamed_only_when_its_name_differs() {
        let body = Bytes::from_static(br#"{"model":"/data/models/tiny.gguf","usage":{}}"#);
        let out = rename_json(body, "tiny");
        assert_eq!(&out[..], br#"{"model":"tiny","usage":{}}"#);
        let same = Bytes::from_static(br#"{"model":"tiny"}"#);
        let out = rename_json(same.clone(), "tiny");
        assert_eq!(out.as_ptr(), same.as_ptr(), "passed on without a copy");
        assert_eq!(&*json_characters(r#"a"b"#), br#"a\"b"#);
        assert_eq!(
            &rename_json(Bytes::from_static(br#"{"model":"x"}"#), "q\"")[..],
            br#"{"model":"q\""}"#
        );
    }

    #[test]
    fn a_body_in_pieces_is_held_until_its_name_has_passed() {
        let body =
            br#"{"choices":[{"text":"hello"}],"model":"/m.gguf","usage":{"prompt_tokens":1}}"#;
        for cut in 1..body.len() {
            let mut rename = JsonRename::new(Arc::from("public"));
            let mut out = Vec::new();
            out.extend_from_slice(&rename.on_data(Bytes::copy_from_slice(&body[..cut])));
            out.extend_from_slice(&rename.on_data(Bytes::copy_from_slice(&body[cut..])));
            out.extend_from_slice(&rename.finish().unwrap_or_default());
            assert_eq!(
                std::str::from_utf8(&out).unwrap(),
                r#"{"choices":[{"text":"hello"}],"model":"public","usage":{"prompt_tokens":1}}"#
            );
        }
        // A body without the field comes out as it went in, at its end.
        let mut rename = JsonRename::new(Arc::from("public"));
        assert!(rename.on_data(Bytes::from_static(b"{\"a\":")).is_empty());
        assert!(rename.holds_back());
        assert_eq!(&rename.finish().unwrap()[..], b"{\"a\":");
    }

    #[test]
    fn an_event_line_names_its_span_only_when_it_must_change() {
        let line = br#"data: {"model":"x","choices":[]}"#;
        let span = sse_line_span(line, "public").unwrap();
        assert_eq!(&line[span], b"x");
        assert_eq!(sse_line_span(line, "x"), None);
        assert_eq!(sse_line_span(b"data: [DONE]", "x"), None);
        assert_eq!(sse_line_span(b"event: model", "x"), None);
    }
}
