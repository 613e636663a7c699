"""The model's own code, nothing of Funnel: a scikit-learn classifier of iris flowers.

Fitted on the iris measurements scikit-learn ships, saved with joblib. A
joblib file is a pickle: loading one runs code, so load only your own
(docs/security.md).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SPECIES = ("setosa", "versicolor", "virginica")


def fit(path: Path) -> None:
    import joblib
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    data = load_iris()
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(data.data, data.target)
    joblib.dump(model, path)


def load(path: Path):
    import joblib

    return joblib.load(path)


def probabilities(model, measurements: np.ndarray) -> np.ndarray:
    """[n, 4] sepal and petal lengths and widths (cm) -> [n, 3] each species' probability."""
    return model.predict_proba(measurements)
