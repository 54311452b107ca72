"""``manage.py conveyor ARGS``: the conveyor CLI on the project's app, e.g.
``manage.py conveyor worker --queues default,emails --concurrency 4``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

APP_SPEC = "conveyor.contrib.django.boot:app"
# Django's own options, which manage.py has acted on already.
_DJANGO_OPTIONS = ("--settings", "--pythonpath")


def cli_args(argv: list[str]) -> list[str]:
    """The conveyor CLI's arguments for ``manage.py conveyor ...`` (``argv`` after the command
    name): Django's options dropped, ``--app`` added unless given."""
    args: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in _DJANGO_OPTIONS:
            skip = True
            continue
        if arg.startswith(tuple(f"{o}=" for o in _DJANGO_OPTIONS)):
            continue
        args.append(arg)
    if not any(a == "--app" or a.startswith("--app=") for a in args):
        args = ["--app", APP_SPEC, *args]
    return args


class Command(BaseCommand):
    help = ("Run the conveyor CLI on this project's app: `manage.py conveyor worker ...`, "
            "`manage.py conveyor stats`, `manage.py conveyor dlq list`... "
            "(`manage.py conveyor --help` lists the commands).")

    def run_from_argv(self, argv: list[str]) -> None:
        # Every argument is the conveyor CLI's: no argparse of Django's in between.
        run(cli_args(argv[2:]), prog_name=f"{argv[0]} {argv[1]}")

    def handle(self, *args: Any, **options: Any) -> None:  # call_command("conveyor", ...)
        run(cli_args(list(args)), prog_name="conveyor")


def run(args: list[str], prog_name: str) -> None:
    """The conveyor CLI's main(), with these arguments."""
    from conveyor.cli import main

    main(args, prog_name)
