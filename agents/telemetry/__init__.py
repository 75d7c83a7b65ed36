"""What one process tells its operators: Prometheus metrics and structured JSON logs.

Holds :mod:`~agents.telemetry.metrics` (the Prometheus registry of one worker process),
:mod:`~agents.telemetry.pipeline_metrics` (the protocol the stages report through) and :mod:`~agents.telemetry.logs` (JSON
lines with a privacy filter and rate limits).

May import: the standard library, ``prometheus_client``. Must not import any other package of
``agents`` (everything else reports here, so it sits at the bottom) nor ``stream_dp``. Nothing
exported here may move with a raw count by default (docs/privacy.md).
"""
