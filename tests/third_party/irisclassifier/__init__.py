"""A scikit-learn model served as it is: fitted, saved with joblib, loaded in the worker (docs/models.md)."""
