"""The markdown report and the PNG charts of one store's run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.common import METRICS, Row
from harness.cpu import CPU_BOUND_BUSY, PROCESS_BOUND_SHARE


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


# Issue 40, item 2: two worker processes should drain at least this many times one process's
# rate wherever the store is not the bottleneck.
TWO_PROCESS_TARGET = 1.7


def bounds(summary: list[Row]) -> list[str]:
    """Per system, its drains with one and two worker processes: the rate, the CPU per job
    (workers', the store server's), the machine's busy share over the window and what bound it
    (``harness.cpu``). Rows without those figures (runs before they existed) show ``-``."""
    by = {(r.system, r.scenario): r for r in summary}
    rows = [
        by[(s, sc)] for s in systems_of(summary) for sc in ("drain", "drain_2p") if (s, sc) in by
    ]
    if not rows:
        return []
    out = [
        "| system | worker processes | jobs/s | 2 / 1 process | worker CPU ms/job "
        "| server CPU ms/job | machine busy | what bound it |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        x = r.extra or {}
        one = by.get((r.system, "drain"))
        scale = "-"
        if r.scenario == "drain_2p" and one is not None and r.jobs_per_s and one.jobs_per_s:
            k = r.jobs_per_s / one.jobs_per_s
            scale = f"x{k:.2f}" + ("" if k >= TWO_PROCESS_TARGET else f" (< x{TWO_PROCESS_TARGET})")
        rate = "failed" if r.failed else "n/a" if r.na else fmt(r.jobs_per_s, ",.0f")
        server_ms = x.get("server_cpu_ms_per_job")
        server = "-" if server_ms is None else f"{server_ms:.3f} ({x.get('server', 'server')})"
        busy = x.get("machine_busy")
        machine = "-" if busy is None else f"{100 * busy:.0f} %"
        out.append(
            f"| {r.system} | {2 if r.scenario == 'drain_2p' else 1} | {rate} | {scale} "
            f"| {fmt(x.get('worker_cpu_ms_per_job'), '.3f')} | {server} | {machine} "
            f"| {x.get('bound', '-')} |"
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
    bound = bounds(summary)
    if bound:
        lines += [
            "## What bounds each drain",
            "",
            "Over each drain's own window (the one its rate is timed on): the worker processes' "
            "CPU (user + system, all threads, from /proc) and the store server's, per job; the "
            "machine's busy share of all its cores (/proc/stat, whatever ran: other work on the "
            "machine counts too); and the verdict: CPU-bound when the machine was at least "
            f"{100 * CPU_BOUND_BUSY:.0f} % busy, or one worker process (or the server) used at "
            f"least {100 * PROCESS_BOUND_SHARE:.0f} % of a core; "
            "otherwise the drain waited on something else (named as a likely cause, not "
            f"measured). Issue 40 asks two processes for at least x{TWO_PROCESS_TARGET} one "
            "process where the store is not the bottleneck.",
            "",
            *bound,
            "",
        ]
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
