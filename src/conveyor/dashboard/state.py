"""The state behind one dashboard app: the Conveyor app, auth settings, sampler, templates."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup
from starlette.templating import Jinja2Templates

from ..app import Conveyor
from ..backends.base import Backend
from ..textsafe import escape_controls
from . import formatting as fmt
from .sampler import Sampler
from .security import AuthConfig

HERE = Path(__file__).parent


@dataclass
class Dashboard:
    """The state behind one dashboard app: the Conveyor app, the auth settings, the sampler."""

    conveyor: Conveyor
    auth: AuthConfig
    sampler: Sampler
    title: str = "Conveyor"
    templates: Jinja2Templates = field(init=False)

    def __post_init__(self) -> None:
        env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,  # every template, whatever its name: job data is never trusted
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
            finalize=_visible,
        )
        env.filters.update(
            duration=fmt.duration, when=fmt.when, iso=fmt.iso, count=fmt.count, rate=fmt.rate,
            json=fmt.to_json, mask=fmt.mask, shorten=fmt.shorten, call=fmt.call_preview,
        )
        self.templates = Jinja2Templates(env=env)

    @property
    def backend(self) -> Backend:
        return self.conveyor.backend


def _visible(value: Any) -> Any:
    """Every value a template prints: control characters shown as escapes (newlines and tabs
    kept, tracebacks keep their shape). Markup is a macro's output, already made visible."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return escape_controls(value, keep="\n\t")
    return value

