"""Run by tests/client/test_llama_index.py with llama-index's own interpreter (a venv of its own:
llama-index pins openai < 3 and marshmallow < 4, which the gateway's venv can't take).

llama-index's ``OpenAILike`` as its docs show it, with its defaults: ``is_chat_model=False``
sends ``complete`` to the legacy Completions API; with ``is_chat_model=True`` it uses Chat
Completions. Prints one JSON line of what each call returned.
"""

import json
import sys

from llama_index.core.llms import ChatMessage
from llama_index.llms.openai_like import OpenAILike

base, key, model = sys.argv[1:4]
llm = OpenAILike(model=model, api_base=base, api_key=key, max_tokens=64, max_retries=0, timeout=30)
completed = llm.complete("Say hello")
streamed = "".join(part.delta or "" for part in llm.stream_complete("Say hello again"))
chat_llm = OpenAILike(
    model=model, api_base=base, api_key=key, is_chat_model=True, max_tokens=64, max_retries=0, timeout=30
)
chatted = chat_llm.chat([ChatMessage(role="user", content="Hello in a chat")])
print(json.dumps({"complete": completed.text, "stream": streamed, "chat": chatted.message.content}))
