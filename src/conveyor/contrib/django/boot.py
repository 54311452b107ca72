"""The project's app with Django set up, for the conveyor CLI:
``conveyor --app conveyor.contrib.django.boot:app ...`` (what ``manage.py conveyor`` passes,
and what each child of ``--processes N`` imports; ``$DJANGO_SETTINGS_MODULE`` names the
settings)."""

from __future__ import annotations

import django
from django.apps import apps

if not apps.ready:
    django.setup()

from . import get_app  # after setup: the settings are read here

app = get_app()
