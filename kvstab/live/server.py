"""``kvstab serve --emulate``: an OpenAI-compatible HTTP face on :class:`~kvstab.live.emulator.Emulator`.

Routes (the subset of vLLM's OpenAI server that load generators use):

* ``POST /v1/completions`` — ``prompt`` as text or token ids (a list of ints;
  with prefix caching on, equal leading blocks of ids share KV and count as
  hits in ``/metrics``);
* ``POST /v1/chat/completions`` — ``messages`` with string contents;
* both honour ``max_tokens`` (or ``max_completion_tokens``), ``min_tokens``,
  ``ignore_eos`` and ``stream`` (server-sent events ending in ``data:
  [DONE]``, with a final ``usage`` chunk when ``stream_options.include_usage``
  is set, and the usage so far on every chunk with ``continuous_usage_stats``)
  and answer with ``usage``; errors are vLLM's shape, ``{"error": {message,
  type, param, code}}``;
* ``GET /v1/models``, ``POST /tokenize``, ``GET /health``, ``GET /metrics``
  (Prometheus text with vLLM's metric names).

The emulated tokenizer is one token per whitespace-separated word (chat: the
words of every message's content, no template), and every generated token is
the word ``tok``.  When neither ``ignore_eos`` nor ``min_tokens`` asks for
more, the emulated model emits EOS after ``eos_after`` tokens, as a real model
stops early; a server configured with ``honour_min_tokens=False`` does so
whatever the request asks (a rehearsal of a misbehaving server).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kvstab.errors import InvalidArgument
from kvstab.live.emulator import Emulator, EmulatorConfig
from kvstab.validation import MAX_TOKENS

__all__ = ["build_app", "EMULATOR_KEY", "ServerHandle", "start_in_thread"]

EMULATOR_KEY: web.AppKey[Emulator] = web.AppKey("emulator", Emulator)
_WORD = "tok"


def _error(status: int, message: str) -> web.Response:
    # vLLM's ErrorResponse (vllm/entrypoints/openai/protocol.py): clients read error.message
    return web.json_response(
        {"error": {"message": message, "type": "BadRequestError", "param": None, "code": status}}, status=status
    )


def _int_field(body: dict[str, Any], name: str, default: int | None, least: int) -> int | None:
    v = body.get(name, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not least <= v <= MAX_TOKENS:
        raise InvalidArgument(f"{name} must be an integer in [{least}, {MAX_TOKENS}], got {v!r}")
    return v


def _prompt_tokens(body: dict[str, Any], chat: bool) -> tuple[int, list[int] | None]:
    """The prompt's length in tokens, and its token ids when it was sent as ids (else ``None``)."""
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise InvalidArgument("messages must be a non-empty list of {role, content} objects")
        n = 0
        for m in msgs:
            content = m.get("content") if isinstance(m, dict) else None
            if not isinstance(content, str):
                raise InvalidArgument("each message needs a string content")
            n += len(content.split())
        return n, None
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return len(prompt.split()), None
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return len(prompt), prompt
    raise InvalidArgument("prompt must be a string or a non-empty list of token ids")


def _output_length(emu: Emulator, body: dict[str, Any], max_tokens: int) -> int:
    """Tokens the emulated model produces: ``max_tokens`` unless it may stop at EOS earlier."""
    cfg = emu.config
    min_tokens = _int_field(body, "min_tokens", 0, 0) or 0
    ignore_eos = bool(body.get("ignore_eos", False))
    eos = min(max_tokens, cfg.eos_after)
    if not cfg.honour_min_tokens or not (ignore_eos or min_tokens > 0):
        return eos
    if ignore_eos:
        return max_tokens
    return min(max_tokens, max(min_tokens, eos))


