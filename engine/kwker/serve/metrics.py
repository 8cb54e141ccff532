"""`kwker serve`'s /metrics, in the Prometheus text format (prometheus-client), one registry per
app (two servers in one process do not share figures):

  kwker_requests_total{path,status}            every response, refusals included
  kwker_prompt_tokens_total                    prompt tokens of the requests that ended
  kwker_prompt_tokens_reused_total             of which the slot's cache already held
  kwker_generated_tokens_total                 new tokens
  kwker_requests_ended_total{reason}           stop, length, cancelled, error
  kwker_speculation_proposed_tokens_total{source}, kwker_speculation_accepted_tokens_total{source}
  kwker_queue_depth                            requests waiting for a slot
  kwker_active_slots                           requests in the batch (each holds a slot)
  kwker_step_seconds                           histogram: one scheduler round (all active sequences)
  kwker_time_to_first_token_seconds            histogram: from submission to the first token
  kwker_request_seconds                        histogram: from submission to the end
"""

from __future__ import annotations

import time

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE  # noqa: N811
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from kwker.serve.engine import Request, ServingEngine, ServingObserver

KNOWN_PATHS = (
    "/health",
    "/metrics",
    "/v1/models",
    "/v1/completions",
    "/v1/chat/completions",
)
# a step of a small model is a few ms; of a 1.5B at batch 8, ~100 ms
STEP_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
REQUEST_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

__all__ = ["CONTENT_TYPE", "Metrics"]

disable_created_metrics()  # the *_created series double the page and say when the server started


class Metrics(ServingObserver):
    def __init__(self, engine: ServingEngine):
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "kwker_requests", "HTTP responses by path and status", ["path", "status"], registry=r
        )
        self.prompt_tokens = Counter("kwker_prompt_tokens", "prompt tokens", registry=r)
        self.reused_tokens = Counter(
            "kwker_prompt_tokens_reused", "prompt tokens the cache already held", registry=r
        )
        self.generated = Counter("kwker_generated_tokens", "new tokens", registry=r)
        self.ended_requests = Counter(
            "kwker_requests_ended", "generations ended, by reason", ["reason"], registry=r
        )
        self.proposed = Counter(
            "kwker_speculation_proposed_tokens", "tokens proposed", ["source"], registry=r
        )
        self.accepted = Counter(
            "kwker_speculation_accepted_tokens", "proposed tokens accepted", ["source"], registry=r
        )
        queue = Gauge("kwker_queue_depth", "requests waiting for a slot", registry=r)
        queue.set_function(lambda: engine.waiting)
        slots = Gauge("kwker_active_slots", "requests in the batch", registry=r)
        slots.set_function(lambda: engine.active)
        self.steps = Histogram(
            "kwker_step_seconds", "one scheduler round", buckets=STEP_BUCKETS, registry=r
        )
        self.first_token = Histogram(
            "kwker_time_to_first_token_seconds",
            "submission to first token",
            buckets=REQUEST_BUCKETS,
            registry=r,
        )
        self.latency = Histogram(
            "kwker_request_seconds", "submission to end", buckets=REQUEST_BUCKETS, registry=r
        )
        engine.observer = self

    def response(self, path: str, status: int) -> None:
        self.requests.labels(path if path in KNOWN_PATHS else "other", str(status)).inc()

    def step(self, seconds: float, sequences: int) -> None:
        self.steps.observe(seconds)

    def ended(self, req: Request) -> None:
        s = req.seq.stats
        reason = {"eos": "stop", None: "error"}.get(req.finish_reason, req.finish_reason)
        self.ended_requests.labels(reason).inc()
        self.prompt_tokens.inc(s.prompt_tokens)
        self.reused_tokens.inc(s.reused_prompt_tokens)
        self.generated.inc(s.new_tokens)
        for source, n in s.proposed.items():
            self.proposed.labels(source).inc(n)
            self.accepted.labels(source).inc(s.accepted.get(source, 0))
        now = time.perf_counter()
        if s.new_tokens:
            self.first_token.observe(req.seq.first_token_at - req.submitted_at)
        self.latency.observe(now - req.submitted_at)

    def render(self) -> bytes:
        return generate_latest(self.registry)
