"""The Python client (client/funnel_client), the command-line client and the stress test, against a live stack."""

from __future__ import annotations

import http.server
import io
import json
import socket
import subprocess
import sys
import threading
from concurrent.futures import Future, wait
from pathlib import Path

import numpy as np
import pytest

from funnel.scripts.redis_local import free_port
from funnel.scripts.stack import Stack
from funnel_client import (
    BadRequest,
    Client,
    ConnectionFailed,
    FunnelHTTPError,
    NotFound,
    ServerBusy,
    ServerError,
    Timeout,
    Unauthorized,
    error_for,
)

ROOT = Path(__file__).resolve().parents[2]
CAT_CLASSES = {281, 282, 283, 284, 285, 286, 287}  # tabby .. lynx
IMAGE, TEXT = "image-classifier", "text-embedding"


@pytest.fixture(scope="module")
def stack(model_store, tmp_path_factory):
    with Stack(model_store=model_store, log_dir=tmp_path_factory.mktemp("client")) as running:
        yield running


@pytest.fixture()
def client(stack):
    with Client(stack.url, timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def cat_file(cat_jpeg, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("images") / "cat.jpg"
    path.write_bytes(cat_jpeg)
    return path


def run_script(command: str, *args: str, stdin: str | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess:
    """An installed console script (funnel-client, funnel stress), as a user runs it."""
    program = [str(Path(sys.executable).parent / command.split()[0]), *command.split()[1:]]
    return subprocess.run([*program, *args], input=stdin, capture_output=True, text=True, timeout=timeout)


# -- the Python client ---------------------------------------------------------


@pytest.mark.parametrize("given_as", ["bytes", "path", "str path", "file"])
def test_predict_an_image_given_any_way(client, cat_jpeg, cat_file, given_as):
    image = {"bytes": cat_jpeg, "path": cat_file, "str path": str(cat_file),
             "file": io.BytesIO(cat_jpeg)}[given_as]
    answer = client.predict(IMAGE, image=image)
    assert answer["model"] == IMAGE
    top = answer["predictions"]
    assert len(top) == 5 and top[0]["index"] in CAT_CLASSES and "cat" in top[0]["label"]
    assert answer["meta"]["worker"] and answer["meta"]["batch_size"] >= 1


def test_predict_an_image_from_an_open_file(client, cat_file):
    with open(cat_file, "rb") as handle:
        assert client.predict(IMAGE, handle)["predictions"][0]["index"] in CAT_CLASSES


def test_predict_text_and_texts(client):
    one = client.predict(TEXT, text="A man is eating food.")
    assert len(one["embedding"]) == 384
    assert np.linalg.norm(one["embedding"]) == pytest.approx(1.0, abs=1e-4)
    many = client.predict(TEXT, texts=["A man is eating food.", "The girl is carrying a baby."])
    assert [len(r["embedding"]) for r in many["results"]] == [384, 384] and len(many["meta"]) == 2
    np.testing.assert_allclose(many["results"][0]["embedding"], one["embedding"], atol=1e-5)


def test_submit_twenty_texts_at_once(stack):
    texts = [f"sentence number {i} about {'cats ' * (i % 4)}and dogs" for i in range(20)]
    with Client(stack.url, timeout=30, workers=20) as client:
        alone = [client.predict(TEXT, text=t)["embedding"] for t in texts]
        futures = [client.submit(TEXT, text=t) for t in texts]
        assert all(isinstance(f, Future) for f in futures)
        _, pending = wait(futures, timeout=60)
        assert not pending
        for expected, future in zip(alone, futures):  # each future holds its own text's answer
            np.testing.assert_allclose(future.result()["embedding"], expected, atol=1e-5)


def test_submit_carries_errors_in_the_future(client):
    future = client.submit(TEXT, text="   ")
    with pytest.raises(BadRequest) as caught:
        future.result(timeout=30)
    assert caught.value.code == "empty_input"


def test_typed_errors(client, cat_jpeg):
    with pytest.raises(NotFound) as caught:
        client.predict("no-such-model", text="x")
    assert (caught.value.status, caught.value.code) == (404, "unknown_model")
    assert "no-such-model" in caught.value.message
    with pytest.raises(BadRequest) as caught:
        client.predict(TEXT, text="")
    assert (caught.value.status, caught.value.code) == (400, "empty_input")
    with pytest.raises(BadRequest) as caught:
        client.predict(TEXT, image=cat_jpeg)  # an image to the text model
    assert caught.value.status == 415
    with pytest.raises(BadRequest) as caught:
        client.predict(IMAGE, image=b"not an image at all")
    assert (caught.value.status, caught.value.code) == (400, "not_an_image")
    assert isinstance(caught.value, FunnelHTTPError)


def test_arguments_are_checked_before_sending(client):
    with pytest.raises(ValueError):
        client.predict(TEXT)
    with pytest.raises(ValueError):
        client.predict(TEXT, text="a", texts=["b"])
    with pytest.raises(TypeError):
        client.predict(TEXT, texts="one string")


def test_models_and_health(client):
    served = {m["name"]: m for m in client.models()["models"]}
    assert set(served) == {IMAGE, TEXT}
    assert served[TEXT]["task"] == "text_embedding" and served[TEXT]["workers"]
    assert client.health()["status"] == "ok"
    assert client.openapi()["openapi"].startswith("3.")


def test_one_client_shared_by_many_threads(client):
    """Thread-safe: 8 threads x 5 requests on one client, each gets its own text's answer."""
    reference = {i: client.predict(TEXT, text=f"thread {i}")["embedding"] for i in range(8)}
    failures = []

    def work(i):
        for _ in range(5):
            got = client.predict(TEXT, text=f"thread {i}")["embedding"]
            if not np.allclose(got, reference[i], atol=1e-5):
                failures.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads) and not failures


def test_api_key_is_sent(model_store, tmp_path):
    with Stack(model_store=model_store, log_dir=tmp_path, workers=[TEXT], models=[TEXT],
               web_env={"FUNNEL_API_KEYS": "k1,k2"}) as guarded:
        with Client(guarded.url, api_key="k2") as good:
            assert len(good.predict(TEXT, text="hello")["embedding"]) == 384
        with Client(guarded.url, api_key="wrong") as bad:
            with pytest.raises(Unauthorized) as caught:
                bad.predict(TEXT, text="hello")
            assert caught.value.status == 401
            with pytest.raises(Unauthorized):
                bad.models()
            assert bad.health()["status"] == "ok"  # open without a key


def test_connection_refused_is_a_typed_error():
    with Client(f"http://127.0.0.1:{free_port()}", timeout=5, retries=0) as client:
        with pytest.raises(ConnectionFailed) as caught:
            client.predict(TEXT, text="x")
    assert caught.value.status is None


# -- retries and error mapping, against a scripted local server ----------------------------


class Scripted(http.server.ThreadingHTTPServer):
    """Answers each request with the next (status, headers, body) of its script; repeats the last."""

    daemon_threads = True

    def __init__(self, script):
        self.script, self.seen = list(script), []
        super().__init__(("127.0.0.1", 0), ScriptedHandler)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}"


class ScriptedHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        server = self.server
        server.seen.append((self.command, self.path, dict(self.headers), body))
        status, headers, payload = server.script.pop(0) if len(server.script) > 1 else server.script[0]
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        for name, value in {"Content-Type": "application/json", **headers}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer


@pytest.fixture()
def scripted():
    servers = []

    def start(*script):
        server = Scripted(script)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


BUSY = (503, {"Retry-After": "0"}, {"error": {"code": "overloaded", "message": "the queue is full"}})
OK = (200, {}, {"model": TEXT, "embedding": [0.6, 0.8], "meta": {}})


def test_503_is_retried_after_retry_after(scripted):
    server = scripted(BUSY, BUSY, OK)
    with Client(server.url, retries=3, api_key="secret") as client:
        assert client.predict(TEXT, text="hi")["embedding"] == [0.6, 0.8]
    assert len(server.seen) == 3  # two 503s, then the answer
    method, path, headers, body = server.seen[-1]
    assert (method, path) == ("POST", f"/v1/models/{TEXT}/predict")
    assert headers["Content-Type"] == "application/json" and json.loads(body) == {"text": "hi"}
    assert headers["Authorization"] == "Bearer secret"


def test_503_after_every_retry_is_server_busy(scripted):
    server = scripted(BUSY)
    with Client(server.url, retries=2) as client:
        with pytest.raises(ServerBusy) as caught:
            client.predict(TEXT, text="hi")
    assert len(server.seen) == 3  # the first try and two retries
    assert (caught.value.status, caught.value.code) == (503, "overloaded")
    assert caught.value.headers["retry-after"] == "0"


def test_retry_after_is_capped(scripted):
    server = scripted((503, {"Retry-After": "3600"}, BUSY[2]), OK)
    with Client(server.url, retries=1, max_retry_wait_s=0.01) as client:
        assert client.predict(TEXT, text="hi")["embedding"]  # did not wait an hour


@pytest.mark.parametrize("status,cls", [(400, BadRequest), (413, BadRequest), (415, BadRequest),
                                        (422, BadRequest), (401, Unauthorized), (404, NotFound),
                                        (504, Timeout), (500, ServerError), (502, ServerError)])
def test_each_status_has_its_error(scripted, status, cls):
    server = scripted((status, {}, {"error": {"code": f"code_{status}", "message": "what went wrong"}}))
    with Client(server.url) as client:
        with pytest.raises(cls) as caught:
            client.predict(TEXT, text="hi")
    assert (caught.value.status, caught.value.code, caught.value.message) == (
        status, f"code_{status}", "what went wrong")
    assert len(server.seen) == 1  # only 503 is retried


def test_stream_results_retries_a_503_and_reports_a_stream_cut_short(scripted):
    server = scripted(BUSY, (200, {"Content-Type": "application/x-ndjson"}, b'{"embedding":[1.0]}\nnull\n'))
    with Client(server.url, retries=2) as client:
        assert list(client.stream_results("abc", offset=3)) == [{"embedding": [1.0]}, None]
    assert [path for _, path, _, _ in server.seen] == ["/v1/jobs/abc/results?offset=3"] * 2
    listener = socket.create_server(("127.0.0.1", 0))

    def cut_short():  # one chunk of one line, then the connection closes without the last chunk
        connection, _ = listener.accept()
        with connection, listener:
            connection.recv(65536)
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
                               b"Transfer-Encoding: chunked\r\n\r\n5\r\nnull\n\r\n")

    thread = threading.Thread(target=cut_short, daemon=True)
    thread.start()
    got = []
    with Client(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout=5) as client:
        with pytest.raises(ConnectionFailed, match="broke off"):
            for result in client.stream_results("abc"):
                got.append(result)
    thread.join(5)
    assert got == [None]  # what came before the cut, then the error: never a silently short file


