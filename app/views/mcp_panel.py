"""The Tools tab: the MCP servers of mcp.json (kwker.app.mcp_config), each switched on or off by
its check box, with how it runs (its tools, or why it failed, in words), and the ways to change
them: edit mcp.json in the app (checked before it is saved), share a folder through Kwker's
built-in files server, restart a server, forget the tools that were always allowed.

Every change is written to mcp.json and given to the host (kwker.app.mcp_host), which starts and
stops only what the file switches on."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from kwker.app import mcp_config
from kwker.app.mcp_host import FAILED, OFF, RUNNING, STARTING

ALLOWED_KEY = "mcp_always_allow"  # the store's setting: ["server/tool", ...] run without asking
STATUS = {OFF: "off", STARTING: "starting…", RUNNING: "running", FAILED: "failed"}


class McpEditor(QDialog):
    """mcp.json as text: saved only once it parses, else the reason is said and nothing written."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Tool servers: mcp.json")
        self.text = QPlainTextEdit(mcp_config.read_text())
        self.text.setAccessibleName("mcp.json")
        self.error = QLabel("")
        self.error.setObjectName("error")
        self.error.setWordWrap(True)
        buttons = QDialogButtonBox(QDialogButtonBox.Save | QDialogButtonBox.Cancel)
        buttons.accepted.connect(self.save)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        hint = QLabel(
            'As Claude Desktop and LM Studio write it: "mcpServers", each with a "command", '
            '"args" and "env", or a "url"; "disabled": true switches one off.'
        )
        hint.setWordWrap(True)
        layout.addWidget(hint)
        layout.addWidget(self.text, 1)
        layout.addWidget(self.error)
        layout.addWidget(buttons)
        self.specs: list = []
        self.resize(640, 460)

    def save(self) -> None:
        try:
            self.specs = mcp_config.save_text(self.text.toPlainText())
        except (mcp_config.ConfigError, OSError) as e:
            self.error.setText(str(e))
            return
        self.accept()


