"""Funnel's task for the classifier in iris.py: JSON measurements in, the species out.

    funnel add iris --task irisclassifier.tasks:Species --file model=iris.joblib --outputs probabilities
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from funnel import BadInput, Task
from irisclassifier import iris


class Species(Task):
    input_kind = "json"  # each input: [sepal length, sepal width, petal length, petal width], in cm

    def preprocess(self, item: Any) -> dict[str, np.ndarray]:
        if (type(item) is not list or len(item) != 4
                or not all(type(x) in (int, float) and math.isfinite(x) and 0 <= x <= 100 for x in item)):
            raise BadInput("each input is 4 measurements in cm: sepal length and width, petal length and width")
        return {"measurements": np.asarray(item, dtype=np.float64)}

    def load(self, device: str):
        return iris.load(self.spec.file("model"))  # scikit-learn runs on the CPU whatever the device

    def predict(self, model, batch: dict[str, np.ndarray]) -> np.ndarray:
        return iris.probabilities(model, batch["measurements"])  # collate's default stacked them

    def postprocess(self, row: dict[str, np.ndarray]) -> dict[str, Any]:
        p = row["probabilities"]
        return {"species": iris.SPECIES[int(np.argmax(p))],
                "probabilities": dict(zip(iris.SPECIES, p.tolist()))}