def test_an_error_without_a_json_body_still_has_a_code():
    error = error_for(502, b"<html>Bad Gateway</html>")
    assert isinstance(error, ServerError) and error.code == "http_502" and "Bad Gateway" in error.message


def test_client_timeout_is_a_typed_error():
    slow = threading.Event()

    class Silent(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            slow.wait(5)  # answers nothing until the test ends

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Silent)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        with Client(f"http://127.0.0.1:{server.server_address[1]}", timeout=0.3) as client:
            with pytest.raises(Timeout) as caught:
                client.predict(TEXT, text="hi")
        assert caught.value.status is None and caught.value.code == "client_timeout"
    finally:
        slow.set()
        server.shutdown()
        server.server_close()


# -- the command-line client ---------------------------------------------------


def test_cli_classifies_an_image(stack, cat_file):
    done = run_script("funnel-client", "--url", stack.url, "--model", IMAGE, "--image", str(cat_file))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "label" in lines[1] and "probability" in lines[1]
    table = lines[2:7]
    assert [row.split()[0] for row in table] == ["1", "2", "3", "4", "5"]
    assert "cat" in table[0]
    assert "infer" in done.stdout and "round trip" in done.stdout


def test_cli_embeds_a_text(stack):
    done = run_script("funnel-client", "--url", stack.url, "--model", TEXT,
                      "--text", "A man is eating food.")
    assert done.returncode == 0, done.stderr
    assert "384 dimensions" in done.stdout and "queue" in done.stdout and "round trip" in done.stdout


