"""A bounded load test of `kwker serve` on the real SmolLM2-135M (int4), loopback only: 200
requests from 32 client threads, a third of them going away early at random, and one client that
never reads its stream. Every answer that completes equals its solo answer, no slot is left taken,
and the latencies are printed (run with -s to see them)."""

import json
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from serving import metrics, never_reading_client, running, wait_idle

from kwker.sampling import SeededGenerator
from kwker.serve import ServingEngine, create_app

N_REQUESTS, N_CLIENTS, N_PROMPTS, MAX_NEW = 200, 32, 40, 24
TOPICS = ["rivers", "owls", "bread", "trains", "the moon", "chess", "rain", "glass"]


@pytest.fixture(scope="module")
def decoder():
    from kwker.models.loader import load_decoder

    return load_decoder(None, precision="int4", max_batch=8, max_cache_len=1024)


def prompt_ids(tokenizer, p: int) -> list[int]:
    topic = TOPICS[p % len(TOPICS)]
    messages = [{"role": "user", "content": f"Tell me fact number {p} about {topic}."}]
    return list(
        tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
    )


@pytest.mark.slow
def test_200_requests_from_32_clients_a_third_going_away(decoder):
    tok = decoder.tokenizer
    eos = set(decoder._eos_ids(None))
    # the solo answers, before the server starts: greedy, and seeded (seed 1000 + p), MAX_NEW
    # tokens; a shorter request's answer is their start (one draw per position)
    solo = {}
    for p in range(N_PROMPTS):
        ids = prompt_ids(tok, p)
        solo[p, "greedy"] = [c.token for c in decoder.stream_generate(ids, MAX_NEW)]
        sampled = decoder.stream_generate(
            ids, MAX_NEW, do_sample=True, temperature=0.7, generator=SeededGenerator(1000 + p)
        )
        solo[p, "seeded"] = [c.token for c in sampled]

    def expected(p, mode, n):
        tokens = solo[p, mode][:n]
        return tok.decode(tokens, skip_special_tokens=True), (
            "stop" if tokens[-1] in eos else "length"
        )

    rng = random.Random(20261201)
    plan = []  # (prompt, mode, max_tokens, how: "leave" after k pieces, "stream", "whole")
    for i in range(N_REQUESTS):
        how = ("leave", rng.randint(1, 4)) if i % 3 == 0 else (rng.choice(["stream", "whole"]), 0)
        plan.append((i % N_PROMPTS, rng.choice(["greedy", "seeded"]), rng.randint(4, MAX_NEW), how))
    rng.shuffle(plan)

    engine = ServingEngine(decoder, tok, max_queue=64)
    with engine, running(create_app(engine, "smol")) as url:
        lazy = never_reading_client(
            url, {"model": "smol", "prompt": "Count: 1, 2,", "max_tokens": 900, "temperature": 0}
        )

        def ask(item):
            p, mode, n, (how, leave_after) = item
            body = {"model": "smol", "messages": [{"role": "user", "content": (
                f"Tell me fact number {p} about {TOPICS[p % len(TOPICS)]}.")}],
                "max_tokens": n, "temperature": 0}  # fmt: skip
            if mode == "seeded":
                body |= {"temperature": 0.7, "seed": 1000 + p}
            t0 = time.perf_counter()
            if how == "whole":
                r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
                assert r.status_code == 200, r.text
                choice = r.json()["choices"][0]
                return item, choice["message"]["content"], choice["finish_reason"], t0
            body["stream"] = True
            text, finish = [], None
            with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    choice = json.loads(line[6:])["choices"][0]
                    text.append(choice["delta"].get("content", ""))
                    finish = choice["finish_reason"] or finish
                    if how == "leave" and len(text) > leave_after:
                        return item, None, "left", t0  # closes the connection mid-answer
            return item, "".join(text), finish, t0

        with ThreadPoolExecutor(N_CLIENTS) as pool:
            futures = [pool.submit(ask, item) for item in plan]
            results = [(f.result(), time.perf_counter()) for f in futures]
        lazy.close()
        wait_idle(engine, timeout=60)
        after = metrics(url)

    latencies = []
    for ((p, mode, n, how), text, finish, t0), t1 in results:
        if finish == "left":
            continue
        latencies.append(t1 - t0)
        assert (text, finish) == expected(p, mode, n), (p, mode, n, how)
    assert len(latencies) >= N_REQUESTS // 2
    assert after[("kwker_active_slots",)] == 0 and after[("kwker_queue_depth",)] == 0
    ok = sum(
        v for k, v in after.items() if k[0] == "kwker_requests_total" and ("status", "200") in k
    )
    assert ok == N_REQUESTS + 1  # and the lazy client's
    cuts = after.get(("kwker_requests_ended_total", ("reason", "cancelled")), 0)
    q = statistics.quantiles(latencies, n=100)
    print(
        f"\n{len(latencies)} answers completed, {cuts:.0f} generations cancelled; latency "
        f"p50 {statistics.median(latencies):.2f} s, p99 {q[98]:.2f} s"
    )
