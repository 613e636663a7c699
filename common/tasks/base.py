"""The Task interface: what turns a request's items into tensors, and a model's rows into results.

A served model is a model store folder (model.json and its files) plus a Task.
The worker runs it one of two ways: in Python, when the task defines `load` and
`predict` (your code as it is: transformers, scikit-learn, numpy; worker/model_process.py),
or as the graph model.json names (an ONNX or TorchScript export; worker/backend.py).
One Task instance is built per served model, in the web tier and in each worker,
from the model's spec; every hook is declared here once, required or with its default.

The web tier never imports torch or onnxruntime: `preprocess` works with
numpy (and Pillow, tokenizers). The worker imports only what `check`,
`buckets`, `collate`, `load`, `predict` and `postprocess` need.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeAlias

import numpy as np

from funnel.common.errors import FunnelError
from funnel.common.result_cache import CachePolicy
from funnel.common.store import ModelSpec

Inputs = dict[str, np.ndarray]
# What preprocess learned of an item that its result needs (an original size, a scale, a true
# length): msgpack-safe values only (None, bool, int, float, str, lists, maps with str keys),
# bounded in size by the wire (common/contracts/wire.py, MAX_CONTEXT_BYTES).
Context = dict[str, Any]
# How a request carries its items, which decides how the web tier reads the request and how the
# page, the client and the CLI offer the model: an image upload, JSON texts, any JSON values, or
# any file of the content types the task declares.
InputKind = Literal["image", "text", "json", "file"]
INPUT_KINDS: tuple[InputKind, ...] = ("image", "text", "json", "file")


@dataclass(frozen=True, slots=True)
class Upload:
    """A `file` task's item: the uploaded bytes and the content type they came as (one the task declares)."""

    data: bytes
    content_type: str


@dataclass(frozen=True, slots=True)
class WithContext:
    """What `preprocess` returns for an item whose result needs more than the model's rows: its arrays
    (the job's, fed to `collate`) and its context (never fed to the model; handed to `postprocess`)."""

    inputs: Inputs
    context: Context


Prepared: TypeAlias = Inputs | WithContext  # what preprocess returns


def split(prepared: Prepared) -> tuple[Inputs, Context | None]:
    """An item's arrays and its context (None: the task keeps none)."""
    if type(prepared) is WithContext:
        return prepared.inputs, prepared.context
    return prepared, None  # type: ignore[return-value]


class Task(abc.ABC):
    """One kind of model: image classification, text embedding, or your own.

    Subclasses set `input_kind`, may declare `default_limits` (and, for `file`,
    `content_types`), and implement `preprocess` and `postprocess`, and either `load` and
    `predict` (a model run in Python) or a graph in model.json that `collate`'s feeds fit.
    """

    input_kind: ClassVar[InputKind]
    # A `file` task's content types (e.g. "audio/wav", or "image/*" for a family): an upload of any
    # other is refused 415, naming these. Unused by the other kinds.
    content_types: ClassVar[tuple[str, ...]] = ()
    # Per-item limits the web tier enforces, name -> default. model.json's "limits" and the web's
    # FUNNEL_LIMITS override them; GET /v1/models shows each model's.
    default_limits: ClassVar[Mapping[str, int]] = {}
    # The longest a `predict` call may take: past it the model's process is ended and restarted, and
    # the items of that call fail 504 (model.json's "predict_timeout_s" overrides it).
    predict_timeout_s: ClassVar[float] = 60.0

    def __init__(self, spec: ModelSpec, limits: Mapping[str, int] | None = None):
        self.spec = spec
        configured = spec.config.get("limits", {})
        unknown = set(configured) - set(self.default_limits)
        if unknown:
            raise ValueError(f"{spec.name}: model.json limits {sorted(unknown)} are not limits of "
                             f"{type(self).__name__} (it has {sorted(self.default_limits) or 'none'})")
        given = {k: v for k, v in (limits or {}).items() if k in self.default_limits}
        self.limits: dict[str, int] = {**self.default_limits, **configured, **given}
        _ = self.cache  # a model.json whose "cache" is no policy fails its load, not its requests

    @functools.cached_property
    def cache(self) -> CachePolicy:
        """Whether and how this version's results are cached (model.json's "cache", common/result_cache.py)."""
        return CachePolicy.of(self.spec.config)

    # -- web side ------------------------------------------------------------

    def load_files(self) -> None:
        """Read the files the web side uses (a tokenizer, labels), once, as the web tier starts serving
        this version: removed from the store meanwhile, it serves on from memory until dropped."""
        return None  # a task that reads no files of its own in the web tier

    @abc.abstractmethod
    def preprocess(self, item: Any) -> Prepared:
        """One request item (bytes of an image, a text, a JSON value, an Upload) -> its named arrays
        (an item of the job), or WithContext(arrays, context) when its result needs what this learned
        of it: the context travels with the item and reaches `postprocess`, never the model.

        Raise funnel.common.errors.BadInput (400) with a clear message for an
        item this model cannot take.
        """

    def public(self) -> dict[str, Any]:
        """What GET /v1/models shows of this model beyond its spec, input kind and limits."""
        return {}

    def output_shapes(self) -> dict[str, list[int]]:
        """The shape of each model output per item (-1 where it varies), for tensor protocols (/v2)."""
        return {name: [-1] for name in self.spec.config.get("outputs", [])}

    def class_labels(self) -> Sequence[str] | None:
        """Names of the output's classes, for the /v2 classification extension (None: indexes only)."""
        return None

    # -- worker side ---------------------------------------------------------

    def check(self, inputs: Inputs) -> None:
        """Raise BadInput for an item whose arrays this model cannot run (a job pushed by hand, past
        the web tier's checks); default: none refused."""
        return None

    def buckets(self, items: list[Inputs]) -> list[list[int]]:
        """Split a batch into runs of item indexes, each a model call of its own (default: one run of all).

        For a task whose collate pads to the widest item: group_by_width
        (funnel.common.tasks.buckets) picks runs of like width.
        """
        return [list(range(len(items)))]

    def warmup_inputs(self) -> list[Inputs]:
        """Example items the worker runs in every batch size before it registers, one per input width
        worth warming (worker/warmup.py); default none: no warm-up."""
        return []

    def collate(self, items: list[Inputs]) -> dict[str, np.ndarray]:
        """The jobs' arrays -> one batch of feeds, named as the graph's inputs (or as `predict` reads
        them); default: each named array stacked, for items whose arrays have one shape."""
        return {name: np.stack([item[name] for item in items]) for name in items[0]}

    @classmethod
    def in_python(cls) -> bool:
        """Whether the worker runs this task's model in Python (`load` and `predict`), not a graph."""
        return cls.predict is not Task.predict

    @classmethod
    def in_chain(cls) -> bool:
        """Whether this task is a chain of other served models (`Chain`), run on their queues."""
        return False

    def load(self, device: str) -> Any:
        """The model, in Python, on `device` ("cpu", "cuda:0"): whatever `predict` takes. Runs once per
        load, in the model's own process (worker/model_process.py); read its files from `self.spec`."""
        raise NotImplementedError(f"{type(self).__name__} defines predict but not load")

    def predict(self, model: Any, batch: dict[str, np.ndarray]) -> Any:
        """`collate`'s batch -> one row per item, in order: a sequence (a list, or an array whose first
        axis is the batch) of each item's named outputs (a dict), or of one value each, named as
        model.json's first "outputs" ("output" when it names none). Raise BadInput for an item the
        model cannot take: the worker finds which item by running parts of the batch again."""
        raise NotImplementedError

    def postprocess(self, row: dict[str, Any], context: Context | None = None) -> dict[str, Any]:
        """One item's row, its named outputs -> its result (JSON-able, or numpy arrays); default: the row
        as it is.

        `context` is what `preprocess` returned beside the item's arrays (WithContext); a task that
        returns none is called with the row alone, so `postprocess(self, row)` suffices for it.
        """
        return dict(row)


