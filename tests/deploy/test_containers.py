"""docker-compose.cpu.yml for real: the images built, the stack up in containers, served over HTTP.

Runs where a Docker engine answers (skipped with the reason otherwise; .ci/run
starts dockerd where it is installed). Base images come from
deploy/base-images.sh, made from Debian packages, since no registry need be
reachable; the official images are only the Compose files' defaults. The CPU
torch wheel the host's pip finds on local disk is served to the build on
127.0.0.1 (TORCH_FIND_LINKS, BUILD_NETWORK=host). Then, as docs/deployment.md
shows them: `build`, `up -d`, wait for every HEALTHCHECK, the page, the cat
photo and a sentence over the published port (nginx's, 127.0.0.1 only; the web
tier behind it is not published), `--scale
worker-text=3` with answers from more than one replica, `exec -T redis
redis-cli`, `stop worker-text` under load with no request lost and every worker
exiting 0, and `down`, in a finally. The images are kept, and with them the
builder's cache: a second run builds in seconds.

FUNNEL_TEST_CONTAINERS=0 skips this module; =1 makes a missing engine an error.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from funnel.common.contracts.keys import Keys
from funnel.scripts.redis_local import free_port
from tests.deploy.support import ROOT, listing
from tests.support import http, wait_for

COMPOSE_FILE = "docker-compose.cpu.yml"
WEB_IMAGE = "funnel-test/web:latest"
WORKER_IMAGE = "funnel-test/worker:cpu"
SERVICES = ("redis", "web", "grpc", "nginx", "worker-image", "worker-text")
WORKER_REPLICAS = 2  # docker-compose.cpu.yml's workers a model: two share a CPU host's cores
BUILD_TIMEOUT_S = 1500  # cold, on 2 cores: about 9 minutes (docs/deployment.md)
WHEEL_PORT = int(os.environ.get("FUNNEL_TEST_WHEEL_PORT", "38765"))
CAT_LABELS = ("egyptian cat", "tabby", "tiger cat")
# The build log and the timings, for docs/deployment.md.
LOG_DIR = Path(os.environ.get("FUNNEL_TEST_CONTAINER_LOGS", ROOT / "run" / "containers"))

pytestmark = pytest.mark.timeout(BUILD_TIMEOUT_S + 600)


def _skip_or_fail(reason: str):
    if os.environ.get("FUNNEL_TEST_CONTAINERS") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def _engine() -> None:
    if os.environ.get("FUNNEL_TEST_CONTAINERS") == "0":
        pytest.skip("FUNNEL_TEST_CONTAINERS=0")
    if not shutil.which("docker"):
        _skip_or_fail("no docker CLI (Debian package docker.io, requirements/apt-deploy.txt)")
    try:
        done = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"],
                              capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        done = None
    if done is None or done.returncode != 0:
        _skip_or_fail("no Docker engine answers (start dockerd as root: .ci/run does): "
                      + (done.stderr.strip()[-300:] if done else "docker version timed out"))


def compose_command() -> list[str]:
    """`docker compose` (v2) where the plugin is installed, else Debian's docker-compose 1.29."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    _skip_or_fail("no Compose: neither `docker compose` nor docker-compose "
                  "(requirements/apt-deploy.txt)")
    raise AssertionError("unreachable")


