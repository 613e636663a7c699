"""docker-compose.yml (GPU) and docker-compose.cpu.yml: valid, in step, and they really run.

Validity is Compose's own: `docker-compose config` (Debian's docker-compose
package, requirements/apt-deploy.txt) parses, interpolates and checks each
file against its schema without a Docker engine. The smoke test then starts
every service's command and environment, read from the Compose file and the
image's Dockerfile, as local processes against a local redis-server, and
serves real requests through them.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import urllib.parse
from pathlib import Path

import numpy as np
import pytest
import yaml

from funnel.common.link.connection import connect, parse_sentinel_url
from funnel.scripts.redis_local import LocalRedis, ask, free_port, port_open, redis_server_binary
from tests.deploy.support import (
    COMPOSE_FILES,
    ROOT,
    interpolate,
    listing,
    load_compose,
    setting_names,
    target_stage,
    variables,
)
from tests.support import http, wait_for

WORKERS = ("worker-image", "worker-text")
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("FUNNEL_", "COMPOSE_"))}
# Profile "sentinel": Redis behind Sentinel, started only with --profile sentinel.
SENTINEL_SERVICES = {"redis-primary", "redis-replica", "sentinel-1", "sentinel-2", "sentinel-3"}


def tier(service: str) -> str:
    return "worker" if service.startswith("worker") else service


def by_default(services: dict) -> dict:
    """The services `docker compose up` starts: those in no profile."""
    return {name: config for name, config in services.items() if not config.get("profiles")}


# ---------------------------------------------------------------------------
# Compose's own check


def docker_compose() -> str:
    found = shutil.which("docker-compose")
    if not found:
        pytest.skip("docker-compose is not installed (Debian package docker-compose, "
                    "requirements/apt-deploy.txt; scripts/install.sh installs it as root)")
    return found


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_config_validates(name):
    env = {**CLEAN_ENV, "FUNNEL_BATCH_SIZE": "48", "FUNNEL_LINGER_MS": "2",
           "FUNNEL_REDIS_URL": "redis://:pw@redis.internal:6380/1", "DOCKER_HOST": "unix:///nonexistent"}
    done = subprocess.run([docker_compose(), "-f", name, "config"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    resolved = yaml.safe_load(done.stdout)
    assert set(by_default(resolved["services"])) == {"redis", "web", "grpc", "nginx", *WORKERS}
    # What Compose resolved is what the smoke test below resolves for itself.
    ours = load_compose(name, env)["services"]
    for service, config in resolved["services"].items():
        theirs = {k: ("" if v is None else str(v)) for k, v in (config.get("environment") or {}).items()}
        assert theirs == ours[service]["environment"], service
    for worker in WORKERS:
        env_of = resolved["services"][worker]["environment"]
        assert (env_of["FUNNEL_BATCH_SIZE"], env_of["FUNNEL_LINGER_MS"]) == ("48", "2")
        assert env_of["FUNNEL_REDIS_URL"] == "redis://:pw@redis.internal:6380/1"


def test_compose_config_rejects_a_broken_file(tmp_path):
    """The check has teeth: an unknown key under the GPU reservation is an error."""
    broken = (ROOT / "docker-compose.yml").read_text().replace("capabilities: [gpu]",
                                                               "capability: [gpu]")
    (tmp_path / "docker-compose.yml").write_text(broken)
    done = subprocess.run([docker_compose(), "-f", str(tmp_path / "docker-compose.yml"), "config", "-q"],
                          env=CLEAN_ENV, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "capability" in done.stderr


# ---------------------------------------------------------------------------
# The sentinel profile


def documented_sentinel_url(name: str) -> str:
    """The FUNNEL_REDIS_URL the file's header gives for the sentinel profile."""
    (url,) = set(re.findall(r"redis\+sentinel://\S+", (ROOT / name).read_text()))
    return url


