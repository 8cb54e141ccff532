"""A GGUF model split into several files, as llama.cpp's gguf-split writes it:

    NAME-00001-of-00003.gguf  NAME-00002-of-00003.gguf  NAME-00003-of-00003.gguf

Each part is a GGUF of its own (read by kwker.loading.gguf_file) holding some of the tensors,
with the keys split.no (0-based), split.count and split.tensors.count; the first part also holds
all the model's metadata. Loading the first part's path loads them all, as llama.cpp does.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from kwker.loading.errors import BadModelFile
from kwker.loading.gguf_file import GgufFile, read_gguf

PART = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def part_paths(path: Path) -> list[Path]:
    """Every part of the split model whose first part is `path` ([path] for a file not named as
    a part). BadModelFile for a part that is missing, or a path that is not the first part."""
    m = PART.match(path.name)
    if m is None:
        return [path]
    count = int(m.group("count"))
    if int(m.group("no")) != 1:
        first = path.with_name(f"{m.group('stem')}-00001-of-{count:05d}.gguf")
        raise BadModelFile(f"{path} is part {int(m.group('no'))} of a split model: open {first}")
    paths = [path.with_name(f"{m.group('stem')}-{i:05d}-of-{count:05d}.gguf")
             for i in range(1, count + 1)]  # fmt: skip
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise BadModelFile(
            f"{path}: the split model has {count} parts; {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} missing"
        )
    return paths


def merge_parts(parts: list[GgufFile]) -> GgufFile:
    """One GgufFile of the parts: the first's metadata, every part's tensors (each TensorInfo's
    offset is within its own part, which it names). Checks the split keys against the parts
    (their number, order and tensor count) and that no tensor is in two parts."""
    first = parts[0]
    count = first.metadata.get("split.count", 1)
    if count != len(parts):
        raise BadModelFile(f"{first.path}: split.count is {count}, but {len(parts)} parts are here")
    tensors = {}
    for i, part in enumerate(parts):
        if len(parts) > 1 and part.metadata.get("split.no") != i:
            raise BadModelFile(f"{part.path}: split.no is {part.metadata.get('split.no')}, not {i}")
        for name, info in part.tensors.items():
            if name in tensors:
                raise BadModelFile(f"{part.path}: tensor {name} is also in an earlier part")
            tensors[name] = info
    expected = first.metadata.get("split.tensors.count", len(tensors))
    if expected != len(tensors):
        raise BadModelFile(
            f"{first.path}: split.tensors.count is {expected}, but the parts hold {len(tensors)}"
        )
    return replace(first, tensors=tensors, file_size=sum(p.file_size for p in parts))


def read_split(path: Path) -> tuple[GgufFile, list[Path]]:
    """(merged header, every part's path) of the model at path: one file, or the first part of a
    split model."""
    paths = part_paths(Path(path))
    return merge_parts([read_gguf(p) for p in paths]), paths