class WheelServer:
    """The host's CPU torch wheel on http://127.0.0.1:PORT/, a find-links page for the build.

    PyPI's torch for x86_64 Linux is the CUDA build (GBs, with the nvidia-* wheels);
    the CPU build of the pinned version is found where the host's pip finds it
    (its find-links, e.g. /opt/wheels) and copied to a wheelhouse kept between runs.
    """

    def __init__(self, wheelhouse: Path):
        self.wheelhouse = wheelhouse
        self.server: ThreadingHTTPServer | None = None

    def find_torch(self) -> Path | None:
        pin = subprocess.run([sys.executable, str(ROOT / "deploy" / "requirements.py"),
                              str(ROOT / "pyproject.toml"), "--only", "torch", "worker"],
                             capture_output=True, text=True, check=True).stdout.strip()
        self.wheelhouse.mkdir(parents=True, exist_ok=True)
        # --no-index: only local find-links; a CPU build is a "+cpu" local version.
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-index",
                        "--dest", str(self.wheelhouse), pin], capture_output=True, timeout=300)
        version = pin.split("==")[1]
        found = sorted(self.wheelhouse.glob(f"torch-{version}+cpu-*.whl"))
        return found[-1] if found else None

    def start(self) -> str:
        """The same port every run when it is free: the URL is a build argument, and the
        classic builder rebuilds every RUN after a build argument that changed."""
        directory = str(self.wheelhouse)

        class Handler(SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=directory, **kwargs)

            def log_message(self, *args):  # quiet
                pass

        handler = Handler
        try:
            self.server = ThreadingHTTPServer(("127.0.0.1", WHEEL_PORT), handler)
        except OSError:  # taken: any port, and a slower build
            self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}/"

    def stop(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()


class Stack:
    """One Compose project: its commands, bounded in time, with the logs on failure."""

    def __init__(self, env: dict[str, str], project: str):
        self.env, self.project = env, project
        self.compose = [*compose_command(), "-f", COMPOSE_FILE, "-p", project]
        self.port = int(env["WEB_PORT"])
        self.url = f"http://127.0.0.1:{self.port}"

    def run(self, *args: str, timeout: float = 120, check: bool = True, log: Path | None = None
            ) -> subprocess.CompletedProcess:
        if log:
            with open(log, "w") as out:
                done = subprocess.run([*self.compose, *args], cwd=ROOT, env=self.env, stdout=out,
                                      stderr=subprocess.STDOUT, text=True, timeout=timeout)
            output = log.read_text(errors="replace")
            done = subprocess.CompletedProcess(done.args, done.returncode, output, "")
        else:
            done = subprocess.run([*self.compose, *args], cwd=ROOT, env=self.env,
                                  capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited with {done.returncode}:\n"
                                 f"{(done.stdout + done.stderr)[-4000:]}\n{self.logs()}")
        return done

    def logs(self) -> str:
        try:
            done = subprocess.run([*self.compose, "logs", "--no-color", "--tail", "40"], cwd=ROOT,
                                  env=self.env, capture_output=True, text=True, timeout=60)
            return "--- compose logs ---\n" + done.stdout[-8000:]
        except Exception as exc:  # the logs are for the message only
            return f"(no logs: {exc})"

    def containers(self, service: str | None = None) -> list[dict]:
        ids = self.run("ps", "-q", *([service] if service else [])).stdout.split()
        if not ids:
            return []
        done = subprocess.run(["docker", "inspect", *ids], capture_output=True, text=True,
                              timeout=60, check=True)
        return json.loads(done.stdout)

    def wait_healthy(self, timeout_s: float, counts: dict[str, int]) -> list[dict]:
        """Every container running and its HEALTHCHECK passing (a condition, not a sleep)."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.containers()
            by_service: dict[str, list[dict]] = {}
            for c in found:
                by_service.setdefault(c["Config"]["Labels"]["com.docker.compose.service"], []).append(c)
            states = {c["Name"]: (c["State"]["Status"], c["State"].get("Health", {}).get("Status"))
                      for c in found}
            if (all(len(by_service.get(s, [])) == n for s, n in counts.items())
                    and all(s == ("running", "healthy") for s in states.values())):
                return found
            dead = [name for name, (status, _) in states.items() if status in ("exited", "dead")]
            if dead or time.monotonic() > deadline:
                raise AssertionError(f"not healthy within {timeout_s} s ({'exited: ' if dead else ''}"
                                     f"{dead or states}):\n{self.logs()}")
            time.sleep(1)

    def exec(self, service: str, *argv: str, index: int = 1) -> str:
        return self.run("exec", "-T", "--index", str(index), service, *argv, timeout=60).stdout


def embed(url: str, text: str) -> tuple[int, dict]:
    status, body, _ = http("POST", f"{url}/v1/models/text-embedding/predict",
                           json_body={"text": text}, timeout=60)
    return status, body


def timings_record(name: str, seconds: float) -> None:
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    with open(LOG_DIR / "timings.txt", "a") as out:
        out.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {name} {seconds:.1f}s\n")


# ---------------------------------------------------------------------------


class Build:
    """The base images, then the web and worker images, built on a thread of their own from the start of
    the session (tests/conftest.py starts it once the suite is collected, and runs the light tests
    first), so that the build overlaps them. The stack fixture waits for it; what stopped it (a skip
    included) is raised there."""

    def __init__(self):
        self._thread: threading.Thread | None = None
        self._outcome: dict[str, str] | BaseException | None = None

    def start(self) -> Build:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="image build", daemon=True)
            self._thread.start()
        return self

    def wait(self) -> dict[str, str]:
        """The Compose environment the images were built with."""
        assert self._thread is not None
        self._thread.join()
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        assert self._outcome is not None
        return self._outcome

    def _run(self) -> None:
        try:
            self._outcome = self._build()
        except BaseException as exc:  # a skip too: raised again in the fixture, on the test's thread
            self._outcome = exc

    def _build(self) -> dict[str, str]:
        _engine()
        compose_command()
        LOG_DIR.mkdir(parents=True, exist_ok=True)

        # Stand-in base images (kept between runs; made in about 1.5 minutes).
        started = time.monotonic()
        made = subprocess.run(["bash", str(ROOT / "deploy" / "base-images.sh"), "python", "redis", "nginx"],
                              capture_output=True, text=True, timeout=600)
        if made.returncode != 0:
            _skip_or_fail(f"deploy/base-images.sh could not make the base images "
                          f"(needs root, debootstrap, a Debian mirror):\n{made.stderr[-2000:]}")
        bases = dict(line.removeprefix("export ").split("=", 1) for line in made.stdout.splitlines())
        timings_record("base-images", time.monotonic() - started)

        env = {k: v for k, v in os.environ.items() if not k.startswith(("FUNNEL_", "COMPOSE_"))}
        env.update(bases)
        env.update({
            "CUDA_IMAGE": bases["PYTHON_IMAGE"],  # not built for the cpu target; never pulled
            "WEB_IMAGE": WEB_IMAGE, "WORKER_IMAGE": WORKER_IMAGE,
            "WEB_BIND": "127.0.0.1", "WEB_PORT": str(free_port()),
            "GRPC_BIND": "127.0.0.1", "GRPC_PORT": str(free_port()),
            "BUILD_NETWORK": "host",  # the build reaches the wheel server on 127.0.0.1
            "DOCKER_BUILDKIT": "0",  # the classic builder: no frontend image to pull
            # Two cores: one backend thread per worker, a small web.
            "FUNNEL_INTRA_OP_THREADS": "1", "FUNNEL_PROCESSES": "1", "FUNNEL_THREADS": "16",
        })
        wheels = WheelServer(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                             / "funnel" / "wheelhouse")
        if wheels.find_torch():
            env["TORCH_FIND_LINKS"] = wheels.start()
            env["TORCH_INDEX_URL"] = "https://pypi.org/simple"  # no other index to try
        try:
            builder = Stack(env, "funnelbuild")
            before = {image: _image_id(image) for image in (WEB_IMAGE, WORKER_IMAGE)}
            for service in ("web", "worker-text"):  # worker-image: the same image, then cached
                started = time.monotonic()
                builder.run("build", service, timeout=BUILD_TIMEOUT_S, log=LOG_DIR / f"build-{service}.log")
                timings_record(f"build {service}", time.monotonic() - started)
            for image, old in before.items():  # the image this build replaced, if any
                if old and old != _image_id(image):
                    subprocess.run(["docker", "rmi", old], capture_output=True, timeout=120)
        finally:
            wheels.stop()
        return env


BUILD = Build()


@pytest.fixture(scope="module")
def stack():
    env = BUILD.start().wait()
    stack = Stack(env, f"funneltest{uuid.uuid4().hex[:8]}")
    try:
        started = time.monotonic()
        stack.run("up", "-d", "--no-build", timeout=300)
        stack.wait_healthy(240, {s: WORKER_REPLICAS if s.startswith("worker-") else 1 for s in SERVICES})
        timings_record("up healthy", time.monotonic() - started)
        yield stack
    finally:
        stack.run("down", "--volumes", "--remove-orphans", "--timeout", "20", timeout=180, check=False)
    left = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={stack.project}"],
                          capture_output=True, text=True, timeout=60).stdout.split()
    assert not left, f"`down` left containers {left}"


def _image_id(image: str) -> str | None:
    done = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", image],
                          capture_output=True, text=True, timeout=60)
    return done.stdout.strip() if done.returncode == 0 else None


def test_images_run_as_uid_10001_with_healthchecks(stack):
    for image in (WEB_IMAGE, WORKER_IMAGE):
        config = json.loads(subprocess.run(["docker", "image", "inspect", image], capture_output=True,
                                           text=True, check=True, timeout=60).stdout)[0]["Config"]
        assert config["User"] == "10001:10001", image
        assert config["Healthcheck"]["Test"][:2] == ["CMD", "python"], image
        assert not any(e.startswith("PYTHONPATH=") for e in config["Env"]), "the project is installed"
    for service in ("web", "worker-text", "worker-image"):
        assert stack.exec(service, "id", "-u").strip() == "10001", service
    for c in stack.containers():
        assert c["State"]["Health"]["Status"] == "healthy", c["Name"]
        # Ports are published on the loopback only.
        for bindings in (c["HostConfig"].get("PortBindings") or {}).values():
            assert {b["HostIp"] for b in bindings} == {"127.0.0.1"}, c["Name"]
    # Only the front door and the gRPC service are published; the web tier is reached through nginx.
    published = {c["Name"] for c in stack.containers() if c["HostConfig"].get("PortBindings")}
    assert published and all("nginx" in name or "grpc" in name for name in published), published
    # The project is installed in the image, not on PYTHONPATH: its console scripts run.
    assert "funnel-worker" in stack.exec("worker-text", "sh", "-c", "command -v funnel-worker")


def test_page_cat_and_sentence(stack, cat_jpeg):
    status, body, headers = http("GET", f"{stack.url}/")
    assert status == 200 and headers["Content-Type"].startswith("text/html"), (status, headers)

    status, body, _ = http("POST", f"{stack.url}/v1/models/image-classifier/predict", body=cat_jpeg,
                           headers={"Content-Type": "image/jpeg"})
    assert status == 200, body
    top = body["predictions"][0]["label"].lower()
    assert any(label in top for label in CAT_LABELS), body["predictions"][:3]

    status, body = embed(stack.url, "A man is eating food.")
    assert status == 200, body
    assert len(body["embedding"]) == 384


def test_grpc_service_answers(stack):
    """The grpc service (the web image's funnel-grpc) on its published port, through tritonclient."""
    import tritonclient.grpc as grpcclient
    with grpcclient.InferenceServerClient(f"127.0.0.1:{stack.env['GRPC_PORT']}") as triton:
        assert triton.is_server_ready()
        sentence = grpcclient.InferInput("TEXT", [1], "BYTES")
        sentence.set_data_from_numpy(np.array([b"A man is eating food."], dtype=object))
        assert triton.infer("text-embedding", [sentence]).as_numpy("embedding").shape == (1, 384)


def test_three_text_workers_share_the_queue(stack):
    stack.run("up", "-d", "--no-build", "--no-recreate", "--scale", "worker-text=3", timeout=180)
    stack.wait_healthy(240, {"redis": 1, "web": 1, "grpc": 1, "nginx": 1, "worker-image": WORKER_REPLICAS,
                             "worker-text": 3})
    live = wait_for(lambda: (lambda m: m if len(m.get("text-embedding", [])) == 3 else None)(
        listing(stack.url)), 120, 0.25, "3 text workers in /v1/models", detail=stack.logs)
    ids = {w["id"] for w in live["text-embedding"]}
    hosts = {c["Config"]["Hostname"] for c in stack.containers("worker-text")}
    assert {w["host"] for w in live["text-embedding"]} == hosts

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda i: embed(stack.url, f"A man is eating food, take {i}."),
                                range(90)))
    assert all(status == 200 for status, _ in answers), [b for s, b in answers if s != 200][:3]
    served = {body["meta"]["worker"] for _, body in answers}
    assert served <= ids and len(served) > 1, served


