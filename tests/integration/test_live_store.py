"""The web tier follows the model store while it runs: a version or a model added is served, and one
removed is dropped, within 10 s and without a restart (web/catalog.py)."""

from __future__ import annotations

import shutil

from funnel.scripts.stack import Stack
from tests.support import TEXT, http, wait_for

LIVE_S = 10  # the bound; the catalog looks again every 5 s
COPY = "text-copy"


def status_of(stack: Stack, path: str) -> int:
    return http("POST", stack.url + path, json_body={"text": "still there?"})[0]


def test_versions_and_models_come_and_go_without_a_restart(model_store, tmp_path):
    store = tmp_path / "store"
    (store / TEXT).mkdir(parents=True)
    (store / TEXT / "1").symlink_to(model_store / TEXT, target_is_directory=True)
    # FUNNEL_MODELS empty: every model in the store is served, those added later too.
    with Stack(model_store=store, workers=[f"{TEXT}:1"], web_env={"FUNNEL_MODELS": ""},
               log_dir=tmp_path / "logs") as stack:
        web_pid = stack.web.pid
        assert status_of(stack, f"/v1/models/{TEXT}/versions/2/predict") == 404
        assert status_of(stack, f"/v1/models/{COPY}/predict") == 404

        (store / TEXT / "2").symlink_to(model_store / TEXT, target_is_directory=True)
        (store / COPY).symlink_to(model_store / TEXT, target_is_directory=True)
        stack.start_worker(f"{TEXT}:2")
        stack.start_worker(COPY)
        wait_for(lambda: status_of(stack, f"/v1/models/{TEXT}/versions/2/predict") == 200, timeout_s=LIVE_S + 60,
                 what="version 2 served (its worker loads its model meanwhile)")
        wait_for(lambda: status_of(stack, f"/v1/models/{COPY}/predict") == 200, timeout_s=LIVE_S + 60,
                 what="a new model served")

        def listed() -> bool:  # each web process looks at the store on its own
            models = {m["name"]: m for m in http("GET", stack.url + "/v1/models")[1]["models"]}
            return [v["version"] for v in models[TEXT]["versions"]] == [1, 2] and COPY in models

        for _ in range(4):  # several answers, whichever process gives them
            wait_for(listed, timeout_s=LIVE_S, what="both listed in /v1/models")

        (store / TEXT / "2").unlink()
        shutil.rmtree(store / COPY, ignore_errors=True)
        (store / COPY).unlink(missing_ok=True)
        wait_for(lambda: status_of(stack, f"/v1/models/{TEXT}/versions/2/predict") == 404, timeout_s=LIVE_S,
                 what="version 2 dropped")
        wait_for(lambda: status_of(stack, f"/v1/models/{COPY}/predict") == 404, timeout_s=LIVE_S,
                 what="the model dropped")
        assert status_of(stack, f"/v1/models/{TEXT}/predict") == 200
        assert stack.web.pid == web_pid and stack.web.poll() is None  # the same web tier all along
