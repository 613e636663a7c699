"""A chain of two served models, Funnel's own image classifier then its text embedder (docs/models.md, "Chains")."""
