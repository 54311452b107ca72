"""Print the reports of a fault run (``CONVEYOR_FAULT_REPORT=<file>``, one JSON line per run) as
the Markdown table of docs/reliability.md: ``python tests/faults/report_table.py <file>``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def fmt_faults(faults: dict[str, Any]) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in faults.items()) or "-"


# Fault counters, as each test names them, grouped for the per-backend summary.
SURVIVED = {
    "sigkill": "process SIGKILLs", "sigstop": "worker SIGSTOPs", "sigstop_3x_lease": "worker SIGSTOPs",
    "worker_crashes": "worker crashes (poison)", "redis_sigkill": "Redis SIGKILL restarts",
    "pg_immediate_stop": "PostgreSQL crash restarts", "sessions_terminated": "sessions terminated",
    "disk_full_s": "disk-full episodes", "server_sigstop": "server SIGSTOPs", "clients_killed": "Redis clients killed",
    "rabbitmq_sigkill": "RabbitMQ SIGKILL restarts", "connection_cuts": "connection cuts",
}


def per_backend(rows: list[dict[str, Any]]) -> None:
    """One line per backend: load held, faults survived, bad inputs tried, lost, duplicated."""
    print("| backend | load held (enqueues ok / executions) | faults survived | bad inputs tried "
          "| lost | duplicated | recovered | unexpected |")
    print("|---|---|---|---|---|---|---|---|")
    for backend in ("sqlite", "postgres", "redis", "rabbitmq"):
        mine = [r for r in rows if r["backend"] == backend]
        if not mine:
            continue
        faults: dict[str, int] = {}
        bad = 0
        for r in mine:
            for k, v in r["faults"].items():
                if k == "poison_jobs":
                    bad += int(v)
                elif k in SURVIVED:
                    label = SURVIVED[k]
                    faults[label] = faults.get(label, 0) + (1 if k == "disk_full_s" else int(v))
        total = {key: sum(int(r[key]) for r in mine)
                 for key in ("ok", "executions", "lost", "duplicated", "recovered", "unexpected")}
        survived = ", ".join(f"{k}: {v:,}" for k, v in faults.items())
        tried = f"{bad} poison jobs (crash, Reject, 1 MB error, unknown task)" if bad else "-"
        print(f"| {backend} | {total['ok']:,} / {total['executions']:,} | {survived} "
              f"| {tried} | {total['lost']} "
              f"| {total['duplicated']} | {total['recovered']} | {total['unexpected']} |")


def main(path: str) -> int:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if not rows:
        print(f"{path}: no reports")
        return 1
    print(f"Profile {rows[0]['profile']}, {rows[0]['at']} to {rows[-1]['at']}.\n")
    per_backend(rows)
    print()
    print("| run | backend | load (enqueues ok / executions) | faults injected | lost | duplicated "
          "| recovered | unexpected | problems |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        problems = "; ".join(r["problems"]) or "none"
        print(f"| {r['name']} | {r['backend']} | {r['ok']:,} / {r['executions']:,} | {fmt_faults(r['faults'])} "
              f"| {r['lost']} | {r['duplicated']} | {r['recovered']} | {r['unexpected']} | {problems} |")
    print("\nFigures per run:\n")
    for r in rows:
        figs = ", ".join(f"{k} {v}" for k, v in r["figures"].items())
        print(f"- {r['name']} / {r['backend']} (seed {r['seed']}): {figs}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "test-output/faults-full.jsonl"))