class StepFailed(FunnelError):
    """One element of a chain's step that its model failed: what `Chain.next_items` and `Chain.answer`
    find in its place among the step's results (its code, message and HTTP status, as a client of
    that model would have been answered). Raised from a hook, it fails the request's item so."""

    def public(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message}


class Chain(Task):
    """A model of models: its steps are served models, named in model.json ("steps"), each run on its
    own queue, where its items batch with every other request's (worker/chain.py).

    The web tier prepares a chain's item as any task's (`preprocess`). Its worker then asks
    `next_items` for each step's items: one for the request's item, or one per element of the step
    before (a fan-out); each goes to the step's model as a prepared item (its arrays, or
    WithContext), and its result comes back as that model's client would get it. Once the last step
    is done, `answer` makes the request's result from every step's results. Both hooks run in the
    chain's worker, never in the web process that waits on the request.
    """

    @property
    def steps(self) -> list[str]:
        """The steps' models, in order: "name" (its highest version in the store) or "name:version"."""
        steps = self.spec.config.get("steps")
        if not isinstance(steps, list) or not steps or not all(isinstance(s, str) for s in steps):
            raise ValueError(f"{self.spec.name}: a chain's model.json names its steps: \"steps\": [model, ...]")
        return steps

    def step_task(self, step: int) -> Task:
        """The Task of step `step`'s model, from this chain's store: its `preprocess` makes the step's
        items as a request to that model would have them."""
        tasks = self.__dict__.setdefault("_step_tasks", {})
        if step not in tasks:
            from funnel.common.store import load_spec
            from funnel.common.tasks import load

            name, _, pinned = self.steps[step].partition(":")
            tasks[step] = load(load_spec(self.spec.store, name, int(pinned) if pinned else None))
        return tasks[step]

    def collate(self, items: list[Inputs]) -> dict[str, np.ndarray]:
        return {}  # a chain runs no graph: its items go to its steps one by one

    @abc.abstractmethod
    def next_items(self, step: int, item: Inputs, context: Context | None, done: list[list[Any]]) -> list[Prepared]:
        """The items of step `step` (0 first) for this request's item: a list of one to run the step once,
        one per element of the step before to fan out, or none to skip it. `done` holds each step run so
        far, its results in order: each a result as the step's model answers it, or StepFailed.
        Raise BadInput (or any FunnelError) to fail the request's item."""

    @abc.abstractmethod
    def answer(self, item: Inputs, context: Context | None, done: list[list[Any]]) -> dict[str, Any]:
        """The request item's result, from every step's results (`done`, as for next_items)."""

    @classmethod
    def in_chain(cls) -> bool:
        return True
