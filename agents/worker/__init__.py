"""One worker process: the pipeline that wires the two stages, child processes, the web server.

Holds :mod:`~agents.worker.pipeline` (:class:`Worker`: builds the router, the mechanism and the
schedule, runs the ingest and release stages and hosts them as their
:class:`~agents.kafka.stage.StageHost`; the exactly-once design is in its docstring),
:mod:`~agents.worker.processes` (the pipeline in N child processes, setting
``pipeline_processes``) and :mod:`~agents.worker.web` (health, readiness, ``/metrics`` and the
dashboard's mount).

May import: ``agents.ingest``, ``agents.release``, ``agents.kafka``, ``agents.config``,
``agents.telemetry``, ``stream_dp``; ``agents.dashboard`` only by name, at run time, when the web
server mounts it. Must not import ``reconcile`` (the ``stream-dp worker`` command runs the agent
beside the pipeline), ``commands`` or ``cli``.
"""
