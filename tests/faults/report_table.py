"""Print the reports of a fault run (``CONVEYOR_FAULT_REPORT=<file>``, one JSON line per run) as
the Markdown table of docs/reliability.md: ``python tests/faults/report_table.py <file>``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def fmt_faults(faults: dict[str, Any]) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in faults.items()) or "-"


def main(path: str) -> int:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if not rows:
        print(f"{path}: no reports")
        return 1
    print(f"Profile {rows[0]['profile']}, {rows[0]['at']} to {rows[-1]['at']}.\n")
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
