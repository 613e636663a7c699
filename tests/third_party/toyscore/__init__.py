"""A third-party Funnel task: a vector of numbers in, a score per class out."""
