"""Async and bulk jobs: a job's record and its results (jobs), storing and reading them (job_store),
what a submit must hold to (job_submit), and webhook deliveries (webhooks)."""