def test_cli_json_and_errors(stack):
    done = run_script("funnel-client", "--url", stack.url, "--model", TEXT, "--text", "a", "--text", "b",
                      "--json")
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["results"]) == 2
    done = run_script("funnel-client", "--url", stack.url, "--model", TEXT, "--text", " ")
    assert done.returncode == 1 and "400 empty_input" in done.stderr
    done = run_script("funnel-client", "--url", stack.url, "--model", TEXT)
    assert done.returncode == 2 and "--text" in done.stderr


def test_cli_interactive_text(stack):
    done = run_script("funnel-client", "--url", stack.url, "--model", TEXT, "--interactive",
                      stdin="A man is eating food.\n\n" + "word " * 300 + "\nThe girl is carrying a baby.\n"
                            "quit\nnot sent\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("384 dimensions") == 2  # two texts, then quit
    assert "400 text_too_long" in done.stdout  # an error does not end the session
    assert done.stdout.count("round trip") == 2


def test_cli_interactive_images_until_eof(stack, cat_file):
    done = run_script("funnel-client", "--url", stack.url, "--model", IMAGE, "-i",
                      stdin=f"{cat_file}\n/no/such/file.jpg\n{cat_file}\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("Egyptian cat") + done.stdout.count("tabby") >= 2
    assert "no such file" in done.stdout


def test_cli_bulk_mode_embeds_a_file_as_one_job(stack, tmp_path):
    lines = [f"bulk passage {i}: {'the quick brown fox ' * (i % 5)}jumps" for i in range(300)]
    corpus, out = tmp_path / "corpus.txt", tmp_path / "vectors.jsonl"
    corpus.write_text("\n".join(lines[:150]) + "\n\n" + "\n".join(lines[150:]) + "\n")  # a blank line skipped
    done = run_script("funnel-client", "--url", stack.url, "--model", TEXT, "--bulk", str(corpus),
                      "--output", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # the results went to the file; progress and the summary to stderr
    assert "300/300 100%" in done.stderr and "done: 300 results written to" in done.stderr
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(results) == 300
    with Client(stack.url) as client:
        sync = client.predict(TEXT, texts=[lines[0], lines[150], lines[299]])["results"]
    for got, expected in zip([results[0], results[150], results[299]], sync):  # in input order
        np.testing.assert_allclose(got["embedding"], expected["embedding"], atol=1e-5)
    # Through `funnel client`, from stdin to stdout, quietly.
    done = run_script("funnel client", "--url", stack.url, "--model", TEXT, "--bulk", "-", "--quiet",
                      stdin="first line\nsecond line\n")
    assert done.returncode == 0, done.stderr
    assert [len(json.loads(line)["embedding"]) for line in done.stdout.splitlines()] == [384, 384]
    assert "[" not in done.stderr  # no progress bar
    done = run_script("funnel-client", "--url", stack.url, "--model", TEXT, "--bulk", str(corpus), "--text", "x")
    assert done.returncode == 2


def test_cli_bulk_mode_takes_image_paths_and_reports_a_bad_one(stack, cat_file, tmp_path):
    paths = tmp_path / "images.txt"
    paths.write_text(f"{cat_file}\n{cat_file}\n")
    done = run_script("funnel-client", "--url", stack.url, "--model", IMAGE, "--bulk", str(paths), "--quiet")
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["predictions"][0]["index"] in CAT_CLASSES for r in results] == [True, True]
    notes = tmp_path / "notes.txt"
    notes.write_text("not an image\n")
    paths.write_text(f"{cat_file}\n{notes}\n")
    done = run_script("funnel-client", "--url", stack.url, "--model", IMAGE, "--bulk", str(paths))
    assert done.returncode == 1 and "400 not_an_image" in done.stderr and "item 1" in done.stderr


def test_a_bulk_job_of_images(client, cat_jpeg, cat_file, coffee_jpeg):
    job = client.submit_job(IMAGE, images=[cat_jpeg, cat_file, coffee_jpeg])
    assert job["progress"]["total"] == 3
    final = client.wait(job["id"], timeout=120, poll_s=0.1)
    assert final["state"] == "done"
    cat, cat_again, coffee = client.results(job["id"])
    assert cat == cat_again and cat["predictions"][0]["index"] in CAT_CLASSES
    assert coffee["predictions"][0]["index"] not in CAT_CLASSES
    with pytest.raises(BadRequest) as caught:
        client.submit_job(IMAGE, images=[cat_jpeg, b"not an image"])
    assert caught.value.code == "not_an_image" and caught.value.message.startswith("item 1:")
    with pytest.raises(BadRequest) as caught:  # a text model takes no images
        client.submit_job(TEXT, images=[cat_jpeg])
    assert caught.value.status == 415


# -- the stress test -----------------------------------------------------------


def test_stress_test_prints_its_table(stack, tmp_path):
    out = tmp_path / "stress.json"
    done = run_script("funnel stress", "--url", stack.url, "--clients", "4", "--requests", "5",
                      "--model", TEXT, "--text", "stress", "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    text = done.stdout
    assert "requests     20 (4 clients x 5)" in text
    assert "succeeded    20" in text and "failed       0" in text
    header = next(line for line in text.splitlines() if line.startswith("latency ms"))
    assert header.split()[2:] == ["mean", "std", "p50", "p90", "p99", "max"]
    values = [float(v) for v in text.splitlines()[text.splitlines().index(header) + 1].split()]
    mean, std, p50, p90, p99, peak = values
    assert 0 < p50 <= p90 <= p99 <= peak and mean > 0 and std >= 0
    assert "req/s" in text
    assert "20/20" in done.stderr  # the progress bar reached the end
    result = json.loads(out.read_text())
    assert result["ok"] == 20 and result["errors"] == {} and result["throughput_rps"] > 0


def test_stress_test_counts_errors_by_status(stack, cat_file):
    done = run_script("funnel stress", "--url", stack.url, "--clients", "2", "--requests", "3",
                      "--model", "no-such-model", "--no-progress")
    assert done.returncode == 1
    assert "failed       6 (404: 6)" in done.stdout and "unknown_model" in done.stdout
    done = run_script("funnel stress", "--url", stack.url, "--clients", "2", "--requests", "2",
                      "--image", str(cat_file), "--no-progress")
    assert done.returncode == 0 and "succeeded    4" in done.stdout, done.stdout + done.stderr


def test_stress_test_help_documents_every_option():
    done = run_script("funnel stress", "--help")
    assert done.returncode == 0
    for option in ["--url", "--model", "--text", "--image", "--clients", "--requests", "--warmup",
                   "--timeout", "--retries", "--api-key", "--json", "--no-progress"]:
        assert option in done.stdout
