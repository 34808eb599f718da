"""The server's request queue: one engine thread, one request at a time, in queue order.

Loading, warm-up and every generation run on a single worker thread, so the asyncio event
loop never blocks on the engine and the engine never sees two requests at once. The loop
enqueues a `Job` once its request's prompt is tokenized and checked (beside the worker);
the worker takes jobs in that order. The worker hands results back to the loop with
``call_soon_threadsafe`` and never waits for the loop, so streaming costs the engine no
round trip per token. A job is cancelled (its client went away, or the server is stopping)
by a flag that the worker checks after each token it hands over: a cancelled generation
starts no further chunk of decode steps, so it stops within the chunk in flight (at most
the engine's ``decode_chunk`` tokens).
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from grout.protocol import APIError, GenerationRequest, client_closed, internal_error

log = logging.getLogger("grout.server")


@dataclass
class Delta:
    """Text released by one decode step, with the logprob entries of its tokens."""

    text: str
    logprobs: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Finished:
    """The end of a generation: why it ended, the last held-back text, exact token counts."""

    finish_reason: str
    text: str
    logprobs: list[dict[str, Any]]
    prompt_tokens: int
    completion_tokens: int


@dataclass
class Failed:
    """The request failed; ``error`` says how (and carries the HTTP status)."""

    error: APIError


Event = Delta | Finished | Failed


class Job:
    """One request's life in the queue: its prompt, its events, its cancellation flag."""

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> None:
        self.request = request
        prefix = "chatcmpl" if request.kind == "chat" else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.queued_at = time.monotonic()   # when it joined the queue (Scheduler.submit)
        self.prompt_ids: list[int] | None = None
        self.max_new_tokens = 0
        self.fault_after: int | None = None                 # tests: fail after this many tokens
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.generated = 0          # tokens handed over so far (written by the engine thread)
        self.decoded = 0            # tokens the engine decoded, a chunk's not yet handed over too
        self.first_token_at = 0.0   # perf_counter() when the first and the latest token came
        self.last_token_at = 0.0
        self.finished = False       # its terminal event (Finished or Failed) is out
        self._loop = loop
        self._cancelled = threading.Event()
        self.cancel_reason = client_closed()   # the error a cancelled job ends with
        self._decoded_at_cancel: int | None = None

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self, reason: APIError | None = None) -> None:
        """Stop before the next decode step (or never start); ``reason`` is the error the
        job then ends with (default: its client went away).

        A job whose last event is out already is not cancelled: it completed.
        """
        if not self.finished and not self._cancelled.is_set():
            if reason is not None:
                self.cancel_reason = reason
            self._decoded_at_cancel = self.decoded
            self._cancelled.set()

    def emit(self, event: Event) -> None:
        """Hand an event to the loop (callable from any thread; never blocks)."""
        if not isinstance(event, Delta):
            self.finished = True
        try:
            self._loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:    # the loop is closed: the server stopped, nobody listens
            pass

    @property
    def decoded_after_cancel(self) -> int | None:
        """Tokens decoded after the cancel: those of the chunk in flight when it came (at
        most ``decode_chunk``), since no chunk starts after it."""
        if self._decoded_at_cancel is None:
            return None
        return self.decoded - self._decoded_at_cancel


class Scheduler:
    """Runs ``load()`` and then every job on one engine thread, in the order submitted."""

    def __init__(self, load: Callable[[], Any], generate: Callable[[Any, Job], None]) -> None:
        self._load = load
        self._generate = generate
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grout-engine")
        self._queue: asyncio.Queue[Job] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.engine: Any = None
        self.ready = asyncio.Event()
        self.busy: Job | None = None
        self._stopping: APIError | None = None   # why new jobs are refused, once stopping

    async def start(self) -> None:
        """Load the engine on the engine thread, then start serving the queue."""
        loop = asyncio.get_running_loop()
        self.engine = await loop.run_in_executor(self._thread, self._load)
        self._task = asyncio.create_task(self._serve_forever(), name="grout-scheduler")
        self.ready.set()

    def submit(self, job: Job) -> None:
        """Queue a job behind every job submitted before it (a request is submitted once its
        prompt is tokenized and checked). Once the server stops, a job fails at once."""
        job.queued_at = time.monotonic()
        if self._stopping is not None:
            job.cancel(self._stopping)
            job.emit(Failed(self._stopping))
            return
        self._queue.put_nowait(job)

    @property
    def stopping(self) -> APIError | None:
        """The error of jobs cancelled because the server stops; None while it serves."""
        return self._stopping

    def cancel_all(self) -> None:
        """Cancel the running job and every queued one, and refuse later ones (a request
        still being tokenized submits afterwards): the server is stopping."""
        reason = APIError("the server is shutting down", status=503, type="service_unavailable")
        self._stopping = reason
        if self.busy is not None:
            self.busy.cancel(reason)
        while not self._queue.empty():
            job = self._queue.get_nowait()
            job.cancel(reason)
            job.emit(Failed(reason))

    async def _serve_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            job = await self._queue.get()
            if job.cancelled:
                log.info("%s: cancelled while queued (%s)", job.id, job.cancel_reason.message)
                job.emit(Failed(job.cancel_reason))
                continue
            self.busy = job
            try:
                await loop.run_in_executor(self._thread, self._run, job)
            finally:
                self.busy = None

    def _run(self, job: Job) -> None:
        """Engine thread: one whole generation; every failure becomes the job's `Failed`."""
        started = time.monotonic()
        try:
            self._generate(self.engine, job)
        except APIError as err:
            job.emit(Failed(err))
        except Exception as err:  # one request's failure must not take the server down
            log.error("%s failed:\n%s", job.id, traceback.format_exc())
            job.emit(Failed(internal_error(f"internal error while generating: "
                                           f"{type(err).__name__}: {err}")))
        timing = f"queued {(started - job.queued_at) * 1e3:.0f} ms, " \
                 f"ran {(time.monotonic() - started) * 1e3:.0f} ms"
        if job.generated > 1:
            rate = (job.generated - 1) / max(job.last_token_at - job.first_token_at, 1e-9)
            timing += f", decode {rate:.2f} tok/s"
        if job.cancelled:
            log.info("%s: cancelled (%s) after %d tokens (%d decoded, %d after the cancel); %s",
                     job.id, job.cancel_reason.message, job.generated, job.decoded,
                     job.decoded_after_cancel, timing)
        else:
            log.info("%s: %d tokens; %s", job.id, job.generated, timing)
