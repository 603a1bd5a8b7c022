"""The benchmark client against fake servers: parsing, phase split, and clear errors."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dspark_dynamic.tools import bench_client as bc


def chunk(**delta):
    token_ids = delta.pop("token_ids", None)
    choice = {"index": 0, "delta": delta}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"


GOOD_STREAM = [
    chunk(role="assistant", content=""),
    chunk(reasoning=" r1", token_ids=[1]),
    chunk(reasoning=" r2 r3", token_ids=[2, 3]),
    chunk(content="", token_ids=[9]),  # </think> alone: stays in the reasoning phase
    chunk(content=" a1 a2", token_ids=[4, 5]),
    b'data: {"choices": [], "usage": {"completion_tokens": 6}}\n\n',
    b"data: [DONE]\n\n",
]


def serve(stream_lines, metrics_status=404, models=b'{"data": [{"id": "m"}]}'):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            if self.path == "/v1/models":
                self.send_response(200)
                self.end_headers()
                self.wfile.write(models)
            else:
                self.send_response(metrics_status)
                self.end_headers()
                if metrics_status == 200:
                    self.wfile.write(b'dspark_dynamic:verified_draft_tokens_total{phase="reasoning",engine="1"} 4.0\n')

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for line in stream_lines:
                self.wfile.write(line)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def test_phase_split_and_missing_metrics(capsys):
    server, url = serve(GOOD_STREAM)
    try:
        assert bc.main(["--base-url", url, "--json", "-"]) == 0
    finally:
        server.shutdown()
    out = json.loads(capsys.readouterr().out)
    assert out["requests"] == len(bc.DEFAULT_PROMPTS)
    assert out["per_request"][0]["tokens"] == {"reasoning": 4, "answer": 2}  # r1 r2 r3 </think> | a1 a2
    assert out["phases"]["reasoning"]["tokens"] == 4 * out["requests"]
    assert out["metrics"] is None and out["approximate_tokens"] is False
    assert out["per_request"][0]["completion_tokens"] == 6


def test_human_output_says_when_metrics_are_missing(capsys):
    server, url = serve(GOOD_STREAM)
    try:
        assert bc.main(["--base-url", url]) == 0
    finally:
        server.shutdown()
    assert "no usable /metrics" in capsys.readouterr().out


def test_metrics_without_phase_series_are_reported(capsys):
    server, url = serve(GOOD_STREAM, metrics_status=200)
    try:
        assert bc.main(["--base-url", url, "--json", "-"]) == 0
    finally:
        server.shutdown()
    out = json.loads(capsys.readouterr().out)
    assert out["metrics"]["has_phase_series"] is True


@pytest.mark.parametrize(
    "lines, message",
    [
        ([b"data: {not json\n\n"], "not JSON"),
        ([b'data: {"object": "x"}\n\n'], "no 'choices'"),
        ([b'data: {"error": {"message": "boom"}}\n\n'], "server error"),
        ([b'data: {"choices": ["x"]}\n\n'], "malformed choice"),
    ],
)
def test_malformed_streams_give_one_clear_error(lines, message, capsys):
    server, url = serve(lines)
    try:
        assert bc.main(["--base-url", url]) == 2
    finally:
        server.shutdown()
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_server_down(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    assert bc.main(["--base-url", f"http://127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err
    assert "cannot reach the server" in err and "Traceback" not in err


def test_malformed_models_listing(capsys):
    server, url = serve(GOOD_STREAM, models=b'{"nope": 1}')
    try:
        assert bc.main(["--base-url", url]) == 2
    finally:
        server.shutdown()
    assert "malformed /v1/models" in capsys.readouterr().err


def test_metrics_delta_by_phase():
    def s(name, value, **labels):
        return {(name, tuple(sorted(labels.items()))): value}

    before = {**s("dspark_dynamic:verified_draft_tokens_total", 10, phase="reasoning", engine="1"),
              **s("vllm:spec_decode_num_draft_tokens_total", 30, engine="0")}
    after = {**s("dspark_dynamic:verified_draft_tokens_total", 25, phase="reasoning", engine="1"),
             **s("dspark_dynamic:accepted_draft_tokens_total", 5, phase="reasoning", engine="1"),
             **s("vllm:spec_decode_num_draft_tokens_total", 60, engine="0")}
    d = bc.metrics_delta(before, after)
    assert d["phases"]["reasoning"]["verified"] == 15
    assert d["phases"]["reasoning"]["acceptance"] == pytest.approx(5 / 15)
    assert d["vllm"]["draft_tokens"] == 30
