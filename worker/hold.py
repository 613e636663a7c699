"""A seam for the fault suite: hold the worker inside one stage of its loop, so a test can kill it there.

FUNNEL_TEST_HOLD=<stage>:<n>:<file> (stage: take, collate, run, reply or
stored) makes the worker, when its n-th batch reaches the end of that stage
(taken but not decoded; collated, not handed to the run; run, not handed to
the replier; replies built, not written; on a Redis Cluster, bulk results
stored but the reply script that forgets their messages not yet run,
worker/reply.py), create <file> and wait there until it is stopped or HOLD_S
pass. The test waits for the file, then sends its
signal: the signal lands inside that stage, not near it. Unset, every stage
goes straight on.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

log = logging.getLogger(__name__)

STAGES = ("take", "collate", "run", "reply", "stored")
HOLD_S = 60.0  # bounded, so a test that never signals still ends


class Hold:
    def __init__(self, stop: threading.Event, setting: str = ""):
        """setting: WorkerSettings.test_hold (FUNNEL_TEST_HOLD); "" holds nothing."""
        self.stop = stop
        self.stage, self.batch, self.marker = "", 0, Path()
        if setting:
            stage, batch, path = setting.split(":", 2)
            if stage not in STAGES:
                raise ValueError(f"FUNNEL_TEST_HOLD: unknown stage {stage!r} (one of {', '.join(STAGES)})")
            self.stage, self.batch, self.marker = stage, int(batch), Path(path)
        self.seen = 0  # batches that have reached the end of that stage

    def __call__(self, stage: str) -> None:
        """At the end of `stage`: hold there if this is the batch to hold."""
        if stage != self.stage:
            return
        self.seen += 1
        if self.seen != self.batch:
            return
        log.warning("holding batch %d at the end of its %s stage (FUNNEL_TEST_HOLD)", self.batch, stage)
        self.marker.touch()
        self.stop.wait(HOLD_S)
