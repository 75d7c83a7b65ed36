"""Reconcile: released noisy counts -> consistent hierarchical histograms (the side agent).

Holds the agent (:mod:`~agents.reconcile.agent`: leader-elected, it gathers each tick's releases
for the whole domain, solves for consistency with :mod:`stream_dp.consistency` and publishes),
its configuration and default solver (:mod:`~agents.reconcile.config`), leader election
(:mod:`~agents.reconcile.leader`), tick gathering (:mod:`~agents.reconcile.ticks`),
binary-attribute tables (:mod:`~agents.reconcile.tables`) and the histogram message and the
encoding of one solved tick (:mod:`~agents.reconcile.messages`).

May import: ``agents.kafka``, ``agents.config``, ``agents.telemetry``, ``stream_dp``. Must not
import ``ingest`` or ``release`` (it reads only what they published), nor ``worker``,
``dashboard``, ``commands`` or ``cli``.
"""
