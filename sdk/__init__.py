"""Funnel's public names: what your model's code imports.

    from funnel import Task, WithContext, Upload, BadInput

A model is a Task subclass (common/tasks/base.py says every hook) and a folder
in the model store (`funnel add`); docs/models.md walks through three. These
names stay where they are across releases; the modules under funnel.common,
funnel.web and funnel.worker are Funnel's own, and may move.
"""

from funnel.common.errors import BadInput, FunnelError
from funnel.common.tasks import imaging
from funnel.common.tasks.base import Chain, Context, InputKind, Inputs, Prepared, StepFailed, Task, Upload, WithContext
from funnel.common.tasks.buckets import group_by_width

__all__ = ["Task", "Chain", "StepFailed", "WithContext", "Upload", "BadInput", "FunnelError", "Inputs", "Context",
           "InputKind", "Prepared", "group_by_width", "imaging"]
