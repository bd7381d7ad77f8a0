"""report.png of a `make bench` run: the latency CDFs one fault at a time, the storms, the breaker at its
limit and the operator's RSS over the run (the core phases'; a run without them has no plot).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(path: Path, res: dict[str, Any], series: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    fig.suptitle(f"gpuhealth bench: {res['nodes']} nodes, {res.get('pods')} pods; {res['machine']}", fontsize=9)

    ax = axes[0][0]
    curves = (
        ("detect_ms", res.get("detect_to_taint_ms"), "gpuhealth: report -> taint", "tab:blue"),
        ("floor_ms", res.get("floor_ms"), "floor", "tab:gray"),
        ("device_ms", res.get("device_to_rule_ms"), "gpuhealth: GPU fault -> DeviceTaintRule", "tab:green"),
        ("e2e_ms", (res.get("e2e") or {}).get("emit_to_taint_ms"), "real agent: NVML XID -> taint", "tab:red"),
    )
    for key, stats, label, color in curves:
        if not stats:
            continue
        vals = sorted(series.get(key) or [])
        timeouts = int(stats.get("timeouts") or 0)
        if vals:
            # Faults whose taint never came within the timeout count in the denominator (the curve stops short of 1).
            ys = [(i + 1) / (len(vals) + timeouts) for i in range(len(vals))]
            extra = f", {timeouts} timed out" if timeouts else ""
            ax.step(
                vals,
                ys,
                where="post",
                label=f"{label} (p50 {stats['p50']:.0f} ms, n={len(vals)}{extra})",
                color=color,
            )
    ax.axvline(200, color="tab:green", ls="--", lw=1, label="target p50 200 ms")
    ax.axvline(1000, color="tab:red", ls="--", lw=1, label="target p99 1 s")
    ax.set_xscale("log")
    ax.set_xlabel("fault to taint (Node watch) or DeviceTaintRule (rule watch) (ms, log)")
    ax.set_ylabel("fraction of faults")
    ax.set_title("Latency CDF: one fault at a time")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)

    ax = axes[0][1]
    storm = series.get("storm") or []
    if storm:
        ax.step([t for t, _ in storm], [c for _, c in storm], where="post", color="tab:blue", label="quarantined")
    dstorm = series.get("device_storm") or []
    if dstorm:
        ax.step(
            [t for t, _ in dstorm],
            [c for _, c in dstorm],
            where="post",
            color="tab:green",
            label="device storm: GPUs with a rule",
        )
    pub = series.get("storm_published") or []
    if pub:
        ax.step(pub, [i + 1 for i in range(len(pub))], where="post", color="tab:gray", ls=":", label="reports written")
        ax.legend(fontsize=8, loc="lower right")
    s = res["storm"]
    ax.set_title(f"Storm, breaker 100%: {s['nodes']} nodes at once -> {s['nodes_per_s']} nodes/s")
    ax.set_xlabel("seconds since the reports were published")
    ax.set_ylabel("nodes quarantined (taint seen) / GPUs with a rule")
    ax.grid(alpha=0.3)

    ax = axes[1][0]
    br = series.get("breaker") or []
    if br:
        ax.plot([t for t, _ in br], [c for _, c in br], color="tab:orange", label="quarantined (50 ms samples)")
    b = res["breaker"]
    ax.axhline(b["limit"], color="tab:red", ls="--", lw=1, label=f"limit {b['limit']} ({b.get('max_unhealthy', '5%')})")
    ax.set_ylim(0, max(b["limit"], b["max_quarantined_seen"], b.get("faulted") or 0) * 1.15 + 1)
    ax.set_title(
        f"Breaker {b.get('max_unhealthy', '5%')}: {b.get('faulted')} nodes fault at once; "
        f"max seen {b['max_quarantined_seen']}"
    )
    ax.set_xlabel("seconds since the faults")
    ax.set_ylabel("nodes carrying the gpuhealth taint")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)

    ax = axes[1][1]
    rss = series.get("operator_rss") or []
    if rss:
        ax.plot([t for t, _ in rss], [r for _, r in rss], color="tab:purple", label="operator RSS")
    ax.axhline(250, color="tab:red", ls="--", lw=1, label="target 250 MB")
    o = res["operator"]
    t_op = next((p[1] for p in res.get("phases", []) if p[0] == "operator start-up"), 0.0)
    for name, t, *_ in res.get("phases", []):
        if t >= t_op:
            ax.axvline(t - t_op, color="gray", lw=0.5)
            ax.text(
                t - t_op, 5, name.split(":")[0].split(" (")[0][:24], rotation=90, fontsize=6, va="bottom", color="gray"
            )
    ax.set_ylim(0, max(260, max((r for _, r in rss), default=0) * 1.1))
    ax.set_title(f"Operator RSS (peak {o['peak_rss_mb']} MB), idle writes {o['idle_writes_per_min']}/min")
    ax.set_xlabel("seconds since the operator started")
    ax.set_ylabel("MB")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)

    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)
