"""Memory: a KV cache costs RAM for the tokens it holds, not for the length it is sized to (its
pages are mapped zeroed and become resident on first write), and dropping a decoder gives its memory
back. Measured in a fresh interpreter, where nothing else allocates or frees meanwhile."""

import json
import os
import subprocess
import sys

CHILD = r"""
import gc, json, os, torch
from helpers import tiny_llama
from kwker.hf import KwkDecoder

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

model = tiny_llama(layers=4, heads=4, kv_heads=4, hidden=256, max_pos=65536)
prompt = torch.arange(1, 41).unsqueeze(0)
small = KwkDecoder(model, max_cache_len=128, precision="int4", kv_cache="fp32").generate(prompt, max_new_tokens=24)
gc.collect()
r = {"before": rss_mb()}
dec = KwkDecoder(model, max_cache_len=65536, precision="int4", kv_cache="fp32")
r["built"] = rss_mb()
out = dec.generate(prompt, max_new_tokens=24)
r["generated"] = rss_mb()
r["same"] = bool(torch.equal(out, small))
del dec
gc.collect()
r["dropped"] = rss_mb()
print(json.dumps(r))
"""


def test_kv_cache_is_resident_only_where_written():
    # 4 layers x (k + v) x 4 KV heads x 64 dims x 65536 positions x 4 bytes = 512 MiB of cache,
    # sized; the rest of the decoder (rope tables for 65536 positions, weights, scratch) and
    # Python's transients take ~55 MB
    kv_mb = 4 * 2 * 4 * 64 * 65536 * 4 / 2**20
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [os.path.dirname(os.path.dirname(__file__)), os.environ.get("PYTHONPATH", "")]
        ),
    )
    run = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=300
    )
    assert run.returncode == 0, run.stderr
    r = json.loads(run.stdout.strip().splitlines()[-1])
    assert r["built"] - r["before"] < kv_mb / 4, r
    assert r["generated"] - r["before"] < kv_mb / 4, r
    assert r["dropped"] - r["before"] < kv_mb / 4, r
    # the untouched cache reads as zeros: the same tokens as a decoder sized just for this text
    assert r["same"]


HUGE_CHILD = r"""
import gc, json, torch
from helpers import tiny_llama
from kwker.hf import KwkDecoder

def advised_kb():  # sizes of the mappings advised for transparent huge pages (VmFlags "hg")
    total, size = 0, 0
    with open("/proc/self/smaps") as f:
        for line in f:
            if line.startswith("Size:"):
                size = int(line.split()[1])
            elif line.startswith("VmFlags:") and " hg" in line:
                total += size
    return total

model = tiny_llama(layers=4, heads=4, kv_heads=4, hidden=256, max_pos=4096)
r = {"before": advised_kb()}
dec = KwkDecoder(model, max_cache_len=256, precision="int4")
r["built"] = advised_kb()
r["weight_kb"] = dec.weight_bytes_per_token / 1024
del dec
gc.collect()
r["dropped"] = advised_kb()
print(json.dumps(r))
"""


def test_packed_weights_are_advised_for_huge_pages():
    # every step streams all the weights: they live in 2 MB-aligned mappings advised MADV_HUGEPAGE
    # (fewer TLB misses), which go away with the decoder
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [os.path.dirname(os.path.dirname(__file__)), os.environ.get("PYTHONPATH", "")]
        ),
    )
    run = subprocess.run(
        [sys.executable, "-c", HUGE_CHILD], capture_output=True, text=True, env=env, timeout=300
    )
    assert run.returncode == 0, run.stderr
    r = json.loads(run.stdout.strip().splitlines()[-1])
    assert r["built"] - r["before"] >= r["weight_kb"] > 0, r
    assert r["dropped"] == r["before"], r
