"""Hub repos of GGUF files (bartowski's, unsloth's, lmstudio-community's): the quants a repo
offers, the one a name picks, what each needs in memory, and downloading one.

A model in such a repo is named as llama.cpp's `-hf` names it, OWNER/REPO:QUANT
("bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M"); without ":QUANT" it is DEFAULT_QUANT if the repo
has it, else the quant nearest to it in bits per weight. A quant is one .gguf file, or the parts
of a split one (NAME-00001-of-00003.gguf ..., often in a folder of their own), which download
together and load as one model (kwker.loading.gguf_split).

What a quant needs in memory comes from its GGUF header, read over HTTP range requests (a few
MB: the metadata, vocabulary included, and the tensor table) without downloading the file.
"""

from __future__ import annotations

import mmap
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kwker.loading.gguf_file import GgufFile
from kwker.models import hub

DEFAULT_QUANT = "Q4_K_M"  # llama.cpp's `-hf` default: the usual size and quality trade
# Nominal bits per weight of llama.cpp's quant names (llama-quantize's table, for a 7B Llama):
# the order "nearest to the default" follows where a repo's own sizes are not known yet.
NOMINAL_BPW = {
    "IQ1_S": 1.56, "IQ1_M": 1.75, "TQ1_0": 1.69, "TQ2_0": 2.06, "IQ2_XXS": 2.06, "IQ2_XS": 2.31,
    "IQ2_S": 2.5, "IQ2_M": 2.7, "Q2_K": 2.96, "Q2_K_S": 2.96, "Q2_K_L": 3.2, "IQ3_XXS": 3.06,
    "IQ3_XS": 3.3, "IQ3_S": 3.44, "IQ3_M": 3.66, "Q3_K_S": 3.41, "Q3_K_M": 3.74, "Q3_K_L": 4.03,
    "Q3_K_XL": 4.2, "IQ4_XS": 4.25, "IQ4_NL": 4.5, "Q4_0": 4.34, "Q4_1": 4.78, "Q4_K_S": 4.37,
    "Q4_K_M": 4.58, "Q4_K_L": 4.9, "Q5_0": 5.21, "Q5_1": 5.65, "Q5_K_S": 5.21, "Q5_K_M": 5.33,
    "Q5_K_L": 5.6, "Q6_K": 6.14, "Q6_K_L": 6.4, "Q8_0": 8.5, "BF16": 16.0, "F16": 16.0,
    "F32": 32.0,
}  # fmt: skip
# A quant's name inside a file name: the longest of NOMINAL_BPW's names between separators
_QUANT = re.compile(
    r"(?:^|[-_.])(" + "|".join(sorted(NOMINAL_BPW, key=len, reverse=True)) + r")(?=[-_.])",
    re.IGNORECASE,
)
SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
# .gguf files of a repo that are not the model's weights: a vision projector, an importance matrix
NOT_WEIGHTS = re.compile(r"(^|/)(mmproj|imatrix)[^/]*$", re.IGNORECASE)


@dataclass(frozen=True)
class Quant:
    name: str  # "Q4_K_M", as the file names it (upper case)
    files: tuple[hub.RepoFile, ...]  # one, or the parts of a split file in order

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def first(self) -> str:
        """The file a load opens (a split model's first part)."""
        return self.files[0].name


def own_precision(quant: str) -> str | None:
    """The precision a quant loads at as "the model's own": that of the type most of its weights
    are in, which its name says (Q4_K_M is mostly Q4_K, IQ3_M mostly IQ3_S); None for a type
    Kwker does not read."""
    from kwker.loading.build import GGUF_PRECISION

    name = re.sub(r"^(Q\d_K)_(?:S|M|L|XL)$", r"\1", quant.upper())
    name = {"IQ2_M": "IQ2_S", "IQ3_M": "IQ3_S", "IQ3_XS": "IQ3_S"}.get(name, name)
    return GGUF_PRECISION.get(name)


def parse_spec(spec: str) -> tuple[str, str | None]:
    """(repo id, quant or None) of "OWNER/REPO[:QUANT]"."""
    repo, _, quant = spec.partition(":")
    return repo, (quant.upper() or None)


def is_repo_spec(spec: str) -> bool:
    """Whether spec names a Hub repo with a quant ("OWNER/REPO:QUANT"), not a path."""
    repo, quant = parse_spec(spec)
    return quant is not None and repo.count("/") == 1 and not Path(spec).exists()


