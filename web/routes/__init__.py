"""The routes Flask answers beside the ASGI front's predicts (web/transport/front.py): the job
routes (jobs.py) and the Open Inference Protocol's probes and metadata (v2.py); web/app.py
holds the page, the listings, health, readiness and metrics."""
