"""The live dashboard (sub-application mounted by the worker's web server at ``/dashboard/``).

``make_dashboard_app(settings)`` builds it; ``python -m agents.dashboard`` runs it standalone
against any broker (see ``--help``).
"""

from agents.dashboard.app import DashboardConfig, make_dashboard_app

__all__ = ["DashboardConfig", "make_dashboard_app"]
