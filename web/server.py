"""`funnel-web` (or `python -m funnel.web`): gunicorn serving the front with the project's config.

Each gunicorn process builds its own app after the fork (`application`): a Redis
client, the pipeline with its inbox and outbox, the Flask app, the front.
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
from typing import Any

from gunicorn.app.base import BaseApplication

from funnel.common.observability import logs
from funnel.web.settings import WebSettings

# No command of the web tier blocks in Redis for long (the inbox listener's BRPOP, 1 s): a Redis
# that stops answering without closing its connections (paused, its host gone) costs a request
# this long at most, then 503, and stalls a process's event loop no longer.
HUNG_REDIS_S = 3.0


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
        self.cfg.set("worker_class", "funnel.web.transport.protocol.Worker")
        self.cfg.set("timeout", int(s.request_timeout_s) + 30)
        self.cfg.set("graceful_timeout", int(s.request_timeout_s) + 5)
        self.cfg.set("keepalive", 5)  # past nginx's upstream keepalive_timeout (web/nginx/funnel.conf.template)
        self.cfg.set("loglevel", s.log_level)
        self.cfg.set("proc_name", "funnel-web")
        self.cfg.set("child_exit", child_exit)
        # gunicorn 27's control socket has one default path: several web tiers would share it.
        self.cfg.set("control_socket_disable", True)
        if s.log_format == "json":  # gunicorn's own lines too: one JSON object per line from the whole tier
            self.cfg.set("logconfig_dict", logs.gunicorn_config(s.log_level, s.log_format))

    def load(self):
        app = application(self.settings)  # in each gunicorn process, after the fork
        # What is loaded by now (Flask, the tokenizers, numpy) lives as long as the process: frozen,
        # the collector's full passes walk only what requests allocate, not those objects too.
        gc.freeze()
        return app


def application(settings: WebSettings) -> Any:
    """The ASGI app one web process serves (tests build it in-process too)."""
    from funnel.common.contracts.keys import Keys
    from funnel.common.link.connection import connect, on_cluster
    from funnel.web.app import catalog_of, create_app
    from funnel.web.pipeline import Pipeline
    from funnel.web.transport.front import Front

    client = connect(settings.redis_url, socket_timeout=HUNG_REDIS_S)
    pipeline = Pipeline(catalog_of(settings), client, Keys(settings.prefix, cluster=on_cluster(client)), settings)
    return Front(create_app(settings, pipeline), pipeline, settings)


def main(argv: list[str] | None = None) -> int:
    settings = WebSettings.load(argv)
    logs.configure(settings.log_level, settings.log_format)
    metrics_dir()
    WebServer(settings).run()
    return 0
