"""agents.reconcile (see the package contract written in the next step)."""
