"""agents.kafka (see the package contract written in the next step)."""
