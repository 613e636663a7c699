"""`python -m web`: gunicorn serving the Flask app with the project's config."""

from __future__ import annotations

import gc
import logging
import os
import shutil
import tempfile
from typing import Any

from gunicorn.app.base import BaseApplication

from funnel.web import response
from funnel.web.settings import WebSettings


def metrics_dir() -> str:
    """A fresh directory where every gunicorn process writes its Prometheus counters.

    Must be in the environment before prometheus_client is first imported.
    """
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or tempfile.mkdtemp(prefix="funnel-metrics-")
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    return path


def child_exit(server, worker) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


class WebServer(BaseApplication):
    def __init__(self, settings: WebSettings):
        self.settings = settings
        super().__init__()

    def load_config(self) -> None:
        s = self.settings
        self.cfg.set("bind", f"{s.host}:{s.port}")
        self.cfg.set("workers", s.process_count())
        # Each waiting request holds a thread (gthread), a greenlet (gevent) or a future (asgi).
        self.cfg.set("worker_class", "funnel.web.asgi.Worker" if s.worker_class == "asgi" else s.worker_class)
        self.cfg.set("threads", s.threads)
        self.cfg.set("worker_connections", max(1000, s.threads * 4))
        self.cfg.set("timeout", int(s.request_timeout_s) + 30)
        self.cfg.set("graceful_timeout", int(s.request_timeout_s) + 5)
        self.cfg.set("keepalive", 5)
        self.cfg.set("loglevel", s.log_level)
        self.cfg.set("proc_name", "funnel-web")
        self.cfg.set("child_exit", child_exit)
        # gunicorn 27's control socket has one default path: several web tiers would share it.
        self.cfg.set("control_socket_disable", True)

    def load(self):
        # Runs in each gunicorn worker after the fork: its own Redis pool.
        from funnel.web.app import create_app

        app: Any = create_app(self.settings)
        if self.settings.worker_class == "asgi":
            from funnel.web.asgi import Front

            app = Front(app, self.settings)
        # What is loaded by now (Flask, the tokenizers, numpy) lives as long as the process: frozen,
        # the collector's full passes walk only what requests allocate, not those objects too.
        gc.freeze()
        return app


def main(argv: list[str] | None = None) -> int:
    settings = WebSettings.load(argv)
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    metrics_dir()
    if settings.one_send:
        response.install()
    WebServer(settings).run()
    return 0