async def _generate(request: web.Request, chat: bool) -> web.StreamResponse:
    emu = request.app[EMULATOR_KEY]
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _error(400, "the request body is not JSON")
    if not isinstance(body, dict):
        return _error(400, "the request body must be a JSON object")
    try:
        s, ids = _prompt_tokens(body, chat)
        if s < 1:
            raise InvalidArgument("the prompt has no tokens")
        # chat clients (GuideLLM) send OpenAI's newer max_completion_tokens instead
        max_tokens = (_int_field(body, "max_tokens", None, 1) or _int_field(body, "max_completion_tokens", None, 1)
                      or 16)
        o = _output_length(emu, body, max_tokens)
        req = emu.submit(s, o, ids)
    except InvalidArgument as exc:
        return _error(400, str(exc))
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    created = int(time.time())
    model = emu.config.model
    kind = "chat.completion" if chat else "text_completion"
    usage = lambda: {"prompt_tokens": s, "completion_tokens": req.sent, "total_tokens": s + req.sent}  # noqa: E731
    finish = "length" if o == max_tokens else "stop"

    def choice(text: str, done: bool, stream: bool) -> dict[str, Any]:
        reason = finish if done else None
        if chat:
            key = "delta" if stream else "message"
            return {"index": 0, key: {"role": "assistant", "content": text}, "finish_reason": reason}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}

    if not body.get("stream", False):
        n = 0
        try:
            while (k := await req.tokens.get()) is not None:
                n += k
        except asyncio.CancelledError:
            emu.abort(req.rid)
            raise
        text = " ".join([_WORD] * n)
        return web.json_response(
            {"id": rid, "object": kind, "created": created, "model": model,
             "choices": [choice(text, True, False)], "usage": usage()}
        )
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    chunk_kind = "chat.completion.chunk" if chat else "text_completion"
    opts = body.get("stream_options")
    usage_chunks = isinstance(opts, dict) and bool(opts.get("include_usage"))
    # vLLM's continuous_usage_stats: the usage so far on every chunk too (GuideLLM asks for it)
    running_usage = usage_chunks and bool(opts.get("continuous_usage_stats"))  # type: ignore[union-attr]
    try:
        while (k := await req.tokens.get()) is not None:
            text = " " + " ".join([_WORD] * k)
            last = req.sent >= o
            event = {"id": rid, "object": chunk_kind, "created": created, "model": model,
                     "choices": [choice(text, last, True)]}
            if running_usage:
                event["usage"] = usage()
            await resp.write(f"data: {json.dumps(event)}\n\n".encode())
        if usage_chunks:
            event = {"id": rid, "object": chunk_kind, "created": created, "model": model, "choices": [],
                     "usage": usage()}
            await resp.write(f"data: {json.dumps(event)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
    except (asyncio.CancelledError, ConnectionResetError):
        emu.abort(req.rid)
        raise
    await resp.write_eof()
    return resp


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def _chat(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def _models(request: web.Request) -> web.Response:
    emu = request.app[EMULATOR_KEY]
    return web.json_response(
        {"object": "list", "data": [{"id": emu.config.model, "object": "model", "owned_by": "kvstab",
                                     "max_model_len": emu.config.model_len}]}
    )


async def _tokenize(request: web.Request) -> web.Response:
    emu = request.app[EMULATOR_KEY]
    try:
        body = await request.json()
        if not isinstance(body, dict):
            raise InvalidArgument("the request body must be a JSON object")
        chat = "messages" in body
        words = (
            [w for m in body["messages"] for w in str(m.get("content", "")).split()]
            if chat else str(body.get("prompt", "")).split()
        )
    except (json.JSONDecodeError, InvalidArgument, KeyError, TypeError, AttributeError) as exc:
        return _error(400, f"cannot tokenize: {exc}")
    # token ids: a stable small hash of each word, so equal words get equal ids
    tokens = [sum(w.encode()) % 32000 + 1 for w in words]
    return web.json_response({"count": len(tokens), "max_model_len": emu.config.model_len, "tokens": tokens})


async def _metrics(request: web.Request) -> web.Response:
    emu = request.app[EMULATOR_KEY]
    return web.Response(body=generate_latest(emu.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="")


def build_app(config: EmulatorConfig) -> web.Application:
    """The aiohttp application; the engine loop starts and stops with it."""
    app = web.Application()
    app[EMULATOR_KEY] = Emulator(config)

    async def engine(app: web.Application) -> Any:
        task = asyncio.create_task(app[EMULATOR_KEY].run())
        yield
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    app.cleanup_ctx.append(engine)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/tokenize", _tokenize)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/health", _health)
    return app


class ServerHandle:
    """A server running in a background thread (tests, rehearsals): ``url``, ``emulator``
    (``None`` for an app that is not an emulator), ``stop()``."""

    def __init__(self, app: web.Application, host: str, port: int) -> None:
        import threading

        self.app = app
        self.emulator: Emulator | None = app.get(EMULATOR_KEY)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.port = 0
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, args=(host, port), daemon=True, name="kvstab-serve")
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error
        self.url = f"http://{host}:{self.port}"

    def _main(self, host: str, port: int) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve(host, port))

    async def _serve(self, host: str, port: int) -> None:
        runner = web.AppRunner(self.app, access_log=None, handler_cancellation=True)
        try:
            await runner.setup()
            site = web.TCPSite(runner, host, port)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        except BaseException as exc:  # noqa: BLE001 - handed to the starting thread
            self._error = exc
            self._ready.set()
            return
        self._stop = asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def stop(self) -> None:
        """Stop the server and wait for its thread."""
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def start_in_thread(config: EmulatorConfig, host: str = "127.0.0.1", port: int = 0) -> ServerHandle:
    """Serve ``config`` on ``host:port`` (port 0: any free port) in a daemon thread."""
    return ServerHandle(build_app(config), host, port)
