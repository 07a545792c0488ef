"""A test double of an OpenAI-compatible backend that answers slowly: `/health` answers
200, `/v1/chat/completions` streams. What it streams depends on the model the request
names:

- a model whose name holds `markdown`: a fixed Markdown answer (`MARKDOWN`: headings,
  code, lists, links, and raw HTML and a `javascript:` link that a page must keep inert),
  a few characters every 40 ms, then its usage when the request asks for it
  (`stream_options.include_usage`), counting each piece as a token;
- any other: one `tick N ` chunk every 200 ms for 60 s, and no usage.

A request without `stream` gets the whole answer as one JSON body. When the client goes
away mid-stream it writes the file named by `--cancelled` (if given), so a test can tell
that a cancel reached the backend. Run as a custom backend by `console.rs`, and as a
provider by `console_playground_browser.py`.
"""

import argparse
import json
import re
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MARKDOWN = """## Deploying a model

Run **one** command, then call it with `curl`:

```bash
gantry start --simulate-gpus 1x8GiB
echo "<b>not bold</b>"
```

1. Open the *console*.
2. Pick a model from the catalog.

- [the docs](https://example.com/docs)
- [a trap](javascript:alert(document.cookie))

<script>window.markdownScriptRan = true</script>
<img src="x" onerror="window.markdownImageRan = true">
"""


def pieces_of(text):
    """The answer as the pieces it streams in: words with the spaces after them."""
    return re.findall(r"\S+\s*|\s+", text)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cancelled")
    args = parser.parse_args()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_):
            pass

        def send_json(self, status, value):
            body = json.dumps(value).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def send_event(self, value):
            data = f"data: {value if isinstance(value, str) else json.dumps(value)}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def do_GET(self):
            self.send_json(200, {"status": "ok"})

        def do_POST(self):
            length = int(self.headers.get("content-length", "0"))
            request = json.loads(self.rfile.read(length) or b"{}")
            model = request.get("model", "")
            markdown = "markdown" in model
            if not request.get("stream"):
                text = MARKDOWN if markdown else "tick 0 "
                count = len(pieces_of(text))
                self.send_json(200, {
                    "object": "chat.completion",
                    "model": model,
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": text}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": count, "total_tokens": count + 1},
                })
                return
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()

            def chunk(content):
                return {
                    "object": "chat.completion.chunk",
                    "model": model,
                    "choices": [{"index": 0, "delta": {"content": content}}],
                }

            try:
                if markdown:
                    pieces = pieces_of(MARKDOWN)
                    for piece in pieces:
                        self.send_event(chunk(piece))
                        time.sleep(0.04)
                    if (request.get("stream_options") or {}).get("include_usage"):
                        self.send_event({
                            "object": "chat.completion.chunk",
                            "model": model,
                            "choices": [],
                            "usage": {"prompt_tokens": 1, "completion_tokens": len(pieces),
                                      "total_tokens": len(pieces) + 1},
                        })
                    self.send_event("[DONE]")
                else:
                    for n in range(300):
                        self.send_event(chunk(f"tick {n} "))
                        time.sleep(0.2)
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                if args.cancelled:
                    with open(args.cancelled, "w") as marker:
                        marker.write("cancelled\n")

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
