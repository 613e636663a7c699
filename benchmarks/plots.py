"""The PNG plots next to a results file: throughput, latency and Funnel's batch sizes per suite."""

from __future__ import annotations

from benchmarks import RESULTS
from benchmarks.systems import LABELS


def plot_suite(model: str, suite_label: str, summary: dict, pairs, concurrency, stem: str) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = {}
    servers = [(s, i) for s, i in pairs if s != "ceiling" and summary.get(f"{s}:{i}")]
    ceilings = [(i, summary[f"ceiling:{i}"]) for s, i in pairs
                if s == "ceiling" and f"ceiling:{i}" in summary]

    fig, ax = plt.subplots(figsize=(10, 4.5))
    for system, impl in servers:
        points = summary[f"{system}:{impl}"]
        cs = [c for c in concurrency if c in points]
        rps = [points[c]["rps"] for c in cs]
        err = [[points[c]["rps"] - points[c]["rps_range"][0] for c in cs],
               [points[c]["rps_range"][1] - points[c]["rps"] for c in cs]]
        ax.errorbar(cs, rps, yerr=err, marker="o", capsize=3, label=f"{LABELS[system]} ({impl})")
    for n, (impl, v) in enumerate(ceilings):
        ax.axhline(v["batch32"], color="k", linestyle=["--", ":"][n % 2], linewidth=1,
                   label=f"ceiling {impl}, batch 32")
        ax.axhline(v["batch1"], color="grey", linestyle=["--", ":"][n % 2], linewidth=1,
                   label=f"ceiling {impl}, batch 1")
    ax.set_xscale("log", base=2)
    ax.set_xticks(concurrency, [str(c) for c in concurrency])
    ax.set_xlabel("concurrent clients (wrk connections)")
    ax.set_ylabel("requests/s")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{model}: throughput ({suite_label})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    files["throughput"] = f"{stem}-throughput.png"
    fig.savefig(RESULTS / files["throughput"], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for key, ax in zip(("p50_ms", "p99_ms"), axes):
        for system, impl in servers:
            points = summary[f"{system}:{impl}"]
            cs = [c for c in concurrency if c in points]
            ax.plot(cs, [points[c][key] for c in cs], marker="o", label=f"{LABELS[system]} ({impl})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(concurrency, [str(c) for c in concurrency])
        ax.set_xlabel("concurrent clients")
        ax.set_title(f"{key[:3]} latency")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("ms")
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(f"{model}: latency ({suite_label})")
    fig.tight_layout()
    files["latency"] = f"{stem}-latency.png"
    fig.savefig(RESULTS / files["latency"], dpi=110)
    plt.close(fig)

    funnel = next((summary[f"funnel:{i}"] for s, i in pairs
                   if s == "funnel" and f"funnel:{i}" in summary), {})
    sizes, hist = funnel.get("batch_sample_c32"), funnel.get("batch_hist")
    if sizes or hist:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
        if sizes:
            top = max(sizes)
            axes[0].hist(sizes, bins=range(1, top + 2), align="left", rwidth=0.85)
            axes[0].set_xlabel("batch size the answer rode in")
            axes[0].set_ylabel("answers")
            axes[0].set_title(f"meta.batch_size, 32 clients, {len(sizes)} answers")
        if hist:
            buckets = sorted({k for h in hist.values() for k in h}, key=lambda k: int(k.rsplit("_", 1)[1]))
            width = 0.8 / len(hist)
            for n, (c, h) in enumerate(sorted(hist.items())):
                total = sum(h.values()) or 1
                axes[1].bar([x + n * width for x in range(len(buckets))],
                            [100 * h.get(k, 0) / total for k in buckets], width, label=f"{c} clients")
            axes[1].set_xticks([x + 0.4 - width / 2 for x in range(len(buckets))],
                               [f"≤{k.rsplit('_', 1)[1]}" for k in buckets])
            axes[1].set_xlabel("batch size bucket")
            axes[1].set_ylabel("% of batches")
            axes[1].set_title("worker counters, per concurrency")
            axes[1].legend(fontsize=7)
        fig.suptitle(f"{model}: Funnel's batches ({suite_label})")
        fig.tight_layout()
        files["batches"] = f"{stem}-batches.png"
        fig.savefig(RESULTS / files["batches"], dpi=110)
        plt.close(fig)
    return files