def quant_of(filename: str) -> str | None:
    """The quant a .gguf file's name says it holds ("Qwen2.5-7B-Instruct-Q4_K_M.gguf": Q4_K_M);
    None for a name that says none."""
    stem = SPLIT.sub(".gguf", filename.rsplit("/", 1)[-1])
    found = _QUANT.findall(stem)
    return found[-1].upper() if found else None


def quants(files: list[hub.RepoFile]) -> list[Quant]:
    """The quants among a repo's files, smallest first. The parts of a split quant go together,
    in order; a split quant missing a part is left out (it could not load)."""
    groups: dict[str, list[hub.RepoFile]] = {}
    for f in files:
        if not f.name.endswith(".gguf") or NOT_WEIGHTS.search(f.name):
            continue
        name = quant_of(f.name)
        if name is not None:
            groups.setdefault(name, []).append(f)
    out = []
    for name, group in groups.items():
        whole = [f for f in group if not SPLIT.search(f.name)]
        if whole:  # a repo with both keeps the one file
            out.append(Quant(name, (min(whole, key=lambda f: len(f.name)),)))
            continue
        parts = sorted(group, key=lambda f: f.name)
        count = int(SPLIT.search(parts[0].name).group(2))
        numbers = [int(SPLIT.search(f.name).group(1)) for f in parts]
        if numbers == list(range(1, count + 1)):
            out.append(Quant(name, tuple(parts)))
    return sorted(out, key=lambda q: q.size)


def pick(available: list[Quant], wanted: str | None, repo_id: str = "") -> Quant:
    """The quant `wanted` names (any case), or without one DEFAULT_QUANT, else the quant nearest
    to it in bits per weight. hub.DownloadError naming the quants there are when none fits."""
    if not available:
        raise hub.DownloadError(f"{repo_id} holds no GGUF model files")
    by_name = {q.name: q for q in available}
    if wanted is not None:
        if wanted.upper() in by_name:
            return by_name[wanted.upper()]
        raise hub.DownloadError(f"{repo_id} has no {wanted} quant; it has {', '.join(by_name)}")
    if DEFAULT_QUANT in by_name:
        return by_name[DEFAULT_QUANT]
    target = NOMINAL_BPW[DEFAULT_QUANT]
    # the nearer in bits; between two as near, the larger (it loses less)
    return min(available, key=lambda q: (abs(NOMINAL_BPW.get(q.name, 99) - target), -q.size))


def list_quants(
    repo_id: str, revision: str | None = None, token: str | None = None
) -> tuple[str, list[Quant]]:
    """(commit, quants) of a Hub repo."""
    commit, files = hub.listing(repo_id, revision, token)
    return commit, quants(files)


def download(spec: str, token: str | None = None, progress=None, cancel=None) -> Path:
    """Downloads the quant spec names (OWNER/REPO[:QUANT]) into the HF cache, checked as every
    download is (kwker.models.hub); returns the path of its file (a split model's first part)."""
    repo_id, wanted = parse_spec(spec)
    chosen: list[Quant] = []

    def select(files):
        chosen.append(pick(quants(files), wanted, repo_id))
        return list(chosen[0].files)

    snapshot = hub.download(repo_id, token=token, progress=progress, cancel=cancel, select=select)
    return snapshot / chosen[0].first


def downloaded(snapshot: Path) -> list[Quant]:
    """The quants whose files (every part) are in a downloaded snapshot of their repo."""
    files = [
        hub.RepoFile(p.relative_to(snapshot).as_posix(), p.stat().st_size, None, None)
        for p in snapshot.rglob("*.gguf")
        if p.exists()  # a dangling link is not a file
    ]
    return quants(files)


def cached(spec: str, snapshot: Path) -> Path | None:
    """The file of spec's quant in a downloaded snapshot of its repo, all parts there; None when
    it is not downloaded (or no quant was named and the snapshot holds several)."""
    _, wanted = parse_spec(spec)
    found = downloaded(snapshot)
    if wanted is None and len(found) != 1:
        return None
    match = [q for q in found if wanted is None or q.name == wanted]
    return snapshot / match[0].first if match else None


