"""all-MiniLM-L6-v2 as its own code runs it: transformers, mean pooling, torch eager (docs/models.md)."""
