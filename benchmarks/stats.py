"""Medians and ranges over rounds: the figures the report and the plots show."""

from __future__ import annotations

import statistics


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(rounds: list[dict], suite_key: str, pairs, concurrency) -> dict:
    """Medians over rounds: {name: {"ceiling": {...}} or {c: {...}}}."""
    out: dict = {}
    for system, impl in pairs:
        name = f"{system}:{impl}"
        runs = [r[suite_key][name] for r in rounds if name in r.get(suite_key, {})]
        if not runs:
            continue
        if system == "ceiling":
            out[name] = {k: med([r[k] for r in runs]) for k in ("batch1", "batch32", "batch32_pre")}
            out[name]["range32"] = (min(r["batch32"] for r in runs), max(r["batch32"] for r in runs))
            out[name]["description"] = runs[0]["description"]
            out[name]["other_cores"] = med([r.get("other_cores", float("nan")) for r in runs])
            out[name]["batch32_cores"] = med([r.get("batch32_cores", float("nan")) for r in runs])  # CPU only
            continue
        out[name] = {}
        for c in concurrency:
            points = [r["points"][c] for r in runs if c in r["points"]]
            if not points:
                continue
            groups = sorted({g for p in points for g in p["cpu_ms_per_request"]})
            out[name][c] = {
                "rps": med([p["rps"] for p in points]),
                "rps_range": (min(p["rps"] for p in points), max(p["rps"] for p in points)),
                "p50_ms": med([p["p50_ms"] for p in points]),
                "p99_ms": med([p["p99_ms"] for p in points]),
                "non2xx": sum(p["non2xx"] for p in points),
                "socket_errors": sum(p["socket_errors"] for p in points),
                "cpu": {g: med([p["cpu_ms_per_request"].get(g, 0) for p in points]) for g in groups},
                "other_cores": med([p["other_cores"] for p in points]),
                "mean_batch": med([p["mean_batch"] for p in points if "mean_batch" in p]),
                "n": len(points),
            }
        sizes = [s for r in runs for s in r.get("batch_sample_c32", [])]
        if sizes:
            out[name]["batch_sample_c32"] = sizes
        hist: dict[int, dict[str, float]] = {}  # per concurrency, summed over rounds
        for r in runs:
            for c, p in r["points"].items():
                for k, v in p.get("funnel_batches", {}).items():
                    if k.startswith("batch_le_"):
                        hist.setdefault(c, {})[k] = hist.get(c, {}).get(k, 0) + v
        if hist:
            out[name]["batch_hist"] = hist
    return out