def sentinel_config(service: dict) -> list[str]:
    """The lines a sentinel service writes to its config file (printf '%s\\n' LINE... > FILE)."""
    assert service["command"][:2] == ["sh", "-c"]
    words = shlex.split(service["command"][2])
    assert words[:2] == ["printf", "%s\\n"], words
    return words[2:words.index(">")]


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_sentinel_profile_validates(name):
    url = documented_sentinel_url(name)
    env = {**CLEAN_ENV, "FUNNEL_REDIS_URL": url, "REDIS_IMAGE": "mirror/redis:7",
           "DOCKER_HOST": "unix:///nonexistent"}
    done = subprocess.run([docker_compose(), "-f", name, "--profile", "sentinel", "config"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(done.stdout)["services"]
    assert {n for n, config in services.items() if config.get("profiles") == ["sentinel"]} == SENTINEL_SERVICES
    assert all(services[n]["profiles"] == ["sentinel"] for n in SENTINEL_SERVICES)
    assert {services[n]["image"] for n in SENTINEL_SERVICES | {"redis"}} == {"mirror/redis:7"}
    for service in ("web", *WORKERS):
        assert services[service]["environment"]["FUNNEL_REDIS_URL"] == url


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_many_profile_is_one_worker_for_every_model(name):
    env = {**CLEAN_ENV, "FUNNEL_MAX_RESIDENT": "2", "DOCKER_HOST": "unix:///nonexistent"}
    done = subprocess.run([docker_compose(), "-f", name, "--profile", "many", "config"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(done.stdout)["services"]
    many = services["worker-many"]
    assert many["profiles"] == ["many"] and many["image"] == services["worker-text"]["image"]
    assert many["environment"]["FUNNEL_MODELS"] == "*" and many["environment"]["FUNNEL_MAX_RESIDENT"] == "2"
    assert "FUNNEL_MODEL" not in many["environment"]


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_the_documented_url_names_the_profiles_sentinels(name):
    services = load_compose(name, CLEAN_ENV)["services"]
    url = parse_sentinel_url(documented_sentinel_url(name))
    sentinels = sorted(n for n in SENTINEL_SERVICES if n.startswith("sentinel-"))
    assert url.sentinels == [(n, 26379) for n in sentinels]
    for n in sentinels:
        lines = sentinel_config(services[n])
        assert {"port 26379", "protected-mode no"} <= set(lines)
        monitor = next(line.split() for line in lines if line.startswith("sentinel monitor "))
        assert monitor[2:5] == [url.service, "redis-primary", "6379"]
        assert int(monitor[5]) == len(sentinels) // 2 + 1  # a majority agrees the primary is down
    replica = services["redis-replica"]["command"]
    assert replica[replica.index("--replicaof") + 1:][:2] == ["redis-primary", "6379"]
    # Without persistence a data node must not come back on its own (Redis' advice): empty, it
    # would be taken for the primary and empty its replica.
    assert services["redis-primary"]["restart"] == services["redis-replica"]["restart"] == "no"


def test_sentinel_profile_runs_as_local_processes(tmp_path):
    """The profile's commands and Sentinel config as local processes (service names become
    127.0.0.1, ports free ones): the Sentinels watch the primary and its replica, and the URL
    in the file's header reaches the primary."""
    services = load_compose("docker-compose.cpu.yml", CLEAN_ENV)["services"]
    port = {n: free_port() for n in SENTINEL_SERVICES}
    primary = f"127.0.0.1 {port['redis-primary']}"

    def local(name: str, text: str) -> str:
        return text.replace("redis-primary 6379", primary).replace("port 26379", f"port {port[name]}")

    processes = Processes(tmp_path)
    try:
        for name in ("redis-primary", "redis-replica"):
            command = list(services[name]["command"])
            assert command[0] == "redis-server" and services[name]["image"] == services["redis"]["image"]
            if "--replicaof" in command:
                at = command.index("--replicaof") + 1
                command[at:at + 2] = primary.split()
            processes.start(name, [redis_server_binary(), *command[1:], "--port", str(port[name]),
                                   "--bind", "127.0.0.1", "--dir", str(tmp_path)], CLEAN_ENV)
            wait_for(lambda name=name: port_open(port[name]), 10, 0.05, f"{name} listening",
                     check=processes.check_alive)
        sentinels = sorted(n for n in SENTINEL_SERVICES if n.startswith("sentinel-"))
        for name in sentinels:
            lines = [local(name, line) for line in sentinel_config(services[name]) if not line.startswith("dir ")]
            config = tmp_path / f"{name}.conf"
            config.write_text("\n".join([*lines, f"dir {tmp_path}", "bind 127.0.0.1"]) + "\n")
            processes.start(name, [redis_server_binary(), str(config), "--sentinel"], CLEAN_ENV)

        def watching(name: str) -> bool:
            state = ask(port[name], lambda c: c.sentinel_master("funnel"), {})
            return state.get("num-slaves") == 1 and state.get("num-other-sentinels") == len(sentinels) - 1

        for name in sentinels:
            wait_for(lambda name=name: watching(name), 30, 0.1, f"{name} to see the replica and its peers",
                     check=processes.check_alive)
        url = documented_sentinel_url("docker-compose.cpu.yml")
        for name in sentinels:
            url = url.replace(f"{name}:26379", f"127.0.0.1:{port[name]}")
        client = connect(url, socket_timeout=5)
        assert client.lpush("funnel:queue:{text-embedding}:1", b"x") == 1
        assert client.connection_pool.master_address == ("127.0.0.1", port["redis-primary"])
        assert client.wait(1, 2000) == 1  # replicated
    finally:
        processes.stop()


# ---------------------------------------------------------------------------
# What the files say


def test_workers_reserve_gpus_by_default_and_not_on_cpu():
    gpu = load_compose("docker-compose.yml", CLEAN_ENV)["services"]
    cpu = load_compose("docker-compose.cpu.yml", CLEAN_ENV)["services"]
    for worker in WORKERS:
        assert gpu[worker]["build"]["target"] == "cuda"
        devices = gpu[worker]["deploy"]["resources"]["reservations"]["devices"]
        assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
        assert gpu[worker]["environment"]["FUNNEL_DEVICE"] == "auto"
        assert cpu[worker]["build"]["target"] == "cpu"
        assert cpu[worker]["deploy"] == {"replicas": 2}  # sharing the cores, as funnel up lays them out
        assert (cpu[worker]["environment"]["FUNNEL_INTRA_OP_THREADS"], cpu[worker]["environment"]["FUNNEL_SPINNING"]) \
            == ("1/2", "0")
        assert cpu[worker]["environment"]["FUNNEL_DEVICE"] == "cpu"
    for services in (gpu, cpu):
        for worker in WORKERS:  # --scale needs both
            assert "container_name" not in services[worker] and "ports" not in services[worker]
    assert set(gpu) == set(cpu)


def test_cpu_file_is_the_gpu_file_on_the_cpu():
    """Two whole files (Compose cannot drop a reservation in an override): keep them in step. On the
    CPU each worker's two replicas share the cores."""
    gpu = load_compose("docker-compose.yml", CLEAN_ENV)
    cpu = load_compose("docker-compose.cpu.yml", CLEAN_ENV)
    for worker in (*WORKERS, "worker-many"):
        service = gpu["services"][worker]
        service["build"]["target"] = "cpu"
        assert service["image"] == "funnel-worker:cuda"
        service["image"] = "funnel-worker:cpu"
        service["deploy"] = {"replicas": 2}
        service["environment"]["FUNNEL_DEVICE"] = "cpu"
        service["environment"].update(FUNNEL_INTRA_OP_THREADS="1/2", FUNNEL_SPINNING="0",
                                      FUNNEL_CORE_LOCK="/run/funnel/cores.lock")
        service["volumes"] = ["cores:/run/funnel"]  # the core lock, shared by every worker on the host
        del service["environment"]["FUNNEL_DEVICES"]
    gpu["volumes"] = {"cores": None}
    assert gpu == cpu


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_only_the_front_door_and_grpc_are_published(name):
    """Clients reach the web tier through nginx, which renders funnel up's own template; the gRPC
    service, the web image's funnel-grpc with the web's settings, on its own port."""
    services = load_compose(name, CLEAN_ENV)["services"]
    assert "ports" not in services["web"]
    grpc = services["grpc"]
    assert grpc["command"] == ["funnel-grpc"] and grpc["image"] == services["web"]["image"]
    assert grpc["build"] == services["web"]["build"]
    assert grpc["ports"] == ["127.0.0.1:8001:8001"] and grpc["environment"]["FUNNEL_GRPC_PORT"] == "8001"
    assert {k: v for k, v in grpc["environment"].items() if k != "FUNNEL_GRPC_PORT"} == services["web"]["environment"]
    assert "8001" in " ".join(grpc["healthcheck"]["test"])
    assert services["nginx"]["ports"] == ["127.0.0.1:8000:8000"]
    assert services["nginx"]["depends_on"]["web"]["condition"] == "service_healthy"
    mounted = {v.split(":")[0]: v.split(":")[1] for v in services["nginx"]["volumes"]}
    assert mounted["./web/nginx/funnel.conf.template"] == "/etc/funnel/funnel.conf.template"
    env = services["nginx"]["environment"]
    assert env["FRONT_UPSTREAM"] == "web:8000" and env["FRONT_LISTEN"] == "8000"
    template = (ROOT / "web" / "nginx" / "funnel.conf.template").read_text()
    placeholders = set(re.findall(r"\$\{(FRONT_[A-Z_]+)\}", template))
    assert placeholders == set(env), "every placeholder filled, nothing else"
    command = " ".join(services["nginx"]["command"])
    assert all(f"${{{name}}}" in command for name in placeholders)


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_settings_come_from_the_environment(name):
    text = (ROOT / name).read_text()
    for var in ("FUNNEL_REDIS_URL", "FUNNEL_BATCH_SIZE", "FUNNEL_LINGER_MS"):
        assert var in variables(text)
    if name == "docker-compose.yml":
        assert "FUNNEL_DEVICE" in variables(text)
    env = {**CLEAN_ENV, "FUNNEL_REDIS_URL": "rediss://:x@cache:6379/2", "FUNNEL_DEVICE": "cuda:1",
           "FUNNEL_BATCH_SIZE": "7", "FUNNEL_LINGER_MS": "0.5"}
    services = load_compose(name, env)["services"]
    for worker in WORKERS:
        got = services[worker]["environment"]
        assert got["FUNNEL_REDIS_URL"] == "rediss://:x@cache:6379/2"
        assert (got["FUNNEL_BATCH_SIZE"], got["FUNNEL_LINGER_MS"]) == ("7", "0.5")
        assert got["FUNNEL_DEVICE"] == ("cuda:1" if name == "docker-compose.yml" else "cpu")
    assert services["web"]["environment"]["FUNNEL_REDIS_URL"] == "rediss://:x@cache:6379/2"


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_every_funnel_variable_is_a_setting(name):
    names = setting_names()
    text = (ROOT / name).read_text()
    interpolated = {v for v in variables(text) if v.startswith("FUNNEL_")}
    everyone = names["web"] | names["grpc"] | names["worker"]
    assert interpolated <= everyone, interpolated - everyone
    for service, config in load_compose(name, CLEAN_ENV)["services"].items():
        if service == "nginx":  # not a Funnel tier: its FRONT_* fill the template (test above)
            continue
        funnel = {k for k in config["environment"] if k.startswith("FUNNEL_")}
        if service != "redis" and service not in SENTINEL_SERVICES:
            assert funnel <= names[tier(service)], (service, funnel - names[tier(service)])
        for var in variables(yaml.safe_dump(config)):  # x- anchors already merged in
            if var.startswith("FUNNEL_"):
                assert var in names[tier(service)], (service, var)


def test_dockerfile_env_is_settings():
    names = setting_names()
    for dockerfile, target, kind in (("deploy/Dockerfile.web", None, "web"),
                                     ("deploy/Dockerfile.worker", "cpu", "worker"),
                                     ("deploy/Dockerfile.worker", "cuda", "worker")):
        env = target_stage(dockerfile, target).env
        funnel = {k for k in env if k.startswith("FUNNEL_")}
        assert funnel <= names[kind], (dockerfile, target, funnel - names[kind])


# ---------------------------------------------------------------------------
# The smoke test: the Compose services as local processes


def service_process(name: str, service: dict, redis_port: int, model_store: Path,
                    extra: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The argv and environment the service's container would run, made local.

    The command is the service's own, else the image's CMD (the Dockerfile's
    build target); the environment is the image's FUNNEL_* ENV, then the
    service's. Made local: `python` is this interpreter, the host name of
    FUNNEL_REDIS_URL is 127.0.0.1 and its port the local redis-server's, the
    model store is the prepared one (as a volume at /app/model_store would be).
    """
    build = service["build"]
    stage = target_stage(build["dockerfile"], build.get("target"))
    command = service.get("command") or stage.cmd
    if isinstance(command, str):
        import shlex

        command = shlex.split(command)
    assert command, f"{name}: no command in the service nor a CMD in {build['dockerfile']}"
    # python is this interpreter; a console script (funnel-web) is the one installed beside it.
    script = Path(sys.executable).parent / command[0]
    program = sys.executable if command[0] in ("python", "python3") else (
        str(script) if script.exists() else command[0])
    argv = [program, *command[1:]]
    env = {**CLEAN_ENV, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
           **{k: v for k, v in stage.env.items() if k.startswith("FUNNEL_")},
           **{k: v for k, v in service["environment"].items() if v is not None}}
    url = urllib.parse.urlsplit(env["FUNNEL_REDIS_URL"])
    assert url.hostname == "redis", f"{name}: FUNNEL_REDIS_URL should name the redis service: {url}"
    auth = url.netloc.rpartition("@")[0]
    env["FUNNEL_REDIS_URL"] = urllib.parse.urlunsplit(
        url._replace(netloc=f"{auth + '@' if auth else ''}127.0.0.1:{redis_port}"))
    env["FUNNEL_MODEL_STORE"] = str(model_store)
    env.update(extra)
    return argv, env


class Processes:
    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.running: dict[str, subprocess.Popen] = {}

    def start(self, label: str, argv: list[str], env: dict[str, str]) -> None:
        log = open(self.log_dir / f"{label}.log", "wb")
        self.running[label] = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log,
                                               stderr=subprocess.STDOUT)

    def check_alive(self) -> None:
        for label, proc in self.running.items():
            if proc.poll() is not None:
                tail = (self.log_dir / f"{label}.log").read_text(errors="replace")[-3000:]
                raise AssertionError(f"{label} ({' '.join(proc.args)}) exited with "
                                     f"{proc.returncode}:\n{tail}")

    def stop(self) -> dict[str, int]:
        for proc in self.running.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = {}
        for label, proc in self.running.items():
            try:
                codes[label] = proc.wait(timeout=45)
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[label] = proc.wait()
        return codes




def run_healthcheck(script: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=30)


def start_compose(services: dict, redis: LocalRedis, model_store: Path, processes: Processes,
                  replicas: dict[str, int], web_port: int, grpc_port: int = 0) -> dict[str, dict[str, str]]:
    envs = {}
    for name, service in by_default(services).items():
        if name == "redis":  # the local redis-server stands in for the image
            assert service["image"].startswith("redis:") and service["command"][0] == "redis-server"
            continue
        if name == "nginx":  # the front door: funnel up's nginx is tested apart (tests/faults/test_slow_clients.py)
            continue
        extra = {"FUNNEL_HOST": "127.0.0.1", "FUNNEL_PORT": str(web_port)} if name == "web" else \
            {"FUNNEL_HOST": "127.0.0.1", "FUNNEL_GRPC_PORT": str(grpc_port or free_port())} if name == "grpc" else {}
        argv, env = service_process(name, service, redis.port, model_store, extra)
        envs[name] = env
        for i in range(replicas.get(name, 1)):
            processes.start(f"{name}-{i + 1}", argv, env)
    return envs


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_services_serve_as_local_processes(name, model_store, cat_jpeg, tmp_path):
    # FUNNEL_DEVICES=cpu: docker-compose.yml's FUNNEL_DEVICE=auto has only the CPU to choose here.
    # One backend thread per worker: four processes share this machine's cores.
    compose_env = {**CLEAN_ENV, "FUNNEL_DEVICES": "cpu", "FUNNEL_INTRA_OP_THREADS": "1",
                   "FUNNEL_PROCESSES": "1", "FUNNEL_THREADS": "16"}
    services = load_compose(name, compose_env)["services"]
    web_port, grpc_port = free_port(), free_port()
    url = f"http://127.0.0.1:{web_port}"
    processes = Processes(tmp_path)
    script = ROOT / "deploy" / "worker_healthcheck.py"  # the worker image's /app/healthcheck.py
    redis = LocalRedis().start()
    try:
        envs = start_compose(services, redis, model_store, processes, {"worker-text": 2}, web_port, grpc_port)
        ready = wait_for(lambda: (lambda m: m if len(m.get("text-embedding", [])) == 2
                                  and len(m.get("image-classifier", [])) == 1 else None)(listing(url)),
                         180, 0.1, "2 live text workers and 1 image worker in /v1/models",
                         check=processes.check_alive)
        workers = ready["text-embedding"] + ready["image-classifier"]
        assert {w["device"] for w in workers} == {"cpu"}  # resolved, not "auto"

        status, body, _ = http("GET", f"{url}/healthz")  # the k8s web probes' path
        assert status == 200, body

        status, body, _ = http("POST", f"{url}/v1/models/image-classifier/predict", body=cat_jpeg,
                               headers={"Content-Type": "image/jpeg"})
        assert status == 200, body
        assert "cat" in body["predictions"][0]["label"].lower(), body["predictions"]

        text_workers = {w["id"] for w in ready["text-embedding"]}
        served: set[str] = set()
        for i in range(40):  # both replicas take from the one queue
            status, body, _ = http("POST", f"{url}/v1/models/text-embedding/predict",
                                   json_body={"text": f"A man is eating food, take {i}."})
            assert status == 200, body
            assert len(body["embedding"]) == 384
            served.add(body["meta"]["worker"])
            if served == text_workers:
                break
        assert served == text_workers

        # The gRPC service, through tritonclient's gRPC client as a user calls it.
        import tritonclient.grpc as grpcclient
        wait_for(lambda: port_open(grpc_port), 60, 0.1, "the gRPC service listening", check=processes.check_alive)
        with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as triton:
            sentence = grpcclient.InferInput("TEXT", [1], "BYTES")
            sentence.set_data_from_numpy(np.array([b"A man is eating food."], dtype=object))
            assert triton.infer("text-embedding", [sentence]).as_numpy("embedding").shape == (1, 384)

        # The worker image's HEALTHCHECK (the k8s exec probe): healthy with a worker on this host.
        checked = run_healthcheck(script, envs["worker-text"])
        assert checked.returncode == 0, checked.stderr
    finally:
        codes = processes.stop()
    try:
        assert all(code == 0 for label, code in codes.items() if label.startswith(("worker", "grpc"))), codes
        # Stopped workers deregister: the probe now fails.
        checked = run_healthcheck(script, envs["worker-text"])
        assert checked.returncode != 0 and "no heartbeat" in checked.stderr + checked.stdout
    finally:
        redis.stop()


def test_a_wrong_command_fails_the_smoke_test(model_store, tmp_path):
    """The smoke test runs what the file says: a broken command is caught, not papered over."""
    services = load_compose("docker-compose.cpu.yml", CLEAN_ENV)["services"]
    broken = {"redis": services["redis"],
              "worker-text": {**services["worker-text"],
                              "command": ["funnel-worker", "--no-such-flag"]}}
    processes = Processes(tmp_path)
    redis = LocalRedis().start()
    try:
        start_compose(broken, redis, model_store, processes, {}, free_port())
        with pytest.raises(AssertionError, match="exited with 2"):
            wait_for(lambda: False, 60, 0.1, "never", check=processes.check_alive)
    finally:
        processes.stop()
        redis.stop()


def test_interpolation_follows_compose():
    env = {"SET": "x", "EMPTY": ""}
    assert interpolate("${SET:-d} ${EMPTY:-d} ${EMPTY-d} ${UNSET-d} ${UNSET} $SET $$SET", env) == \
        "x d  d  x $SET"
    with pytest.raises(ValueError):
        interpolate("${UNSET:?needed}", env)
