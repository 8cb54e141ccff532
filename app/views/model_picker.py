"""The model picker: the catalog, models already on disk (downloaded or imported) and Hub search
results, with size, license, family, the memory each needs at the chosen precision and context and
whether that fits this machine's free memory; download with progress and cancel, delete, import a
.gguf file or a model folder, and choose the chat model or its draft (same tokenizer only). A
Hub repo of GGUF files downloads one of its quants, chosen in its quant list
(views/quant_list.py). The rows are views/model_table.py's. Its Servers tab chooses a model on an
OpenAI-compatible server instead (views/server_panel.py).

Threading: the catalog is a resource read on the GUI thread. Everything that touches the disk or
the network -- the Hugging Face cache scan, the imported-models list, reading a model's files or a
Hub repo's config.json for its estimate, Hub search, delete, import -- is a call the TaskRunner
runs on its own QThread, in order; its result or failure comes back by a queued signal and only
then changes the table (only the GUI thread touches Qt models). Downloads have their own worker
(views/model_download.py, with the picker's side of a download). The estimates themselves are
arithmetic on what those calls found (kwker.loading.memory), so changing the precision or the
context refits every row at once."""

from __future__ import annotations

from PySide6.QtCore import QThread, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QTableView,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from kwker.app.tasks import TaskRunner
from kwker.app.views.model_download import DownloadWorker, PickerDownloads
from kwker.app.views.model_table import (
    COLUMNS,
    MEMORY,
    ModelTableModel,
    hub_download_size,
    import_model,
    on_disk,
    remove_download,
    size_text,
)
from kwker.app.views.server_panel import ServerPanel
from kwker.loading import memory
from kwker.models import catalog as cat
from kwker.models import hub, imported
from kwker.precision import (
    AUTO,
    AUTO_LABEL,
    CONVERSIONS,
    PRECISIONS,
    canonical,
    label,
    weight_bytes,
)


