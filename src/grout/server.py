"""`grout serve`: an OpenAI-compatible HTTP server for one grout engine.

Endpoints: ``GET /health``, ``GET /v1/models``, ``GET /v1/models/{id}``,
``POST /v1/completions`` and ``POST /v1/chat/completions`` (``"stream": true`` answers with
server-sent events in the chunk format of the ``openai`` client).

The stack is Starlette on uvicorn. Request bodies are validated by hand (grout.protocol), so
errors come out as OpenAI-shaped 400s, not a framework's 422s, and the server needs neither
FastAPI nor pydantic. Requests are served one at a time, in the order their prompts are
tokenized and checked (grout.scheduler: in arrival order, but for a prompt that takes long to
tokenize); the port opens at once, ``/health`` answers 503 while the engine loads and
captures its decode graph and 200 after, and the server exits with status 1 if loading fails.
A request body over ``max_request_bytes`` is refused (413) before it is parsed.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from grout.auth import RequireAPIKey
from grout.protocol import SEED_RANGE, APIError, GenerationRequest, cut, internal_error, \
    parse_chat_request, parse_completion_request, shown
from grout.responses import ChunkWriter, full_body
from grout.scheduler import Delta, Failed, Finished, Job, Scheduler
from grout.serving import FAULT_HEADER, generate, max_model_len, prepare, warm_up

log = logging.getLogger("grout.server")

# The largest request body accepted: a full context of the largest Qwen3 (40960 tokens),
# as text or as token ids, is well under a megabyte, even with every character escaped.
MAX_REQUEST_BYTES = 4 << 20


@dataclass
class ServerState:
    """What every handler needs: the scheduler, the served name, options."""

    scheduler: Scheduler
    model_name: str
    fault_injection: bool
    max_request_bytes: int = MAX_REQUEST_BYTES
    seeds: random.Random | None = None  # draws the seed of each request that sends none
    generation_config: bool = True      # requests default to generation_config.json's sampling
    sampling_defaults: dict[str, Any] = field(default_factory=dict)   # known once loaded
    load_error: BaseException | None = None


def error_response(err: APIError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


def create_app(load: Callable[[], Any], model_name: str, *, fault_injection: bool = False,
               on_load_failure: Callable[[BaseException], None] | None = None,
               max_request_bytes: int = MAX_REQUEST_BYTES,
               default_seed: int | None = None, generation_config: bool = True,
               allowed_origins: tuple[str, ...] = (), api_keys: tuple[str, ...] = ()
               ) -> Starlette:
    """The ASGI app. ``load()`` runs on the engine thread at startup and returns the engine.
    ``default_seed``: seeds the generator that draws, in arrival order, the sampling seed of
    each request that sends no ``seed`` (as vLLM's ``--seed``): a server started with the same
    one gives the same samples to the same sequence of requests, and requests still differ.
    None: a fresh seed each request.
    ``generation_config``: a request that leaves temperature, top_p or top_k out takes the
    checkpoint's generation_config.json value (as vLLM does), else the OpenAI default.
    ``allowed_origins``: the web origins (``"*"``: any) whose browser pages may call the API
    (CORS); none by default, so a page from another origin cannot read the answers.
    ``api_keys``: if any, a ``/v1`` request must carry one (``auth.py``).

    ``fault_injection`` (tests only) honours the ``X-Grout-Fault`` request header, which makes
    that request's generation raise after the given number of tokens.
    """
    # (Random seeds from an int's absolute value: S and -S would give the same draws)
    seeds = None if default_seed is None else \
        random.Random(default_seed.to_bytes(8, "little", signed=True))
    state = ServerState(Scheduler(load, generate), model_name, fault_injection,
                        max_request_bytes, seeds, generation_config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async def start() -> None:
            try:
                await state.scheduler.start()
                if generation_config:
                    state.sampling_defaults = dict(
                        state.scheduler.engine.config.sampling_defaults)
                if state.sampling_defaults:
                    log.info("requests that leave them out sample with generation_config.json's "
                             "%s (--generation-config none: the OpenAI defaults)",
                             ", ".join(f"{k}={v}" for k, v in state.sampling_defaults.items()))
                log.info("ready: serving %r", model_name)
            except Exception as err:
                state.load_error = err
                log.error("loading %r failed: %s: %s", model_name, type(err).__name__, err)
                if on_load_failure is not None:
                    on_load_failure(err)
        task = asyncio.create_task(start(), name="grout-load")
        yield
        task.cancel()
        state.scheduler.cancel_all()

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        # OpenAI's API gives an unknown route ("Invalid URL") the type of any bad request; an
        # unknown model differs from it by its code, model_not_found.
        # The path is the client's (up to the HTTP parser's limit of tens of kilobytes).
        path = cut(request.url.path, 200)
        return error_response(APIError(f"{request.method} {path}: {exc.detail}",
                                       status=exc.status_code, type="invalid_request_error"),
                              exc.headers)

    async def server_error(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        return error_response(internal_error(f"{type(exc).__name__}: {exc}"))

    routes = [
        Route("/health", partial(_health, state), methods=["GET"]),
        Route("/v1/models", partial(_models, state), methods=["GET"]),
        Route("/v1/models/{model_id:path}", partial(_model, state), methods=["GET"]),
        Route("/v1/completions", partial(_generation, state, parse_completion_request),
              methods=["POST"]),
        Route("/v1/chat/completions", partial(_generation, state, parse_chat_request),
              methods=["POST"]),
    ]
    middleware = [Middleware(CORSMiddleware, allow_origins=list(allowed_origins),
                             allow_methods=["GET", "POST"], allow_headers=["*"])
                  ] if allowed_origins else []
    if api_keys:                 # inside CORS: its preflights and headers apply to a 401 too
        middleware.append(Middleware(RequireAPIKey, keys=tuple(api_keys)))
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware,
                    exception_handlers={HTTPException: http_error, Exception: server_error})
    app.state.grout = state
    return app


async def _health(state: ServerState, request: Request) -> Response:
    if state.scheduler.ready.is_set():
        return JSONResponse({"status": "ok", "model": state.model_name})
    status = "failed" if state.load_error is not None else "loading"
    return JSONResponse({"status": status}, status_code=503)


def _model_card(state: ServerState) -> dict[str, Any]:
    card: dict[str, Any] = {"id": state.model_name, "object": "model", "created": 0,
                            "owned_by": "grout"}
    if state.scheduler.ready.is_set():
        card["max_model_len"] = max_model_len(state.scheduler.engine)
    return card


async def _models(state: ServerState, request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [_model_card(state)]})


async def _model(state: ServerState, request: Request) -> Response:
    model_id = request.path_params["model_id"]
    if model_id != state.model_name:
        # OpenAI's own answer for an unknown model, here as in a generation request.
        return error_response(APIError(f"the model {shown(model_id)} does not exist",
                                       status=404, param="model", code="model_not_found"))
    return JSONResponse(_model_card(state))


async def _read_json(request: Request, limit: int) -> Any:
    """The decoded body, or APIError: 413 past ``limit`` bytes (before reading more of it),
    400 for anything Python's json cannot decode."""
    too_large = APIError(f"the request body is larger than this server's limit of {limit} "
                         f"bytes (grout serve --max-request-bytes)", status=413,
                         code="request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and (len(declared) > 18 or
                                                      int(declared) > limit):
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise APIError(f"the request body is not valid JSON: {err}") from None
    except RecursionError:
        raise APIError("the request body is nested too deeply to decode") from None
    except ValueError:      # an integer of more digits than int() converts
        raise APIError(f"the request body holds an integer of more than "
                       f"{sys.get_int_max_str_digits()} digits") from None


async def _wait_for_disconnect(request: Request, job: Job) -> None:
    """Cancel ``job`` when the client closes its connection."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel()
            return


def _fault_after(state: ServerState, request: Request) -> int | None:
    value = request.headers.get(FAULT_HEADER)
    if value is None or not state.fault_injection:
        return None
    try:
        return int(value)
    except ValueError:
        raise APIError(f"the {FAULT_HEADER} header must be an integer") from None


async def _generation(state: ServerState, parse: Callable[[Any, str], GenerationRequest],
                      request: Request) -> Response | EventStream:
    try:      # a graceful stop that timed out (a long prefill) answers as a cancelled job
        return await _answer(state, parse, request)
    except asyncio.CancelledError:
        if state.scheduler.stopping is None:
            raise
        return error_response(state.scheduler.stopping)


async def _answer(state: ServerState, parse: Callable[[Any, str], GenerationRequest],
                  request: Request) -> Response | EventStream:
    if not state.scheduler.ready.is_set():
        return error_response(APIError("the model is still loading; retry when /health says ok",
                                       status=503, type="service_unavailable"))
    try:
        req = parse(await _read_json(request, state.max_request_bytes), state.model_name)
        fault_after = _fault_after(state, request)
        if req.seed is None and state.seeds is not None:
            req.seed = state.seeds.randrange(SEED_RANGE[1] + 1)
        for key, value in state.sampling_defaults.items():
            if key not in req.sampling_sent:
                setattr(req, key, value)
    except APIError as err:
        return error_response(err)
    except ClientDisconnect:
        log.info("a client went away while sending its request")
        return Response(status_code=499)
    loop = asyncio.get_running_loop()
    job = Job(req, loop)
    job.fault_after = fault_after
    # The prompt is tokenized and checked beside the engine thread, and only then does the
    # job join the queue: a prompt too long for the context is refused without waiting in
    # line, and one that takes seconds to tokenize holds up no request behind it.
    try:
        await loop.run_in_executor(None, prepare, state.scheduler.engine, job)
    except APIError as err:
        return error_response(err)
    state.scheduler.submit(job)
    watcher: asyncio.Task[None] | None = asyncio.create_task(_wait_for_disconnect(request, job))
    try:
        first = await _next_event(job, watcher)
        if first is None:
            return Response(status_code=499)
        if isinstance(first, Failed):
            return error_response(first.error)
        if req.stream:
            owned, watcher = watcher, None   # the response cancels the watcher when done

            def close() -> None:
                job.cancel()
                owned.cancel()
            return EventStream(_stream(job, ChunkWriter(job, state.model_name), first), close)
        return await _collect(state, job, watcher, first)
    finally:
        if watcher is not None:
            watcher.cancel()


async def _next_event(job: Job, watcher: asyncio.Task[None]) -> Any:
    """The job's next event, or None when the client disconnected first."""
    getter = asyncio.ensure_future(job.events.get())
    done, _ = await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if getter in done:
        return getter.result()
    getter.cancel()
    return None


async def _collect(state: ServerState, job: Job, watcher: asyncio.Task[None],
                   event: Any) -> Response:
    texts: list[str] = []
    entries: list[dict[str, Any]] = []
    while isinstance(event, Delta):
        texts.append(event.text)
        entries.extend(event.logprobs)
        event = await _next_event(job, watcher)
        if event is None:
            return Response(status_code=499)
    if isinstance(event, Failed):
        return error_response(event.error)
    assert isinstance(event, Finished)
    texts.append(event.text)
    entries.extend(event.logprobs)
    return JSONResponse(full_body(job, state.model_name, "".join(texts), entries, event))


async def _stream(job: Job, writer: ChunkWriter, event: Any) -> AsyncIterator[bytes]:
    for chunk in writer.opening():
        yield chunk
    while True:
        if isinstance(event, Delta):
            delta = writer.delta(event)
            if delta is not None:
                yield delta
        elif isinstance(event, Finished):
            for chunk in writer.closing(event):
                yield chunk
            return
        else:
            for chunk in writer.failure(event.error):
                yield chunk
            return
        event = await job.events.get()


class EventStream:
    """A text/event-stream response; ``on_close`` runs however the stream ends."""

    def __init__(self, chunks: AsyncIterator[bytes], on_close: Callable[[], Any]) -> None:
        self.chunks = chunks
        self.on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"text/event-stream; charset=utf-8"),
                   (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            async for chunk in self.chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self.on_close()


class _Server(uvicorn.Server):
    """uvicorn's server; on SIGINT or SIGTERM every generation ends (within its decode chunk
    in flight) with a "shutting down" error, so that open streams close before the graceful
    timeout."""

    def __init__(self, config: uvicorn.Config, scheduler: Scheduler) -> None:
        super().__init__(config)
        self.scheduler = scheduler
        self.signal: int | None = None       # the first signal that asked it to stop

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.signal = sig if self.signal is None else self.signal
        super().handle_exit(sig, frame)
        # A signal handler runs between two bytecodes of the loop's thread: defer the
        # cancellation to the loop itself.
        asyncio.get_event_loop().call_soon_threadsafe(self.scheduler.cancel_all)


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (uvicorn's way: IPv6 when the host has a colon);
    OSError when the address is taken or not this machine's."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def _exit_while_loading(status: int) -> None:
    """End the process now, though the engine thread is still loading."""
    # Loading cannot be interrupted, and the interpreter joins the engine thread at exit: a
    # normal exit would wait for the load (minutes for a large model) after Ctrl-C.
    log.info("interrupted while loading")
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def serve(load: Callable[[], Any], model_name: str, *, host: str = "127.0.0.1",
          port: int = 8000, log_level: str = "info", fault_injection: bool = False,
          max_request_bytes: int = MAX_REQUEST_BYTES, default_seed: int | None = None,
          generation_config: bool = True, allowed_origins: tuple[str, ...] = (),
          api_keys: tuple[str, ...] = ()) -> int:
    """Serve the engine ``load()`` returns (loaded and warmed up on the engine thread) until
    interrupted; returns the process exit status (1 when the address cannot be listened on,
    checked before loading starts, or when loading fails; Ctrl-C while loading ends the
    process at once with 130, and after it the graceful stop returns 130; after SIGTERM's
    graceful stop uvicorn ends the process by that signal).
    ``default_seed``, ``generation_config``, ``allowed_origins``, ``api_keys``: as
    :func:`create_app`."""
    try:
        sock = listen(host, port)
    except OSError as err:
        print(f"grout serve: cannot listen on {host}:{port}: {err}", file=sys.stderr)
        return 1
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    failed: list[BaseException] = []
    server: uvicorn.Server | None = None

    def on_load_failure(err: BaseException) -> None:
        failed.append(err)
        if server is not None:
            server.should_exit = True

    app = create_app(lambda: warm_up(load()), model_name, fault_injection=fault_injection,
                     on_load_failure=on_load_failure, max_request_bytes=max_request_bytes,
                     default_seed=default_seed, generation_config=generation_config,
                     allowed_origins=allowed_origins, api_keys=api_keys)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=5)
    server = _Server(config, app.state.grout.scheduler)
    started = time.monotonic()
    log.info("listening on http://%s:%d (%s)", f"[{host}]" if ":" in host else host,
             sock.getsockname()[1],
             "/v1 requests need an API key" if api_keys else "no API key needed")
    try:
        server.run(sockets=[sock])
        # uvicorn re-raises the SIGINT it caught; one inherited ignored raises nothing
        interrupted = server.signal == signal.SIGINT
    except KeyboardInterrupt:
        interrupted = True
    if interrupted and not app.state.grout.scheduler.ready.is_set():
        _exit_while_loading(130)
    if failed:
        err = failed[0]
        print(f"grout serve: could not load {model_name!r}: {type(err).__name__}: {err}",
              file=sys.stderr)
        return 1
    log.info("stopped after %.0f s", time.monotonic() - started)
    return 128 + signal.SIGINT if interrupted else 0
