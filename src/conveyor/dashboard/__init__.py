"""The web dashboard: ``conveyor dashboard``, or ``create_app(app)`` to mount in your own ASGI app.

Needs the optional web dependencies (Starlette, uvicorn, Jinja2); see docs/dashboard.md.
"""

from __future__ import annotations

from .app import DashboardApp, create_app
from .server import RunningDashboard, serve, start_in_thread

__all__ = ["DashboardApp", "RunningDashboard", "create_app", "serve", "start_in_thread"]
