"""ezat_compat: an on-prem gateway serving OpenAI Chat Completions and Anthropic Messages
in front of Claude deployments."""

__version__ = "0.1.0"
