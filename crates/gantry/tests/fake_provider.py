"""A test double of an external OpenAI-compatible provider, for routes_e2e.rs.

It demands `Authorization: Bearer <--api-key>` (401 otherwise), lists one model at
`GET /v1/models`, and answers `POST /v1/chat/completions` with a fixed reply whose
`model` echoes the request's and whose usage is 3 prompt + 5 completion tokens
(streaming: two chunks, then a usage chunk when `stream_options.include_usage`).

`POST /control {"fail": 500}` makes it answer every completion with that status before
any body (`{"fail": null}` to stop); `GET /control` answers what it has seen: the
number of completions answered and refused, and the `model` values requests carried.
"""

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--api-key", required=True)
    args = parser.parse_args()
    lock = threading.Lock()
    state = {"fail": None, "answered": 0, "refused": 0, "unauthorized": 0, "models": {}}

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

        def authorized(self):
            if self.headers.get("authorization") == f"Bearer {args.api_key}":
                return True
            with lock:
                state["unauthorized"] += 1
            self.send_json(401, {"error": {"message": "bad key", "type": "auth"}})
            return False

        def read_json(self):
            length = int(self.headers.get("content-length", "0"))
            return json.loads(self.rfile.read(length) or b"{}")

        def do_GET(self):
            if self.path == "/control":
                with lock:
                    self.send_json(200, state)
                return
            if self.path == "/v1/models":
                if self.authorized():
                    self.send_json(200, {"object": "list", "data": [{"id": "hosted-model", "object": "model"}]})
                return
            self.send_json(404, {"error": {"message": "no such path"}})

        def do_POST(self):
            request = self.read_json()
            if self.path == "/control":
                with lock:
                    state["fail"] = request.get("fail")
                self.send_json(200, state)
                return
            if self.path != "/v1/chat/completions":
                self.send_json(404, {"error": {"message": "no such path"}})
                return
            if not self.authorized():
                return
            with lock:
                fail = state["fail"]
                model = request.get("model", "")
                state["models"][model] = state["models"].get(model, 0) + 1
                if fail:
                    state["refused"] += 1
                else:
                    state["answered"] += 1
            if fail:
                self.send_json(fail, {"error": {"message": "provider is failing on purpose"}})
                return
            usage = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
            if not request.get("stream"):
                self.send_json(200, {
                    "id": "cmpl-1", "object": "chat.completion", "model": model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "from the provider"}, "finish_reason": "stop"}],
                    "usage": usage,
                })
                return
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            events = [
                {"object": "chat.completion.chunk", "model": model, "choices": [{"index": 0, "delta": {"content": "from the "}}]},
                {"object": "chat.completion.chunk", "model": model, "choices": [{"index": 0, "delta": {"content": "provider"}, "finish_reason": "stop"}]},
            ]
            if (request.get("stream_options") or {}).get("include_usage"):
                events.append({"object": "chat.completion.chunk", "model": model, "choices": [], "usage": usage})
            for event in events:
                data = f"data: {json.dumps(event)}\n\n".encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            data = b"data: [DONE]\n\n"
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n\r\n")
            self.wfile.flush()

    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