def test_redis_cli_in_the_redis_container(stack):
    assert stack.exec("redis", "redis-cli", "LLEN", "funnel:queue:{text-embedding}:1").strip() == "0"
    worker = listing(stack.url)["text-embedding"][0]
    fields = stack.exec("redis", "redis-cli", "HGETALL", Keys("funnel").worker("text-embedding", worker["id"])).split()
    record = dict(zip(fields[::2], fields[1::2]))
    assert record["host"] == worker["host"] and record["device"] == "cpu", record


def test_stop_under_load_loses_nothing(stack):
    """`stop worker-text` with requests flowing: each worker answers what it took and exits 0.

    A request queued before the last worker deregistered waits in Redis and `start` serves it; one sent
    after is answered 503 `no_worker` at once with a Retry-After (failure contract), and the client that
    honours it is served once `start` has run. Nothing else may be answered.
    """
    sending, backoff = threading.Event(), threading.Event()  # backoff is never set: a client's pause
    sending.set()
    results: list[tuple[float, int, dict, str | None]] = []  # when answered, status, body, Retry-After

    def client(n: int) -> None:
        i = 0
        while sending.is_set():
            status, body, headers = http("POST", f"{stack.url}/v1/models/text-embedding/predict",
                                         json_body={"text": f"Client {n} says sentence {i}."}, timeout=60)
            results.append((time.monotonic(), status, body, headers.get("Retry-After")))
            i += 1
            if status == 503:
                backoff.wait(0.5)  # what a client owes Retry-After, shortened to keep the test short

    before = {c["Id"] for c in stack.containers("worker-text")}
    threads = [threading.Thread(target=client, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(results) >= 20, 60, 0.25, "20 answers under load", detail=stack.logs)
        during = len(results)
        stack.run("stop", "--timeout", "30", "worker-text", timeout=120)
        stopped = json.loads(subprocess.run(["docker", "inspect", *before], capture_output=True, text=True,
                                            check=True, timeout=60).stdout)
        stack.run("start", "worker-text", timeout=120)
        started = time.monotonic()
        wait_for(lambda: sum(1 for at, status, _, _ in results if at > started and status == 200) >= 3, 90, 0.25,
                 "answers after `start`", detail=stack.logs)
    finally:
        sending.clear()
    for t in threads:
        t.join(timeout=90)
    assert not any(t.is_alive() for t in threads)
    assert {c["State"]["Status"] for c in stopped} == {"exited"}
    assert {c["Name"]: c["State"]["ExitCode"] for c in stopped} == {c["Name"]: 0 for c in stopped}
    assert len(results) > during
    refused = [(s, b, retry) for _, s, b, retry in results if s == 503]
    assert all(b.get("error", {}).get("code") == "no_worker" and retry for _, b, retry in refused), refused[:3]
    failed = [(s, b) for _, s, b, _ in results if s not in (200, 503)]
    assert not failed, f"{len(failed)} of {len(results)} failed: {failed[:3]}"