class McpPanel(QWidget):
    said = Signal(str)  # a change or a failure, for the status bar

    def __init__(self, host, store):
        super().__init__()
        self.host, self.store = host, store
        intro = QLabel(
            "Tools the model may call, from MCP servers. Each call asks you first. "
            f"The servers are listed in {mcp_config.config_path()}."
        )
        intro.setWordWrap(True)
        intro.setObjectName("muted")
        intro.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.tree = QTreeWidget()
        self.tree.setHeaderHidden(True)
        self.tree.setAccessibleName("tool servers")
        self.tree.itemChanged.connect(self._on_item_changed)
        self.tree.currentItemChanged.connect(lambda *_: self._show_details())
        self.details = QLabel("")
        self.details.setWordWrap(True)
        self.details.setAccessibleName("server details")
        self.details.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.edit_button = QPushButton("Edit mcp.json…")
        self.edit_button.clicked.connect(self.edit)
        self.folder_button = QPushButton("Share a folder…")
        self.folder_button.setToolTip(
            "Kwker's built-in files server: the model may list and read (never write) the files "
            "of a folder you pick, and nothing outside it"
        )
        self.folder_button.clicked.connect(self._pick_folder)
        self.restart_button = QPushButton("Restart")
        self.restart_button.clicked.connect(self._restart)
        self.forget_button = QPushButton("Ask again for every tool")
        self.forget_button.setToolTip("Forgets the tools you allowed always")
        self.forget_button.clicked.connect(self.forget_allowed)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addWidget(self.tree, 1)
        layout.addWidget(self.details)
        for pair in ((self.edit_button, self.folder_button),
                     (self.restart_button, self.forget_button)):  # fmt: skip
            row = QHBoxLayout()
            for button in pair:
                row.addWidget(button)
            layout.addLayout(row)
        self.config_error = ""
        host.changed.connect(self.refresh)

    # ------------------------------------------------------------------------------- the file
    def load(self) -> None:
        """Reads mcp.json and runs what it switches on (a file that cannot be used: said, and
        nothing runs)."""
        try:
            specs = mcp_config.load()
            self.config_error = ""
        except (mcp_config.ConfigError, OSError) as e:
            specs, self.config_error = [], str(e)
            self.said.emit(f"Tool servers: {e}")
        self.host.apply(specs)

    def edit(self) -> McpEditor:
        self.editor = McpEditor(self)
        self.editor.accepted.connect(lambda: self._apply(self.editor.specs, "Saved mcp.json"))
        self.editor.open()
        return self.editor

    def share_folder(self, folder: str) -> None:
        entry = mcp_config.files_server_entry(folder)
        self._apply(mcp_config.add_server(mcp_config.FILES_SERVER, entry),
                    f"Sharing {folder} with the model (read-only)")  # fmt: skip

    def set_enabled(self, name: str, on: bool) -> None:
        self._apply(mcp_config.set_enabled(name, on), f"{name} switched {'on' if on else 'off'}")

    def _apply(self, specs, said: str) -> None:
        self.config_error = ""
        self.host.apply(specs)
        self.said.emit(said)

    def _pick_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "The folder the model may read")
        if folder:
            self.share_folder(folder)

    def _restart(self) -> None:
        item = self.tree.currentItem()
        if item is not None:
            self.host.restart((item.parent() or item).data(0, Qt.UserRole))

    # ------------------------------------------------------------------------------ approvals
    def allowed(self) -> list[str]:
        return list(self.store.settings().get(ALLOWED_KEY, []))

    def allow_always(self, server: str, tool: str) -> None:
        self.store.save_settings({ALLOWED_KEY: sorted({*self.allowed(), f"{server}/{tool}"})})

    def forget_allowed(self) -> None:
        self.store.forget_settings([ALLOWED_KEY])
        self.said.emit("Every tool call asks you again")

    # ---------------------------------------------------------------------------------- view
    def refresh(self) -> None:
        current = self.tree.currentItem()
        chosen = (current.parent() or current).data(0, Qt.UserRole) if current else None
        self.tree.blockSignals(True)  # drawing the states is no change to write
        self.tree.clear()
        for state in self.host.states():
            spec = state.spec
            status = STATUS.get(state.status, state.status)
            if state.status == RUNNING:
                status += f", {len(state.tools)} tool{'s' * (len(state.tools) != 1)}"
            item = QTreeWidgetItem([f"{spec.name} · {status}"])
            item.setData(0, Qt.UserRole, spec.name)
            item.setFlags(item.flags() | Qt.ItemIsUserCheckable)
            item.setCheckState(0, Qt.Checked if spec.enabled else Qt.Unchecked)
            item.setToolTip(0, spec.where)
            for tool in state.tools:
                child = QTreeWidgetItem([tool.name])
                child.setToolTip(0, tool.description)
                item.addChild(child)
            self.tree.addTopLevelItem(item)
            item.setExpanded(True)
            if spec.name == chosen:
                self.tree.setCurrentItem(item)
        self.tree.blockSignals(False)
        self._show_details()

    def _show_details(self) -> None:
        if self.config_error:
            self.details.setText(f"⚠ {self.config_error}")
            return
        item = self.tree.currentItem()
        name = (item.parent() or item).data(0, Qt.UserRole) if item is not None else None
        state = next((s for s in self.host.states() if s.spec.name == name), None)
        if state is None:
            none = "No tool servers yet: share a folder, or add servers to mcp.json."
            self.details.setText("" if self.host.states() else none)
            return
        text = f"{state.spec.name}: {state.spec.where}"
        if state.status == FAILED:
            text += f"\n⚠ It {state.error}."
        if item.parent() is not None:
            tool = next(t for t in state.tools if t.name == item.text(0))
            text = f"{tool.name}: {tool.description or '(no description)'}"
        self.details.setText(text)

    def _on_item_changed(self, item: QTreeWidgetItem, column: int) -> None:
        if item.parent() is None:
            self.set_enabled(item.data(0, Qt.UserRole), item.checkState(0) == Qt.Checked)
