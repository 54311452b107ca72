"""The Django app: on start, every installed app's ``tasks`` module is imported, so its tasks
are registered on the project's Conveyor app (``conveyor.contrib.django.app``)."""

from __future__ import annotations

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class ConveyorConfig(AppConfig):
    name = "conveyor.contrib.django"
    label = "conveyor"
    verbose_name = "Conveyor"

    def ready(self) -> None:
        from . import get_app

        get_app()  # settings checked now; the store opens on first use
        autodiscover_modules("tasks")
