"""Funnel's task for the audio model: WAV uploads read and resampled in the web tier, levels in the worker.

model.json (written by `funnel add`): a graph taking "waveform" float32 [n,
samples] at 16 kHz and giving "levels" [n, frames]. A batch is padded to its
longest clip, so a row holds frames past a shorter clip's end: the clip's true
length and its original sample rate are the item's context, which postprocess
uses to answer exactly the clip's own frames.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from funnel import BadInput, Context, Inputs, Task, Upload, WithContext
from toyaudio.audio import FRAME, RATE, frames, read_wav, resample, summary


class ClipLevels(Task):
    input_kind = "file"
    content_types = ("audio/wav", "audio/x-wav", "audio/wave", "audio/vnd.wave")
    default_limits = {"max_seconds": 30}
    silence_db = -90.0  # a clip with no frame above this has nothing to measure

    def preprocess(self, item: Upload) -> WithContext:
        try:
            samples, rate = read_wav(item.data)
        except ValueError as exc:
            raise BadInput(f"cannot read the clip: {exc}", code="bad_audio") from None
        if len(samples) > self.limits["max_seconds"] * rate:
            raise BadInput(f"the clip lasts {len(samples) / rate:.1f} s; at most {self.limits['max_seconds']} s",
                           code="clip_too_long")
        waveform = resample(samples, rate)
        return WithContext({"waveform": waveform}, {"samples": len(waveform), "sample_rate": rate})

    def check(self, inputs: Inputs) -> None:
        waveform = inputs.get("waveform")
        if waveform is None or waveform.dtype != np.float32 or waveform.ndim != 1 or not len(waveform) \
                or len(waveform) > self.limits["max_seconds"] * RATE:
            raise BadInput("expected float32 of shape (samples,)", code="bad_input")

    def collate(self, items: list[Inputs]) -> dict[str, np.ndarray]:
        longest = frames(max(len(item["waveform"]) for item in items)) * FRAME
        waveforms = np.zeros((len(items), longest), np.float32)
        for row, item in zip(waveforms, items):
            row[:len(item["waveform"])] = item["waveform"]
        return {"waveform": waveforms}

    def postprocess(self, row: dict[str, np.ndarray], context: Context | None = None) -> dict[str, Any]:
        if context is None:
            raise ValueError("the clip's length is in its context, which this item lacks")
        answer = summary(row["levels"], context["samples"], context["sample_rate"])
        if answer["peak_db"] < self.silence_db:
            raise ValueError(f"the clip is silent: no frame above {self.silence_db} dB")
        return answer
