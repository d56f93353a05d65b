"""Translation tables, one dict per wire concept (Chat Completions reference)."""

from __future__ import annotations

# "Finish reasons": end_turn/stop_sequence -> stop; max_tokens and the context window -> length;
# tool_use -> tool_calls; refusal and a guardrail's intervention -> content_filter; pause_turn and
# anything unknown -> stop.
STOP_REASON_TO_FINISH_REASON: dict[str, str] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
    # Bedrock's, when a deployment's guardrail blocks the prompt or the answer (langchain-ai/langchain-aws#937)
    "guardrail_intervened": "content_filter",
    "pause_turn": "stop",
}
DEFAULT_FINISH_REASON = "stop"

# "Tools": tool_choice strings -> Anthropic tool_choice types.
TOOL_CHOICE_TO_ANTHROPIC: dict[str, str] = {"auto": "auto", "none": "none", "required": "any"}

# "Reasoning": reasoning_effort -> (effort sent, thinking requested).
REASONING_EFFORT_TO_EFFORT: dict[str, tuple[str, bool]] = {
    "none": ("low", False),
    "minimal": ("low", False),
    "low": ("low", True),
    "medium": ("medium", True),
    "high": ("high", True),
    "xhigh": ("xhigh", True),
    "max": ("max", True),
}
REASONING_EFFORTS = tuple(REASONING_EFFORT_TO_EFFORT)

# Thinking budgets for models with budget-based thinking ("enabled" + budget_tokens).
EFFORT_TO_THINKING_BUDGET: dict[str, int] = {
    "low": 2048,
    "medium": 8192,
    "high": 24576,
    "xhigh": 32768,
    "max": 63999,
}
MIN_THINKING_BUDGET = 1024

# "Images and PDFs": the data-URL media types accepted for images.
IMAGE_MEDIA_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})

# "Output length": the default output limit when the client sends none.
DEFAULT_MAX_TOKENS = 32_000

# Anthropic accepts at most this many cache_control breakpoints per request.
MAX_CACHE_BREAKPOINTS = 4


def finish_reason(stop_reason: str | None) -> str:
    """OpenAI ``finish_reason`` for an Anthropic ``stop_reason`` (unknown -> ``stop``)."""
    if stop_reason is None:
        return DEFAULT_FINISH_REASON
    return STOP_REASON_TO_FINISH_REASON.get(stop_reason, DEFAULT_FINISH_REASON)
