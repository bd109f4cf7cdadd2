"""``kvstab.live``: measure a running OpenAI-compatible server against ``μ``.

* :mod:`~kvstab.live.emulator` and :mod:`~kvstab.live.server` — ``kvstab serve
  --emulate``, a server whose batching is kvstab's ``vllm-v1`` model, with vLLM's
  metric names;
* :mod:`~kvstab.live.bench` — ``kvstab bench``, the load generator;
* :mod:`~kvstab.live.scrape` — reading ``/metrics`` (M, b̄, queue slope, KV use, prefix-cache hits);
* :mod:`~kvstab.live.formats` — ``vllm bench serve``, AIPerf and GuideLLM results in,
  llm-d benchmark reports out;
* :mod:`~kvstab.live.tokenizer` — the emulator's tokenizer as a Hugging Face
  folder, for load generators that count tokens themselves.

aiohttp and prometheus_client are imported only here.
"""

__all__ = ["emulator", "server", "bench", "scrape", "formats", "tokenizer"]
