"""The audio model's own code, as its package would ship it, with or without Funnel.

The graph takes mono waveforms at RATE Hz, float32 [n, samples] (samples a
multiple of FRAME), and gives `levels` [n, frames]: each frame's mean power in
dB. `levels` runs one WAV through a session; Funnel's task (toyaudio.tasks)
splits the same steps around the model, and pads a batch to its longest clip.
"""

from __future__ import annotations

import io
import math
import wave
from typing import Any

import numpy as np

RATE = 16_000
FRAME = 160  # 10 ms at RATE
_SCALES = {1: 128.0, 2: 32768.0, 4: 2147483648.0}  # PCM sample width -> full scale
_TYPES = {1: np.uint8, 2: np.dtype("<i2"), 4: np.dtype("<i4")}


def read_wav(data: bytes) -> tuple[np.ndarray, int]:
    """A PCM WAV's samples, mono float32 in [-1, 1], and its sample rate; ValueError for anything else."""
    try:
        with wave.open(io.BytesIO(data)) as clip:
            channels, width, rate = clip.getnchannels(), clip.getsampwidth(), clip.getframerate()
            raw = clip.readframes(clip.getnframes())
    except (wave.Error, EOFError) as exc:
        raise ValueError(f"not a PCM WAV file: {exc}") from None
    if width not in _TYPES or not 1 <= channels <= 8 or not 1_000 <= rate <= 192_000:
        raise ValueError(f"a WAV of {width}-byte samples, {channels} channels at {rate} Hz is not read here")
    samples = np.frombuffer(raw[:len(raw) - len(raw) % (width * channels)], dtype=_TYPES[width]).astype(np.float32)
    if width == 1:
        samples -= 128.0  # 8-bit WAV is unsigned
    samples = samples.reshape(-1, channels).mean(axis=1) / _SCALES[width]
    if not len(samples):
        raise ValueError("the WAV holds no samples")
    return samples.astype(np.float32), rate


def resample(samples: np.ndarray, rate: int) -> np.ndarray:
    """The samples at RATE Hz, by linear interpolation."""
    if rate == RATE:
        return samples
    count = max(1, round(len(samples) * RATE / rate))
    at = np.arange(count, dtype=np.float64) * (rate / RATE)
    return np.interp(at, np.arange(len(samples)), samples).astype(np.float32)


def frames(samples: int) -> int:
    return math.ceil(samples / FRAME)


def summary(levels: np.ndarray, samples: int, rate: int) -> dict[str, Any]:
    """A clip's answer from its frames' levels (exactly its own frames)."""
    levels = levels[:frames(samples)]
    return {"levels_db": levels.tolist(), "peak_db": float(levels.max()), "seconds": round(samples / RATE, 6),
            "sample_rate": rate}


def levels(session: Any, data: bytes) -> dict[str, Any]:
    """One WAV's answer, with an onnxruntime session of the graph: no Funnel involved."""
    samples, rate = read_wav(data)
    waveform = resample(samples, rate)
    padded = np.zeros(frames(len(waveform)) * FRAME, np.float32)
    padded[:len(waveform)] = waveform
    (out,) = session.run(["levels"], {"waveform": padded[None]})
    return summary(out[0], len(waveform), rate)
