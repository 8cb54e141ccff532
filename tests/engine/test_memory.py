"""Memory: a KV cache costs RAM for the tokens it holds, not for the length it is sized to (its pages are mapped
zeroed and become resident on first write), and dropping a decoder gives its memory back."""

import gc
import os

import torch

from helpers import tiny_llama
from kwker.decode import KwkDecoder


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_kv_cache_is_resident_only_where_written():
    # 4 layers x (k + v) x 2 KV heads x 64 dims x 65536 positions x 4 bytes = 256 MiB of cache, sized
    model = tiny_llama(layers=4, heads=4, kv_heads=2, hidden=256, max_pos=65536)
    kv_mb = 4 * 2 * 2 * 64 * 65536 * 4 / 2**20
    gc.collect()
    before = rss_mb()
    dec = KwkDecoder(model, max_cache_len=65536, precision="int4")
    built = rss_mb()
    assert built - before < kv_mb / 8, (before, built)
    out = dec.generate(torch.arange(1, 41).unsqueeze(0), max_new_tokens=24, lookup=0)
    # the same tokens as a decoder sized just for this text: the untouched cache reads as zeros, as before
    small = KwkDecoder(model, max_cache_len=128, precision="int4").generate(torch.arange(1, 41).unsqueeze(0),
                                                                           max_new_tokens=24, lookup=0)
    assert torch.equal(out, small)
    assert rss_mb() - before < kv_mb / 8
    del dec
    gc.collect()
    assert rss_mb() - before < kv_mb / 8
