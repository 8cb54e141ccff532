"""Tools in the window: the app's MCP host (one per window, its servers those of mcp.json that are
switched on), the Tools tab, and the approval asked before each call.

The worker asks (its `approval` signal, queued to this thread); a tool the user allowed always is
allowed at once, any other gets the approval dialog, non-blocking. The answer goes back through
the worker's thread-safe Approvals. An answer that ends (Stop, an error) closes a dialog still
open; the window's closing stops every server."""

from __future__ import annotations

from PySide6.QtCore import QObject, Slot

from kwker.app.mcp_host import McpHost
from kwker.app.store import data_dir
from kwker.app.tool_calls import ALLOW_ALWAYS, ALLOW_ONCE, DENY
from kwker.app.views.mcp_panel import McpPanel
from kwker.app.views.tool_approval import ApprovalDialog


class ToolUse(QObject):
    def __init__(self, window):
        super().__init__(window)
        self.w = window
        self.host = McpHost(data_dir() / "mcp-logs", self)
        self.worker = window.worker
        self.worker.host = self.host
        self.worker.approval.connect(self.ask)
        self.panel = McpPanel(self.host, window.store)
        self.panel.said.connect(window.status.setText)
        window.tabs.addTab(self.panel, "Tools")
        window.answering.ended.connect(lambda *_: self._ended())
        self.dialog: ApprovalDialog | None = None
        self.panel.load()

    @Slot(dict)
    def ask(self, call: dict) -> None:
        if f"{call['server']}/{call['tool']}" in self.panel.allowed():
            self.worker.approvals.reply(call["id"], ALLOW_ONCE)
            return
        tool = next((t for t in self.host.tools()
                     if (t.server, t.name) == (call["server"], call["tool"])), None)  # fmt: skip
        self._close_dialog()
        self.dialog = ApprovalDialog(call, tool.description if tool else "", self.w)
        self.dialog.decided.connect(lambda answer, c=call: self._decided(c, answer))
        self.dialog.open()
        self.w.status.setText(f"The model wants to run {call['tool']}: allow it?")

    def _decided(self, call: dict, answer: str) -> None:
        if answer == ALLOW_ALWAYS:
            self.panel.allow_always(call["server"], call["tool"])
        self.worker.approvals.reply(call["id"], answer)
        ran = (
            f"Running {call['tool']}…" if answer != DENY else f"Denied: {call['tool']} was not run"
        )
        self.w.status.setText(ran)

    def _ended(self) -> None:
        """The answer ended: a question still open is moot, and "Running …" is over."""
        self._close_dialog()
        if self.w.status.text().startswith(("Running ", "The model wants to run ")):
            self.w.status.setText("")

    def _close_dialog(self) -> None:
        if self.dialog is not None:
            self.dialog.close()
            self.dialog.deleteLater()
            self.dialog = None

    def close(self) -> None:
        self._close_dialog()
        self.host.close()
