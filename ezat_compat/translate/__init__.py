"""Pure translation between OpenAI Chat Completions and Anthropic Messages (see README.md)."""
