"""agents.worker (see the package contract written in the next step)."""
