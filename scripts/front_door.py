"""nginx in front of the web tier for `funnel up`: slow and idle clients cost nginx, not gunicorn.

gunicorn's gthread worker hands a connection to a thread as soon as its first
bytes arrive, and the thread then waits for the rest: a few hundred clients
that send half a header hold every thread. nginx (Debian's package,
requirements/apt.txt) reads each request whole, with header and body
timeouts, before passing it on; the web tier then binds a private port on
127.0.0.1. The server block is web/nginx/funnel.conf.template, the same file
the Compose file's nginx service renders.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from string import Template

import funnel.web
from funnel.scripts import processes

TEMPLATE = Path(funnel.web.__file__).parent / "nginx" / "funnel.conf.template"
WORKER_CONNECTIONS = 4096  # per nginx worker: idle clients past this wait in the listen backlog
LISTEN_BACKLOG = 4096  # the template's `listen ... backlog=`

MAIN_CONF = """\
# Written by `funnel up` (scripts/front_door.py); the server block is funnel.conf.
$user
worker_processes 1;
worker_rlimit_nofile $files;
daemon off;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections $connections; }
http {
    access_log off;
    client_body_temp_path $dir/body;
    proxy_temp_path $dir/proxy;
    fastcgi_temp_path $dir/fastcgi;
    uwsgi_temp_path $dir/uwsgi;
    scgi_temp_path $dir/scgi;
    include $dir/funnel.conf;
}
"""


def nginx_binary() -> str | None:
    """nginx from PATH, or where Debian puts it (/usr/sbin is not on every user's PATH)."""
    return shutil.which("nginx", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin"]))


def render(listen: str, upstream: str | list[str], max_body_mb: float, timeout_s: float) -> str:
    """The server block, as the Compose file's nginx renders it from the same template. Several
    upstreams (a list of HOST:PORT) become one `server` line each in the template's upstream block:
    nginx spreads requests over them and passes one that could not connect to the next."""
    servers = [upstream] if isinstance(upstream, str) else list(upstream)
    if not servers:
        raise ValueError("no upstream for the front door")
    return Template(TEMPLATE.read_text()).safe_substitute(
        FRONT_LISTEN=listen, FRONT_UPSTREAM=";\n    server ".join(servers), FRONT_BODY_MB=str(int(max_body_mb) + 1),
        FRONT_TIMEOUT_S=str(int(timeout_s) + 10))


class FrontDoor:
    """An nginx process listening on `port`, proxying to the web tier on `upstream_port`, or to
    several web tiers (a list of ports: each a `server` of the upstream block).

    The listening socket is this object's, handed to each nginx it starts (nginx's own way of
    inheriting sockets, its NGINX environment variable): restart() starts a new nginx on it before
    the old one quits gracefully, so a connection waiting in its queue is accepted by one or the
    other, never refused or reset, as it would be with a socket of each nginx's own.
    """

    def __init__(self, port: int, upstream_port: int | list[int], *, max_body_mb: float = 20.0,
                 timeout_s: float = 30.0, host: str = "127.0.0.1"):
        binary = nginx_binary()
        if binary is None:
            raise FileNotFoundError("nginx is not installed (Debian: apt-get install nginx)")
        self.binary, self.port, self.host = binary, port, host
        self.upstream_ports = [upstream_port] if isinstance(upstream_port, int) else list(upstream_port)
        self.max_body_mb, self.timeout_s = max_body_mb, timeout_s
        self.dir = self._configure()
        self.process: subprocess.Popen | None = None
        self.listener: socket.socket | None = None

    def _configure(self) -> Path:
        """A fresh prefix folder with nginx.conf and funnel.conf (each nginx process its own: its
        pid file, logs and temporary files)."""
        folder = Path(tempfile.mkdtemp(prefix="funnel-nginx-"))
        (folder / "funnel.conf").write_text(
            render(f"{self.host}:{self.port}", [f"127.0.0.1:{p}" for p in self.upstream_ports], self.max_body_mb,
                   self.timeout_s))
        root = os.geteuid() == 0
        if root:  # nginx's workers drop to nobody, and must still write their temporary files
            folder.chmod(0o777)
        files = 2 * WORKER_CONNECTIONS + 64
        (folder / "nginx.conf").write_text(Template(MAIN_CONF).substitute(
            user="user nobody nogroup;" if root else "", dir=folder, files=files,
            connections=WORKER_CONNECTIONS))
        return folder

    def _listen(self) -> socket.socket:
        """The socket every nginx of this front door accepts on, with the template's backlog."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as nginx sets its own
        try:
            listener.bind((self.host, self.port))
        except OSError as exc:
            listener.close()
            raise RuntimeError(f"the front door cannot listen on {self.host}:{self.port}: {exc}") from exc
        listener.listen(LISTEN_BACKLOG)
        listener.set_inheritable(True)
        return listener

    def start(self, timeout_s: float = 10.0) -> FrontDoor:
        check = subprocess.run([self.binary, "-t", "-q", "-p", str(self.dir), "-c", str(self.dir / "nginx.conf")],
                               capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"nginx refused its configuration: {check.stderr.strip()}")
        if self.listener is None:
            self.listener = self._listen()
        fd = self.listener.fileno()
        self.process = subprocess.Popen([self.binary, "-p", str(self.dir), "-c", str(self.dir / "nginx.conf")],
                                        env={**os.environ, "NGINX": f"{fd};"}, pass_fds=(fd,),
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while not (self.dir / "nginx.pid").exists():  # written once its configuration took the socket
            if self.process.poll() is not None:
                raise RuntimeError(f"nginx exited with {self.process.returncode}: {self.error_log()}")
            if time.monotonic() > deadline:
                raise TimeoutError("nginx did not start")
            time.sleep(0.02)
        return self

    def restart(self, timeout_s: float = 60.0) -> None:
        """A new nginx process in place of this one, on the same socket; the old one then quits
        gracefully (SIGQUIT: it stops accepting, finishes the requests it holds, then exits, within
        timeout_s)."""
        old, old_dir = self.process, self.dir
        self.dir = self._configure()
        self.start()
        if old is not None and old.poll() is None:
            old.send_signal(signal.SIGQUIT)
            try:
                old.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                old.kill()
                old.wait()
        shutil.rmtree(old_dir, ignore_errors=True)

    def pids(self) -> list[int]:
        """The master's pid and its workers' (from /proc): what a memory or CPU count looks at."""
        if self.process is None or self.process.poll() is not None:
            return []
        try:
            children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()
        except OSError:
            children = []
        return [self.process.pid, *map(int, children)]

    def error_log(self) -> str:
        path = self.dir / "error.log"
        return path.read_text()[-2000:] if path.exists() else ""

    def poll(self) -> int | None:
        return self.process.poll() if self.process else None

    def stop(self) -> None:
        processes.stop(self.process)  # SIGTERM: nginx's fast shutdown
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        shutil.rmtree(self.dir, ignore_errors=True)
