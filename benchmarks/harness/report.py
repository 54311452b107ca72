"""The markdown report and the PNG charts of one store's run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.common import METRICS, Row


def fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def systems_of(summary: list[Row]) -> list[str]:
    seen: list[str] = []
    for r in summary:
        if r.system not in seen:
            seen.append(r.system)
    return sorted(seen, key=lambda s: (not s.startswith("conveyor"), seen.index(s)))


def cell(by: dict[tuple[str, str], Row], system: str, scenario: str, attr: str, spec: str) -> str:
    r = by.get((system, scenario))
    if r is None:
        return "-"
    if r.na:
        return "failed" if r.failed else "n/a"
    return fmt(getattr(r, attr), spec)


def ratio(by: dict[tuple[str, str], Row], mine: str, peer: str, scenario: str, attr: str) -> str:
    a, b = by.get((mine, scenario)), by.get((peer, scenario))
    if a is None or b is None:
        return "-"
    if a.na or b.na:
        return "n/a"
    x, y = getattr(a, attr), getattr(b, attr)
    if x is None or not y:
        return "-"
    return f"x{x / y:.2f}"


def tables(summary: list[Row]) -> list[str]:
    by = {(r.system, r.scenario): r for r in summary}
    systems = systems_of(summary)
    out = ["| metric (median) | " + " | ".join(systems) + " |", "|---|" + "---:|" * len(systems)]
    for scenario, attr, label, spec in METRICS:
        out.append(
            f"| {label} | " + " | ".join(cell(by, s, scenario, attr, spec) for s in systems) + " |"
        )
    mine = [s for s in systems if s.startswith("conveyor")]
    peers = [s for s in systems if not s.startswith("conveyor")]
    for m in mine:
        if not peers:
            break
        out += [
            "",
            f"Ratios **{m} / peer** (jobs/s: above 1 = Conveyor faster; latency: below 1 = Conveyor faster)",
            "",
        ]
        out += ["| metric | " + " | ".join(peers) + " |", "|---|" + "---:|" * len(peers)]
        for scenario, attr, label, _ in METRICS:
            out.append(
                f"| {label} | " + " | ".join(ratio(by, m, p, scenario, attr) for p in peers) + " |"
            )
    return out


def notes(summary: list[Row]) -> list[str]:
    out = []
    for r in summary:
        if r.note:
            out.append(f"- `{r.system}` / `{r.scenario}`: {r.note}")
    return out


def charts(store: str, summary: list[Row], out_dir: Path, stem: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = {(r.system, r.scenario): r for r in summary}
    systems = systems_of(summary)
    paths = []

    groups = [
        ("enqueue", "enqueue\none by one"),
        ("enqueue_many", "bulk\nenqueue"),
        ("drain", "drain,\n1 process"),
        ("drain_2p", "drain,\n2 processes"),
    ]
    fig, ax = plt.subplots(figsize=(10, 4.8))
    width = 0.8 / max(1, len(systems))
    for k, s in enumerate(systems):
        xs, ys = [], []
        for g, (scenario, _) in enumerate(groups):
            r = by.get((s, scenario))
            if r is not None and not r.na and r.jobs_per_s:
                xs.append(g + (k - (len(systems) - 1) / 2) * width)
                ys.append(r.jobs_per_s)
        ax.bar(xs, ys, width, label=s)
    ax.set_xticks(range(len(groups)), [label for _, label in groups])
    ax.set_yscale("log")
    ax.set_ylabel("jobs/s (log scale; higher is better)")
    ax.set_title(f"{store}: throughput, medians (missing bar = n/a)")
    ax.legend(fontsize=8, ncol=min(4, len(systems)))
    ax.grid(axis="y", alpha=0.3, which="both")
    fig.tight_layout()
    p = out_dir / f"{stem}-throughput.png"
    fig.savefig(p, dpi=90)
    plt.close(fig)
    paths.append(p)

    groups2 = [
        ("latency", "p50_ms", "idle p50"),
        ("latency", "p99_ms", "idle p99"),
        ("latency_load", "p50_ms", "half load p50"),
        ("latency_load", "p99_ms", "half load p99"),
    ]
    lat_systems = [s for s in systems if any((s, g[0]) in by for g in groups2)]
    fig, ax = plt.subplots(figsize=(10, 4.8))
    width = 0.8 / max(1, len(lat_systems))
    for k, s in enumerate(lat_systems):
        xs, ys = [], []
        for g, (scenario, attr, _) in enumerate(groups2):
            r = by.get((s, scenario))
            v = getattr(r, attr) if r is not None else None
            if v is not None:
                xs.append(g + (k - (len(lat_systems) - 1) / 2) * width)
                ys.append(max(v, 0.05))
        ax.bar(xs, ys, width, label=s)
    ax.set_xticks(range(len(groups2)), [label for *_, label in groups2])
    ax.set_yscale("log")
    ax.set_ylabel("enqueue to start, ms (log scale; lower is better)")
    ax.set_title(f"{store}: latency, pooled over rounds")
    ax.legend(fontsize=8, ncol=min(4, len(lat_systems)))
    ax.grid(axis="y", alpha=0.3, which="both")
    fig.tight_layout()
    p = out_dir / f"{stem}-latency.png"
    fig.savefig(p, dpi=90)
    plt.close(fig)
    paths.append(p)
    return paths


def markdown(
    store: str,
    summary: list[Row],
    rounds: list[list[Row]],
    env: dict[str, Any],
    params: dict[str, Any],
    chart_paths: list[Path],
) -> str:
    lines = [f"# {store} benchmark, {env['date']}", ""]
    lines += [f"Command: `{params['command']}`", ""]
    lines += [
        f"{params['mode']}: {params['jobs']:,} jobs per throughput scenario, {params['rounds']} round(s), "
        f"{params['latency_samples']} idle latency probes per round, {params['load_seconds']:g} s of steady "
        f"load per system and round, worker concurrency {params['concurrency']}.",
        "",
    ]
    lines += ["## Medians", "", *tables(summary), ""]
    lines += [
        "`n/a`: the system cannot do this (see the notes); `-`: not measured for this row.",
        "",
    ]
    for p in chart_paths:
        lines += [f"![{p.stem}]({p.name})", ""]
    lines += ["## Notes per result", "", *notes(summary), ""]
    caveats = env.get("caveats")
    lines += ["## Machine and versions", ""]
    for k, v in env.items():
        if k != "caveats":
            lines.append(f"- {k}: {v}")
    lines.append("")
    if caveats:
        lines += ["## What each system guarantees for its speed", ""]
        lines += [f"- `{k}`: {v}" for k, v in caveats.items()] + [""]
    lines += [
        "## Every round",
        "",
        "| round | system | scenario | jobs/s | p50 ms | p99 ms |",
        "|---:|---|---|---:|---:|---:|",
    ]
    for i, rs in enumerate(rounds, 1):
        for r in rs:
            if r.failed:
                lines.append(f"| {i} | {r.system} | {r.scenario} | {r.note} | | |")
                continue
            if r.na:
                continue
            lines.append(
                f"| {i} | {r.system} | {r.scenario} | {fmt(r.jobs_per_s, ',.0f')} | "
                f"{fmt(r.p50_ms, '.2f')} | {fmt(r.p99_ms, '.2f')} |"
            )
    lines.append("")
    return "\n".join(lines)
