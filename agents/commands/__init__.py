"""The ``stream-dp`` commands, one module each (``demo``, ``worker``, ``broker``, ``topics``,
``deployment``, ``tail``, ``replay``, ``simulate``; the contract of a command module is in
docs/CONTRACTS.md).

``replay`` is split by step: the checks before anything connects (``_replay_checks``), the
deployment it goes to and what its events topic already holds (``_replay_target``), the
resumable state (``_replay_state``), sending (``_replay_send``), the per-key history that guards
against a changed log (``replay_history``) and what it tells its user, the notes and the
``--json`` outcome (``_replay_messages``); ``worker`` makes its start-up checks in
``_worker_checks``; ``_progress`` draws the progress bar; ``_demo_traffic`` is the demo's live
traffic; ``_tail_format`` prints what ``tail`` reads.

May import: every other package of ``agents`` but ``cli``, ``stream_dp`` and ``simulators``.
Must not be imported by anything below it: only ``agents.cli`` (by name, from its command table)
and other commands import a command.
"""
