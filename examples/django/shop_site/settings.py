"""Settings of the shop example.

By default everything is SQLite: Django's database and Conveyor's store, two files in
``$SHOP_DATA_DIR`` (default: this directory). With ``SHOP_DATABASE=postgresql://...`` Django
uses that PostgreSQL database and Conveyor keeps its jobs in it too
(``CONVEYOR = {"database": "default"}``), so an order and its receipt job commit together.
"""

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("SHOP_DATA_DIR", BASE_DIR))

SECRET_KEY = "example-only-not-secret"
DEBUG = True
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "shop_site.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "conveyor.contrib.django",  # tasks.py of every app below is loaded; manage.py conveyor
    "shop",
]

postgres = os.environ.get("SHOP_DATABASE")
if postgres:
    url = urlsplit(postgres)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": url.path.lstrip("/"),
            "USER": unquote(url.username or ""),
            "PASSWORD": unquote(url.password or ""),
            "HOST": url.hostname or "",
            "PORT": str(url.port or ""),
            # The test run's own database (created and dropped by `manage.py test`).
            "TEST": {"NAME": os.environ.get("SHOP_TEST_DATABASE")},
        }
    }
    CONVEYOR = {"database": "default", "visibility_timeout": 10}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": DATA_DIR / "shop.sqlite3",
            # A file, not memory: the worker's threads open their own connections to it.
            "TEST": {"NAME": DATA_DIR / "test-shop.sqlite3"},
        }
    }
    CONVEYOR = {"url": os.environ.get("CONVEYOR_URL", f"sqlite:///{DATA_DIR / 'jobs.db'}"),
                "visibility_timeout": 10}