class ModelPicker(PickerDownloads, QDialog):
    model_chosen = Signal(str)
    draft_chosen = Signal(str)
    server_chosen = Signal(str, str)  # a server's address, the model on it
    server_forgotten = Signal(str)  # a server's address
    request_download = Signal(str)

    def __init__(self, current_model: str, parent=None, precision: str | None = "int4",
                 context: int = 2048, confirm=None, servers=(), server=("", "")):  # fmt: skip
        """precision and context: the settings', which the Memory and Fit columns use. confirm:
        called with the won't-fit explanation when such a model is chosen, True to load it
        anyway (default: a question box, `ask_load_anyway`). servers: the addresses of the
        servers added before; server: the (address, model) chatted with, if any."""
        super().__init__(parent)
        self.setWindowTitle("Models")
        self.resize(1080, 560)
        self.current_model = current_model
        self.confirm = confirm or self.ask_load_anyway
        self.confirm_box: QMessageBox | None = None
        self.table_model = ModelTableModel(self, precision, context, in_use=current_model)
        self.search = QLineEdit(placeholderText="Filter, or search the Hub")
        self.search.setAccessibleName("search models")
        self.search.textChanged.connect(self._filter)
        self.search.returnPressed.connect(self.search_hub)
        self.hub_button = QPushButton("Search the Hub")
        self.hub_button.clicked.connect(self.search_hub)
        self.precision = QComboBox()
        self.precision.setAccessibleName("precision for the memory estimate")
        self.precision.addItem(f"Fit at: {AUTO_LABEL}", AUTO)
        setting = canonical(precision)
        names = {"fp32", *CONVERSIONS} | ({setting} if setting in PRECISIONS else set())
        for name in sorted(names, key=weight_bytes):  # the smallest first
            self.precision.addItem(f"Fit at {PRECISIONS[name].weights}", name)
        self.precision.setCurrentIndex(max(self.precision.findData(setting or AUTO), 0))
        self.precision.currentIndexChanged.connect(self._refit)
        self.precision.setSizeAdjustPolicy(QComboBox.AdjustToContents)
        self.token = QLineEdit(placeholderText="Hugging Face token (gated models)")
        self.token.setEchoMode(QLineEdit.Password)
        self.token.setAccessibleName("Hugging Face token")
        self.table = QTableView()
        self.table.setModel(self.table_model)
        self.table.setSelectionBehavior(QTableView.SelectRows)
        self.table.setSelectionMode(QTableView.SingleSelection)
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.Stretch)
        self.table.horizontalHeader().setSectionResizeMode(MEMORY, QHeaderView.ResizeToContents)
        # the status may name three things ("in use · base model · downloaded"): never cut
        self.table.horizontalHeader().setSectionResizeMode(
            len(COLUMNS) - 1, QHeaderView.ResizeToContents
        )
        self.table.setAccessibleName("models")
        self.table.selectionModel().selectionChanged.connect(self._show_own_precision)
        # rows come and go as background results arrive: the selected model stays selected
        self._keep: str | None = None
        self.table_model.modelAboutToBeReset.connect(self._remember_selection)
        self.table_model.modelReset.connect(self._restore_selection)
        self.progress = QProgressBar()
        self.progress.setAccessibleName("download progress")
        self.progress.setVisible(False)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.status.setAccessibleName("status")
        self.download_button = QPushButton("Download")
        self.cancel_button = QPushButton("Cancel download")
        self.cancel_button.setEnabled(False)
        use = QPushButton("Chat with this model")
        draft = QPushButton("Use as draft")
        self.delete_button = QPushButton("Delete")
        import_gguf = QPushButton("Import GGUF…")
        import_folder = QPushButton("Import folder…")
        self.download_button.clicked.connect(self.download_selected)
        self.cancel_button.clicked.connect(lambda: self.worker.cancel.set())
        use.clicked.connect(self._use)
        draft.clicked.connect(self._draft)
        self.delete_button.clicked.connect(self.delete_selected)
        import_gguf.clicked.connect(self._import_gguf_dialog)
        import_folder.clicked.connect(self._import_folder_dialog)

        top = QHBoxLayout()
        top.addWidget(self.search, 1)
        top.addWidget(self.hub_button)
        top.addWidget(self.precision)
        top.addWidget(self.token)
        buttons = QHBoxLayout()
        for b in (self.download_button, self.cancel_button, use, draft, self.delete_button,
                  import_gguf, import_folder):  # fmt: skip
            buttons.addWidget(b)
        local = QWidget()
        layout = QVBoxLayout(local)
        layout.addLayout(top)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.progress)
        layout.addWidget(self.status)
        layout.addLayout(buttons)
        self.tabs = QTabWidget()
        self.tabs.addTab(local, "On this computer")
        QVBoxLayout(self).addWidget(self.tabs)

        self.thread_ = QThread(self)
        self.worker = DownloadWorker()
        self.worker.moveToThread(self.thread_)
        self.request_download.connect(self.worker.run)
        self.worker.progress.connect(self._on_progress)
        self.worker.done.connect(self._on_done)
        self.worker.failed.connect(self._on_failed)
        self.thread_.start()
        self.downloading = False

        self.tasks = TaskRunner(self)  # the disk and the network, off this thread
        self.searching = False
        self._search_generation = 0
        self.scanning = False
        self.scan()

        self.servers = ServerPanel(self.submit, servers, server)
        self.servers.chosen.connect(self.server_chosen)
        self.servers.forgotten.connect(self.server_forgotten)
        self.tabs.addTab(self.servers, "Servers")
        if server[0]:
            self.tabs.setCurrentWidget(self.servers)

    # ---- background calls
    def submit(self, call, on_done, on_fail) -> int:
        """Runs call() on the tasks thread; on_done(result) or on_fail(message) on this one."""
        return self.tasks.submit(call, on_done, on_fail)

    @property
    def busy(self) -> bool:
        """Whether a background call is still to report."""
        return self.tasks.busy

    def scan(self) -> None:
        """Lists the models on disk (the HF cache, the imported ones), then reads the files of
        each for its estimate."""
        self.scanning = True

        def listed(found):
            cached, imports = found
            self.scanning = False
            self.table_model.set_scan(cached, imports)
            self._read_facts_of_local_models(cached, imports)

        def failed(message):
            self.scanning = False
            self.status.setText(f"Could not list the models on disk: {message}")

        self.submit(lambda: (on_disk(), imported.entries()), listed, failed)

    def _read_facts_of_local_models(self, cached, imports) -> None:
        from kwker.models.loader import local_files

        def files_of_catalog():
            return {e.id: local_files(e.id, cached) for e in cat.catalog()}

        def found(paths):
            for row_id, path in paths.items():
                if path is not None:
                    self._read_facts(row_id, lambda p=path: memory.facts_from_files(p))

        self.submit(files_of_catalog, found, lambda message: None)
        known = {e.id for e in cat.catalog()}
        for repo, _, path in cached:  # a model folder, or a downloaded quant's .gguf file
            if repo not in known and (path.is_file() or (path / "config.json").is_file()):
                self._read_facts(repo, lambda p=path: memory.facts_from_files(p))
        for entry in imports:
            self._read_facts(entry["path"], lambda p=entry["path"]: memory.facts_from_files(p))

    def _read_facts(self, row_id: str, call) -> None:
        self.table_model.pending.add(row_id)
        self.submit(
            call,
            lambda facts: self.table_model.set_facts(row_id, facts),
            lambda message: self.table_model.set_facts(row_id, None, message),
        )

    # ---- filter, search, fit
    def _filter(self, text: str):
        self.table_model.filter = text.strip()
        self.table_model.refresh()

    def _refit(self):
        data = self.precision.currentData()
        self.table_model.set_fit(None if data == AUTO else data, self.table_model.context)

    def set_context(self, context: int) -> None:
        """The context length the estimates are for (the settings' context_length)."""
        self.table_model.set_fit(self.table_model.precision, context)

    def _show_own_precision(self, *_):
        """The "model's own" item names the selected model's real precision, where it is known."""
        row = self.selected()
        facts = row and self.table_model._facts(row["id"], row["entry"])
        own = f" ({label(facts.own)})" if facts and facts.own else ""
        self.precision.setItemText(0, f"Fit at: {AUTO_LABEL}{own}")
        # a GGUF repo downloads one of its quants, chosen in its list
        self.download_button.setText("Choose a quant…" if row and row["gguf"] else "Download")

    def search_hub(self):
        text = self.search.text().strip()
        self._search_generation += 1
        generation = self._search_generation
        self.searching = True
        self.hub_button.setEnabled(False)
        self.status.setText(f"Searching the Hub for “{text}”…")

        def found(repos):
            if generation != self._search_generation:
                return  # a newer search replaced this one
            self._end_search()
            self.table_model.search_results = list(repos)
            self.table_model.filter = ""
            self.table_model.refresh()
            self.status.setText(f"{len(repos)} models on the Hub match “{text}”")
            token = self.token.text().strip() or None
            for hit in repos:
                self.submit(
                    lambda h=hit: hub_download_size(h, token),
                    lambda size, r=hit.id: self._set_hub_size(r, size),
                    lambda message: None,  # the row just shows no size
                )
            for repo in (hit.id for hit in repos if not hit.gguf):  # GGUF: in its quant list
                if self.table_model._facts(repo, cat.entry(repo)) is None:
                    self._read_facts(
                        repo, lambda r=repo: memory.facts_from_config(hub.config(r, token=token))
                    )

        def failed(message):  # offline or refused: say so, keep the catalog
            if generation == self._search_generation:
                self._end_search()
                self.status.setText(f"Hub search failed: {message}")

        self.submit(lambda: hub.search(text), found, failed)

    def _set_hub_size(self, repo: str, size: int) -> None:
        self.table_model.hub_sizes[repo] = size
        self.table_model.refresh()

    def _end_search(self):
        self.searching = False
        self.hub_button.setEnabled(True)

    # ---- selection
    def select(self, repo: str) -> bool:
        for i, r in enumerate(self.table_model.rows):
            if r["id"] == repo:
                self.table.selectRow(i)
                return True
        return False

    def _remember_selection(self):
        row = self.selected()
        self._keep = row["id"] if row else None

    def _restore_selection(self):
        if self._keep is not None:
            self.select(self._keep)

    def selected(self) -> dict | None:
        rows = self.table.selectionModel().selectedRows()
        return self.table_model.rows[rows[0].row()] if rows else None

    # ---- choose
    def wont_fit_text(self, row: dict) -> str:
        """Why `row` won't fit, with the numbers (its estimate's parts and the free memory)."""
        return f"{row['name']} {row['tip']}. Load it anyway?"

    def ask_load_anyway(self, text: str) -> bool:
        """A question box: "Load anyway" or "Cancel" (kept as confirm_box while it is open)."""
        box = QMessageBox(QMessageBox.Warning, "Not enough memory", text, parent=self)
        load = box.addButton("Load anyway", QMessageBox.AcceptRole)
        cancel = box.addButton(QMessageBox.Cancel)
        box.setDefaultButton(cancel)
        self.confirm_box = box
        try:
            box.exec()
        finally:
            self.confirm_box = None
        return box.clickedButton() is load

    def choose(self, row: dict) -> bool:
        """Chats with `row`'s model, after asking when it won't fit; whether it was chosen."""
        if row["fit"] == "won't fit" and not self.confirm(self.wont_fit_text(row)):
            self.status.setText(f"Not loaded: {row['name']} {row['tip']}")
            return False
        self.model_chosen.emit(row["id"])
        return True

    def _use(self):
        row = self.selected()
        if row is not None:
            self.choose(row)

    def _draft(self):
        row = self.selected()
        if row is None:
            return
        if row["id"] not in cat.same_tokenizer(self.current_model):
            self.status.setText(
                f"{row['id']} does not share {self.current_model}'s tokenizer (or is not smaller): "
                "it cannot draft for it"
            )
            return
        self.draft_chosen.emit(row["id"])

    def delete_selected(self):
        row = self.selected()
        if row is None:
            return
        repo = row["id"]
        self.delete_button.setEnabled(False)

        def deleted(freed):
            self.delete_button.setEnabled(True)
            self.status.setText(f"Deleted {repo} ({size_text(freed)} freed)")
            self.table_model.facts.pop(repo, None)
            self.scan()

        def failed(message):
            self.delete_button.setEnabled(True)
            self.status.setText(f"Cannot delete {repo}: {message}")

        self.submit(lambda: remove_download(repo), deleted, failed)

    # ---- import
    def _import_gguf_dialog(self):
        path, _ = QFileDialog.getOpenFileName(self, "Import a GGUF file", "", "GGUF (*.gguf)")
        if path:
            self.import_file(path)

    def _import_folder_dialog(self):
        path = QFileDialog.getExistingDirectory(self, "Import a model folder (with config.json)")
        if path:
            self.import_file(path)

    def import_file(self, path: str):
        """Checks the .gguf file or model folder can run and registers it where it is (never
        converted or copied), in the background; then chats with it."""
        self.status.setText(f"Importing {path}…")

        def call():
            entry = import_model(path)
            try:
                facts = memory.facts_from_files(entry["path"])
            except Exception:  # noqa: BLE001  (it runs, as the import checked; only no estimate)
                facts = None
            return entry, facts

        def done(result):
            entry, facts = result
            self.table_model.imports = [
                *(e for e in self.table_model.imports if e["path"] != entry["path"]),
                entry,
            ]
            if facts is not None:
                self.table_model.facts[entry["path"]] = facts
            self.table_model.refresh()
            self.status.setText(
                f"Imported {entry['name']} ({size_text(entry['bytes'])}), kept at {entry['path']}"
            )
            row = self.table_model.row(entry["path"])
            if row is not None:
                self.choose(row)
            else:  # filtered out of the table
                self.model_chosen.emit(entry["path"])

        self.submit(
            call, done, lambda message: self.status.setText(f"Cannot import {path}: {message}")
        )

    def stop_workers(self) -> None:
        """Cancels a download and ends both threads (after the call running, if any)."""
        self.worker.cancel.set()
        self.tasks.stop()
        self.thread_.quit()
        self.thread_.wait()

    def done(self, result):  # noqa: A003  (QDialog's name)
        self.stop_workers()
        super().done(result)

    def closeEvent(self, event):  # noqa: N802  (a hidden dialog's close skips done)
        self.stop_workers()
        super().closeEvent(event)