def remove(spec: str) -> int:
    """Deletes a downloaded quant (OWNER/REPO:QUANT): its files' links in the snapshot and the
    blobs they point to; the repo's other quants stay, and a repo left with none is deleted from
    the cache. Returns the bytes freed; hub.DownloadError when the quant is not downloaded."""
    repo_id, _ = parse_spec(spec)
    for repo, _, snapshot in hub.cached_models():
        first = cached(spec, snapshot) if repo == repo_id else None
        if first is None:
            continue
        (quant,) = [q for q in downloaded(snapshot) if snapshot / q.first == first]
        freed = 0
        for f in quant.files:
            link = snapshot / f.name
            blob = link.resolve()
            freed += blob.stat().st_size
            blob.unlink()
            link.unlink()
        if not downloaded(snapshot):
            hub.remove(repo_id)
        return freed
    raise hub.DownloadError(f"{spec} is not downloaded")


# ---- the GGUF header over HTTP range requests -----------------------------------------------

FIRST_READ = 8 << 20  # bytes asked for first: a 150k-token vocabulary's header takes 6 MB
MAX_HEADER = 256 << 20  # a header past this is not a header


def remote_header(repo_id: str, commit: str, f: hub.RepoFile, token: str | None = None):
    """The header of the Hub file f (a kwker.loading.gguf_file.GgufFile whose tensor_bytes reads
    over HTTP too), read with range requests of its first bytes, twice as many each time the
    header runs past them. The bytes are laid in a private anonymous mapping of the file's size
    (pages never written stay unallocated), so the parser checks every offset against the real
    file as it does for a file on disk."""
    from kwker.loading.gguf_file import GgufError, parse_buffer

    def read(name: str, start: int, stop: int) -> bytes:
        return _read_range(repo_id, commit, name, start, stop, token)

    want = FIRST_READ
    while True:
        head = read(f.name, 0, min(want, f.size))
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
        with mmap.mmap(-1, max(f.size, 1), flags=flags) as buf:
            buf[: len(head)] = head
            try:
                gguf, end = parse_buffer(buf, Path(f.name), f.size)
            except GgufError as e:
                if e.at < len(head) or len(head) >= f.size:  # found in bytes that were read
                    raise
                end = None
        if end is not None and end <= len(head):  # every byte parsed was a byte read
            return RemoteGguf(**vars(gguf), read=read)
        if len(head) >= f.size or want >= MAX_HEADER:
            raise hub.DownloadError(
                f"{f.name} of {repo_id}: no GGUF header within its first {len(head)} bytes"
            )
        want *= 2


@dataclass
class RemoteGguf(GgufFile):
    """A GGUF header read from the Hub: its tensors' paths are file names in the repo."""

    read: Callable[[str, int, int], bytes] | None = None  # (file, start, stop) -> its bytes

    def tensor_bytes(self, info) -> bytes:
        return self.read(str(info.path), info.offset, info.offset + info.nbytes)


def _read_range(
    repo_id: str, commit: str, name: str, start: int, stop: int, token: str | None
) -> bytes:
    """Bytes [start, stop) of a repo's file."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    url = hf_hub_url(repo_id, name, revision=commit, endpoint=hub._endpoint())
    headers = {**build_hf_headers(token=hub._token(token)), "Range": f"bytes={start}-{stop - 1}"}

    def get():
        r = get_session().get(url, headers=headers, follow_redirects=True, timeout=30)
        hf_raise_for_status(r)
        if r.status_code == 200:  # a server that ignores Range sends the whole file
            return r.content[start:stop]
        return r.content

    try:
        data = hub._retrying(get)
    except Exception as e:  # noqa: BLE001  (network, HTTP: one message naming the file)
        raise hub.DownloadError(f"cannot read {name} of {repo_id} from the Hub: {e}") from e
    if len(data) != stop - start:
        raise hub.DownloadError(
            f"{name} of {repo_id}: asked for bytes {start}-{stop - 1}, got {len(data)} bytes"
        )
    return data


def facts(repo_id: str, commit: str, quant: Quant, token: str | None = None):
    """kwker.loading.memory.ModelFacts of a quant on the Hub, from its header(s) alone."""
    from kwker.loading.gguf_split import merge_parts
    from kwker.loading.memory import facts_from_gguf

    parts = [remote_header(repo_id, commit, f, token) for f in quant.files]
    return facts_from_gguf(merge_parts(parts))
