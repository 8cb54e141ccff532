"""The serving engine: requests submitted from any thread join the running batch at the next step
(continuous batching), stream their tokens back, can be cancelled (a cancelled request leaves the
batch before the next step), and are refused when the queue is full. A request whose own step
fails ends with its error; the others go on (see Scheduler.step).

Nothing here knows HTTP: kwker.serve.routes puts the OpenAI API on top, kwker.serve.metrics reads
the engine's figures through an observer."""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable

from kwker.scheduler import DEFAULT_PREFILL_CHUNK, Scheduler
from kwker.sequence import SequenceState
from kwker.speculative import StepCosts, SuffixCache

END = None  # the item that ends a request's stream (after an error item, if it failed)


class QueueFull(RuntimeError):
    pass


class Request:
    """A submitted generation. Without a sink, iterate it for its GenerationChunks (ends after the
    last one; raises the error of a failed request). With a sink, the engine's thread calls
    sink(item) for each chunk, then with the exception if it failed, then with END; the sink must
    not block (kwker.serve.responses.Pending hands the items to its event loop). cancel() from
    anywhere."""

    def __init__(self, seq: SequenceState, sink: Callable[[object], None] | None = None):
        self.seq = seq
        self._chunks: queue.SimpleQueue = queue.SimpleQueue()
        self._sink = sink or self._chunks.put
        self._cancel = threading.Event()
        self.submitted_at = time.perf_counter()
        self.finish_reason: str | None = None  # the sequence's, once ended; "cancelled" too
        self.error: BaseException | None = None

    def __iter__(self):
        while True:
            item = self._chunks.get()
            if item is END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def tokens(self) -> list[int]:
        """Waits for the end and returns the new tokens."""
        return [c.token for c in self]

    def _put(self, item) -> None:
        try:
            self._sink(item)
        except RuntimeError:  # the consumer's event loop is closed: nobody is listening
            self.cancel()


class ServingObserver:
    """What the engine reports as it runs (kwker.serve.metrics turns it into Prometheus
    figures). Called on the engine's thread: keep it cheap. The base class ignores it all."""

    def step(self, seconds: float, sequences: int) -> None:
        """One scheduler round took `seconds` for `sequences` active sequences."""

    def ended(self, req: Request) -> None:
        """A request ended (finished, cancelled or failed); req.seq.stats has its figures."""


