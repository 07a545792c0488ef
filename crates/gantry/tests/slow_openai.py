"""A test double of an OpenAI-compatible backend that answers slowly: `/health` answers
200, `/v1/chat/completions` streams one `tick N` chunk every 200 ms for 60 s. When the
client goes away mid-stream it writes the file named by `--cancelled`, so a test can tell
that a cancel reached the backend. Run as a custom backend by `console_e2e.rs`.
"""

import argparse
import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cancelled", required=True)
    args = parser.parse_args()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_):
            pass

        def do_GET(self):
            body = b'{"status":"ok"}'
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            length = int(self.headers.get("content-length", "0"))
            request = json.loads(self.rfile.read(length) or b"{}")
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            try:
                for n in range(300):
                    event = {
                        "object": "chat.completion.chunk",
                        "model": request.get("model", ""),
                        "choices": [{"index": 0, "delta": {"content": f"tick {n} "}}],
                    }
                    data = f"data: {json.dumps(event)}\n\n".encode()
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                    time.sleep(0.2)
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                with open(args.cancelled, "w") as marker:
                    marker.write("cancelled\n")

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
