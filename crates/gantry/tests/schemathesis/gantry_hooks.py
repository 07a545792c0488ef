"""Schemathesis hooks for gantry's API run (see ../api_fuzz.rs).

- Streaming operations (a list with `watch=true`, an instance's log with `follow=true`)
  never end on their own: each such request asks the server to end the stream after one
  second (`timeout_seconds=1`, which the server documents) instead of being left out of
  the run. A `timeout_seconds` the schema does not allow is kept, so the server's
  rejection of it is still tested.
- The run's own credential stays usable: a request that would delete the API key the run
  authenticates with, or delete or change the user it belongs to, is sent to an id that
  does not exist instead (GANTRY_FUZZ_API_KEY_ID, GANTRY_FUZZ_USER_ID). Without this one
  early case would turn every later one into a 401.
- An upload's chunk (`application/offset+octet-stream`) is sent as the raw bytes.
"""

import os

import schemathesis

STREAMING = ("watch", "follow")
NO_SUCH_ID = 9_000_000_000_000_000_000


def _stream_ends(query):
    if not isinstance(query, dict):
        return
    if not any(query.get(name) in (True, "true") for name in STREAMING):
        return
    timeout = query.get("timeout_seconds")
    valid = isinstance(timeout, int) and not isinstance(timeout, bool) and 1 <= timeout <= 86400
    valid_text = isinstance(timeout, str) and timeout.isdigit() and 1 <= int(timeout) <= 86400
    if timeout is None or valid or valid_text:
        query["timeout_seconds"] = 1


def _protected(case):
    own = {
        "/api/v1/api-keys/{id}": (os.environ.get("GANTRY_FUZZ_API_KEY_ID"), ("DELETE",)),
        "/api/v1/users/{id}": (os.environ.get("GANTRY_FUZZ_USER_ID"), ("DELETE", "PATCH")),
    }
    entry = own.get(case.operation.path)
    if entry is None:
        return
    own_id, methods = entry
    params = case.path_parameters or {}
    if own_id and case.method.upper() in methods and str(params.get("id")) == own_id:
        params["id"] = NO_SUCH_ID


@schemathesis.hook
def before_call(ctx, case, kwargs):
    _stream_ends(case.query)
    _stream_ends(kwargs.get("params"))
    _protected(case)


@schemathesis.serializer("application/offset+octet-stream")
def offset_octet_stream(ctx, value):
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    return str(value).encode()