class ServingEngine:
    def __init__(
        self,
        decoder,
        tokenizer=None,
        max_queue: int = 64,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        observer: ServingObserver | None = None,
        max_active: int | None = None,
        shared_lookup: bool = True,
    ):
        """max_active: requests decoded at once (default: one per decoder slot). A decoder with
        more slots keeps the rest as a prompt cache: a request takes the free slot whose cache
        shares the longest prefix with its prompt, of its own tenant (see submit).
        shared_lookup: whether prompt lookup also copies from the tenant's earlier requests
        (False: from the request's own text only)."""
        self.decoder = decoder
        self.tokenizer = tokenizer
        self.max_queue = max_queue
        self.prefill_chunk = prefill_chunk
        self.observer = observer or ServingObserver()
        self.max_active = min(max_active or decoder.runner.n_slots, decoder.runner.n_slots)
        # per tenant, every ended request's text (prompt and answer): prompt lookup copies from
        # the tenant's earlier requests too (SuffixDecoding), never from another's; read and
        # written on the engine's thread only
        self.shared_lookup = shared_lookup
        self.corpora: dict[object, SuffixCache] = {}
        # per tenant, what speculation measured (step costs, the draft's), shared by its requests
        # as the solo generations of a decoder share theirs: each request would otherwise learn
        # them again. Per tenant: which widths were timed follows what was proposed, so shared
        # records would tell one key a little of another's text.
        self.costs: dict[object, StepCosts] = {}
        self._waiting: deque[Request] = deque()
        self._active: dict[int, Request] = {}  # id(seq) -> its request, for the admitted ones
        self._wake = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    @property
    def waiting(self) -> int:
        """Requests queued, not yet in the batch."""
        return len(self._waiting)

    @property
    def active(self) -> int:
        """Requests in the batch: each holds one of the decoder's slots."""
        return len(self._active)

    def start(self) -> None:
        if self._thread is None:
            self._stop = False
            self._thread = threading.Thread(target=self._loop, name="kwker-serve", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _corpus(self, tenant) -> SuffixCache:
        return self.corpora.setdefault(tenant, SuffixCache())

    def submit(
        self, prompt, max_new_tokens: int = 128, sink=None, tenant=None, **options
    ) -> Request:
        """Queues a request (token ids) and returns its handle; bad options raise here, in the
        caller's thread. sink: see Request. tenant: whose request it is (a server's API key):
        its prompt cache and lookup corpus are its tenant's alone."""
        ids = self.decoder.token_ids(prompt)
        seq = self.decoder.new_sequence(
            ids,
            max_new_tokens,
            tokenizer=self.tokenizer,
            corpus=self._corpus(tenant) if self.shared_lookup else None,
            costs=self.costs.setdefault(tenant, StepCosts()),
            **options,
        )
        seq.tenant = tenant
        req = Request(seq, sink)
        with self._wake:
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(
                    f"the queue is full ({self.max_queue} requests waiting); try again later"
                )
            self._waiting.append(req)
            self._wake.notify_all()
        return req

    def _loop(self) -> None:
        """Waits for requests; while any are active, holds the decoder (direct calls on it wait)
        and steps them."""
        scheduler = Scheduler(self.decoder.runner, self.prefill_chunk)
        try:
            while self._wait_for_work():
                with self.decoder.runner.hold():
                    try:
                        self._serve_until_idle(scheduler)
                    except Exception as e:  # noqa: BLE001  (a fault outside any one sequence)
                        for key in list(self._active):
                            self._end(self._active.pop(key), e)
                    finally:
                        scheduler.close()  # stopped or failed with requests running: free slots
        finally:
            with self._wake:
                left = list(self._active.values()) + list(self._waiting)
                self._active.clear()
                self._waiting.clear()
            for req in left:
                req.seq.cancel()
                self._end(req)

    def _wait_for_work(self) -> bool:
        """Blocks until a request waits (True) or the engine stops (False)."""
        with self._wake:
            while not self._stop and not self._waiting:
                self._wake.wait()
            return not self._stop

    def _serve_until_idle(self, scheduler: Scheduler) -> None:
        """Admit, step, retire, until no request is active or waiting, or the engine stops."""
        while True:
            with self._wake:
                if self._stop:
                    return
                while (
                    self._waiting
                    and len(scheduler.active) < self.max_active
                    and (scheduler.has_room or not scheduler.active)
                ):
                    req = self._waiting.popleft()
                    if req.cancelled:  # gone before it started
                        req.seq.cancel()
                        self._end(req)
                        continue
                    slot = self.decoder.runner.best_free_slot(req.seq.prompt, req.seq.tenant)
                    try:
                        scheduler.admit(req.seq, slot)
                    except RuntimeError as e:  # no slot at all: they are held elsewhere
                        self._end(req, e)
                        continue
                    self._active[id(req.seq)] = req
                scheduler.waiting = len(self._waiting)
            # a request cancelled during the last step leaves before the next one
            for req in [r for r in self._active.values() if r.cancelled]:
                req.seq.cancel()
                scheduler.retire(req.seq)
                self._end(self._active.pop(id(req.seq)))
            if not scheduler.active:
                return
            t0 = time.perf_counter()
            results = scheduler.step()
            self.observer.step(time.perf_counter() - t0, len(results))
            for seq, chunks in results:
                req = self._active[id(seq)]
                for c in chunks:
                    req._put(c)
                if seq.done:  # the scheduler retired it (finished or failed)
                    self._end(self._active.pop(id(seq)), seq.error)

    def _end(self, req: Request, error: BaseException | None = None) -> None:
        """Ends a request's stream (after the error, if any)."""
        req.finish_reason = req.seq.finish_reason
        req.error = error
        if error is None and req.seq.new_tokens and self.shared_lookup:
            self._corpus(req.seq.tenant).add(req.seq.tokens)  # its verified text
        if error is not None:
            req._put(error)
        req._put(END)
        self.observer.ended(req)
