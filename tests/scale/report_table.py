"""Print the rows `make scale` appended to its report file as one table per test."""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def main(path: str) -> None:
    try:
        with open(path) as src:
            rows = [json.loads(line) for line in src if line.strip()]
    except FileNotFoundError:
        print(f"no scale report at {path}")
        return
    by_test: dict[str, list[dict[str, object]]] = defaultdict(list)
    for row in rows:
        by_test[str(row["test"])].append(row)
    for test, group in by_test.items():
        keys = [k for k in group[0] if k not in ("test", "profile", "at")]
        print(f"\n{test}")
        print("| " + " | ".join(keys) + " |")
        print("|" + "---|" * len(keys))
        for row in group:
            print("| " + " | ".join(str(row.get(k, "")) for k in keys) + " |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "test-output/scale.jsonl")
