"""A fake OpenAI-compatible server on 127.0.0.1 that records which model and path were hit."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeProvider:
    """`mode`: ok | 500 | 429 | 400 | 401 | slow | drop (close the stream mid-way) | empty (200, no
    choices) | null (200, null content) | garbage (200, not JSON) | ptl (400 prompt too long) |
    summary500 (500 for summarizer requests only, ok for chats). `summary`: the text summarizer
    requests get (default: the reply)."""

    def __init__(self, mode: str = "ok", reply: str = "hello from fake", name: str = "fake", summary: str | None = None):
        self.mode = mode
        self.reply = reply
        self.summary = summary
        self.name = name
        self.hits: list[dict[str, Any]] = []
        self.count_prompt = False  # True: report about a token per 4 characters of the request, not 42
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                provider.hits.append({"path": self.path, "model": body.get("model"), "stream": body.get("stream", False),
                                      "auth": self.headers.get("Authorization", ""), "body": body,
                                  "headers": dict(self.headers.items())})
                provider.handle(self, body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _json(self, h: BaseHTTPRequestHandler, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _anthropic_cache(self, body: dict[str, Any]) -> dict[str, int]:
        """Input, cache-read and cache-write tokens of a Messages request (a token: 4 bytes of JSON)."""
        import hashlib

        blocks: list[dict[str, Any]] = list(body.get("tools") or [])
        system = body.get("system") or []
        blocks += [{"type": "text", "text": system}] if isinstance(system, str) else list(system)
        for message in body.get("messages") or []:
            content = message.get("content")
            blocks += [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
        digest = hashlib.sha256()
        ends: list[tuple[str, int, bool]] = []  # prefix hash, tokens up to here, marked
        tokens = 0
        for block in blocks:
            plain = {k: v for k, v in block.items() if k != "cache_control"}
            digest.update(json.dumps(plain, sort_keys=True).encode())
            tokens += max(1, len(json.dumps(plain)) // 4)
            ends.append((digest.hexdigest(), tokens, "cache_control" in block))
        store = self.__dict__.setdefault("cache", {})
        read = 0
        for i, (_, _, marked) in enumerate(ends):
            if marked:
                for key, upto, _ in ends[max(0, i - 19):i + 1]:
                    if key in store:
                        read = max(read, upto)
        last = max((upto for _, upto, marked in ends if marked), default=0)
        for key, upto, marked in ends:
            if marked:
                store[key] = upto
        write = max(0, last - read)
        return {"input_tokens": tokens - read - write, "cache_read_input_tokens": read,
                "cache_creation_input_tokens": write}

    def handle(self, h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        if h.path.rstrip("/").endswith("/messages"):  # Anthropic's Messages API
            self.anthropic(h, body)
            return
        mode = self.mode
        last = ((body.get("messages") or [{}])[-1].get("content") or "")
        summarizing = isinstance(last, str) and last.startswith("<<mfs:summarize>>")
        reply = self.summary if summarizing and self.summary is not None else self.reply
        if mode == "summary500":
            mode = "500" if summarizing else "ok"
        if mode == "ptl":
            self._json(h, 400, {"error": {"message": "This model's maximum context length is 8192 tokens. However, "
                                                     "your messages resulted in 9000 tokens.",
                                          "type": "invalid_request_error", "code": "context_length_exceeded"}})
            return
        if mode == "empty":
            self._json(h, 200, {"id": "x", "object": "chat.completion", "created": 1, "model": body.get("model"),
                                "choices": []})
            return
        if mode == "null" and not body.get("stream"):
            self._json(h, 200, {"id": "x", "object": "chat.completion", "created": 1, "model": body.get("model"),
                                "choices": [{"index": 0, "message": {"role": "assistant", "content": None},
                                             "finish_reason": "stop"}]})
            return
        if mode == "garbage":
            data = b"<html>not json at all"
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)
            return
        if mode in ("500", "429", "400", "401"):
            self._json(h, int(mode), {"error": {"message": f"{self.name} says {mode}", "type": "server_error",
                                                "code": mode}})
            return
        if mode == "slow":
            time.sleep(3)
        prompt = len(json.dumps(body.get("messages") or [])) // 4 if self.count_prompt else 42
        usage = {"prompt_tokens": prompt, "completion_tokens": 4, "total_tokens": prompt + 4,
                 "prompt_tokens_details": {"cached_tokens": min(40, prompt)}}
        if not body.get("stream"):
            self._json(h, 200, {"id": "x", "object": "chat.completion", "created": 1, "model": body.get("model"),
                                "choices": [{"index": 0, "message": {"role": "assistant", "content": reply},
                                             "finish_reason": "stop"}], "usage": usage})
            return
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        words = [] if mode == "null" else reply.split(" ")
        for i, word in enumerate(words):
            chunk = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": body.get("model"),
                     "choices": [{"index": 0, "delta": {"content": word + (" " if i < len(words) - 1 else "")},
                                  "finish_reason": None}]}
            h.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            h.wfile.flush()
            if mode == "drop" and i == 0:
                h.wfile.write(b"data: {broken")
                h.wfile.flush()
                h.close_connection = True
                return
        end = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": body.get("model"),
               "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        h.wfile.write(f"data: {json.dumps(end)}\n\n".encode())
        tail = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": body.get("model"),
                "choices": [], "usage": usage}
        h.wfile.write(f"data: {json.dumps(tail)}\n\n".encode())
        h.wfile.write(b"data: [DONE]\n\n")
        h.wfile.flush()

    def anthropic(self, h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        """An Anthropic Messages reply (JSON, or its server-sent events when `stream`). Modes: ok;
        nocache (a 400 naming cache_control for any request that carries one). It caches as the API
        does (`cache`): the prefix up to each marked block is written, and a request reads the longest
        prefix written before that ends at one of its blocks within 20 before a mark."""
        if self.mode == "nocache" and "cache_control" in json.dumps(body):
            self._json(h, 400, {"type": "error", "error": {"type": "invalid_request_error",
                                                           "message": "cache_control: Extra inputs are not permitted"}})
            return
        usage = {"output_tokens": 4, **self._anthropic_cache(body)}
        message = {"id": "msg_x", "type": "message", "role": "assistant", "model": body.get("model"),
                   "content": [{"type": "text", "text": self.reply}], "stop_reason": "end_turn",
                   "stop_sequence": None, "usage": usage}
        if not body.get("stream"):
            self._json(h, 200, message)
            return
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        events = [
            ("message_start", {"type": "message_start", "message": {**message, "content": [],
                                                                     "stop_reason": None}}),
            ("content_block_start", {"type": "content_block_start", "index": 0,
                                     "content_block": {"type": "text", "text": ""}}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                     "delta": {"type": "text_delta", "text": self.reply}}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                               "usage": {"output_tokens": 4}}),
            ("message_stop", {"type": "message_stop"}),
        ]
        for name, data in events:
            h.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
        h.wfile.flush()
