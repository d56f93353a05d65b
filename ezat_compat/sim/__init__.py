"""The Anthropic-compatible simulator: a Messages API server for the demo, tests and benchmarks.

Run it with ``python -m ezat_compat.sim --bind 127.0.0.1:0`` (flags: ``server.build_parser``)
or embed it: ``make_app(SimConfig(...))`` is a plain WSGI app.

Markers in the last user message steer one request: ``[[sim:key=value,flag]]``, several
allowed, never echoed. ``status=N`` (answer that error; overrides the instance's
``--fail-status``), ``retry_after=S``, ``delay=S`` (wait before answering), ``stall=S``,
``cut=N``, ``error_after=N`` (stream: an ``overloaded_error`` event after N events, no
message_stop), ``token_delay_ms=N``, ``tools=N`` (N tool calls), ``words=N`` (reply of N
filler words), ``thinking_tokens=N`` (N thinking tokens even without ``thinking``),
``refusal``, ``pause``, ``context`` (stop reasons refusal, pause_turn,
model_context_window_exceeded), ``tool=NAME`` (call that tool, also next to tool results: the next
round of an agent loop; a marker in the text of the tool results that end a request scripts the
next call, ``script``) and ``args={JSON}`` (with these arguments; last in its marker),
``reject=PATH`` (a 400 naming PATH), ``guardrail`` (on Bedrock, with a guardrail on the request:
it intervenes, ``clouds.guardrail_intervened``).

Requests are held to the real API's rules (``validate.RULES``, each with its source); the
simulator signs the thinking blocks it emits (``signing``) and refuses one it did not sign.

Modules: ``app`` (the WSGI app, the I/O shell) and ``server`` (flags, gevent, binding) around
a pure core that does no I/O, sleeps, reads no clock and draws no random number — ``errors``
(``SimError``, Anthropic's envelope), ``request`` (reading a body, the token formula),
``markers``, ``shape`` and ``validate`` (Anthropic's 400s), ``images``, ``signing``,
``cache`` (input tokens, the prompt cache), ``schema_json``, ``replies`` and ``events`` (SSE),
``ratelimit`` (the organisation's request limit, on a clock the app gives it).

This package imports nothing that opens sockets, so ``__main__`` can patch gevent first.
"""

from ezat_compat.sim.app import SimConfig, Simulator, Stats, make_app

__all__ = ["SimConfig", "Simulator", "Stats", "make_app"]
