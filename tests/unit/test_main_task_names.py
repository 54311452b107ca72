"""A task defined in the script being run is named as the worker imports that file: jobs that
``python tasks.py`` enqueues must be known to ``conveyor worker --app tasks:app``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
from conveyor import Conveyor
app = Conveyor("sqlite:///{db}")

@app.task
def thumbnail(image: int) -> str:
    return str(image)

if __name__ == "__main__":
    print(thumbnail.name)
"""


def run(tmp_path: Path, *args: str) -> str:
    (tmp_path / "shop_tasks.py").write_text(SCRIPT.format(db=tmp_path / "t.db"))
    out = subprocess.run([sys.executable, *args], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60, check=True)
    return out.stdout.strip()


def test_a_script_run_by_path_names_its_tasks_after_its_file(tmp_path: Path) -> None:
    assert run(tmp_path, "shop_tasks.py") == "shop_tasks.thumbnail"


def test_a_module_run_with_dash_m_names_its_tasks_after_the_module(tmp_path: Path) -> None:
    assert run(tmp_path, "-m", "shop_tasks") == "shop_tasks.thumbnail"


def test_the_worker_knows_what_the_script_enqueued(tmp_path: Path) -> None:
    (tmp_path / "shop_tasks.py").write_text(SCRIPT.format(db=tmp_path / "t.db").replace(
        'print(thumbnail.name)', 'thumbnail.enqueue(7)'))
    subprocess.run([sys.executable, "shop_tasks.py"], cwd=tmp_path, check=True, timeout=60)
    worker = subprocess.run(
        [sys.executable, "-m", "conveyor", "worker", "--app", "shop_tasks:app", "--burst"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert worker.returncode == 0, worker.stderr
    assert "1 succeeded" in worker.stderr and "0 dead" in worker.stderr, worker.stderr
