"""The live dashboard (sub-application mounted by the worker's web server at ``/dashboard/``):
the aiohttp application in :mod:`~agents.dashboard.app`, what it holds between requests in
:mod:`~agents.dashboard.state`.

``make_dashboard_app(settings)`` builds it; ``python -m agents.dashboard`` runs it standalone
against any broker (see ``--help``). Those two names are re-exported here because they are the
documented way in (docs/CONTRACTS.md): the worker's web server mounts the dashboard by this
module's name, so the dashboard stays optional.

May import: ``agents.kafka``, ``agents.config``, ``agents.telemetry``, ``stream_dp``, aiohttp.
Must not import ``ingest``, ``release``, ``reconcile``, ``worker``, ``commands`` or ``cli``: it
reads only what the service published.
"""

from agents.dashboard.app import DashboardConfig, make_dashboard_app

__all__ = ["DashboardConfig", "make_dashboard_app"]
