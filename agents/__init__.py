"""The stream-dp service: events from Kafka in, differentially private releases out.

One package per concern, in layers (docs/architecture.md draws them and follows one event
through them). A package may import the packages below it, never one above; the contract is
declared in ``pyproject.toml`` (``[tool.importlinter]``) and checked by the test command:

==============  ==============================================================================
``cli``         the ``stream-dp`` console script (the command table)
``commands``    the ``stream-dp`` commands
``worker``      one worker process: the pipeline that wires the stages, child processes, web
``release``     partials -> noisy released counts | ``reconcile`` released counts ->
                consistent histograms | ``dashboard`` the live dashboard (independent)
``ingest``      events -> per-tick partial counts per release shard
``kafka``       what every Kafka client of the service shares
``config``      settings, the domain file, connection security, the deployment's identity
``telemetry``   metrics and structured logs of one process
==============  ==============================================================================

The library ``stream_dp`` (all the mathematics) lies under all of them and never imports this
package. No import circles, not even through functions or ``TYPE_CHECKING`` blocks.

Each ``__init__.py`` holds only its package's contract (what it holds, what it may import, what
it must not) and imports nothing: import a name from the module that defines it.
"""
