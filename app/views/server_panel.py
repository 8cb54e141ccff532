"""The model picker's Servers tab: an OpenAI-compatible server's address and API key, the models it
offers (its /v1/models), and the one to chat with. A key that the server accepted is kept in the
system keyring (or a 0600 file where there is none: kwker.app.keys), never in the settings; the
settings keep the addresses.

Threading: listing the models and reading or writing a key (a keyring may block to ask for its
password) run through the picker's `submit`, on its TaskRunner (app/tasks.py); the results come back
here."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from kwker.app import keys
from kwker.remote import list_models, normalize_url

ADDRESS_HINT = "http://host:8000/v1"
NOTE = (
    "Any OpenAI-compatible server: kwker serve, vLLM, SGLang, llama.cpp's server, Ollama (its /v1). "
    "The server applies its own precision, context and speculation."
)


class ServerPanel(QWidget):
    chosen = Signal(str, str)  # the server's address, the model's id
    forgotten = Signal(str)  # a server's address, its key deleted

    def __init__(self, submit, servers=(), current=("", ""), parent=None):
        """submit(call, on_done, on_fail): runs call off the GUI thread (ModelPicker.submit).
        servers: the addresses added before; current: the (address, model) chatted with."""
        super().__init__(parent)
        self.submit = submit
        self.current_model = current[1]
        self.address = QComboBox()
        self.address.setEditable(True)
        self.address.setAccessibleName("server address")
        self.address.lineEdit().setPlaceholderText(ADDRESS_HINT)
        self.address.addItems(list(servers))
        self.address.setCurrentText(current[0] or (servers[0] if servers else ""))
        self.address.currentTextChanged.connect(self._address_changed)
        self.key = QLineEdit()
        self.key.setEchoMode(QLineEdit.Password)
        self.key.setAccessibleName("API key")
        self.connect_button = QPushButton("Connect")
        self.connect_button.setAccessibleName("connect to the server")
        self.connect_button.clicked.connect(self.connect_server)
        self.address.lineEdit().returnPressed.connect(self.connect_server)
        self.key.returnPressed.connect(self.connect_server)
        self.models = QListWidget()
        self.models.setAccessibleName("models on the server")
        self.models.itemDoubleClicked.connect(lambda _: self.use())
        self.models.currentRowChanged.connect(lambda row: self.use_button.setEnabled(row >= 0))
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.status.setAccessibleName("server status")
        self.use_button = QPushButton("Chat with this model")
        self.use_button.setAccessibleName("chat with the server's model")
        self.use_button.setEnabled(False)
        self.use_button.clicked.connect(self.use)
        self.forget_button = QPushButton("Forget this server")
        self.forget_button.setAccessibleName("forget the server and its key")
        self.forget_button.clicked.connect(self.forget)
        note = QLabel(NOTE)
        note.setWordWrap(True)
        note.setObjectName("muted")

        form = QFormLayout()
        row = QHBoxLayout()
        row.addWidget(self.address, 1)
        row.addWidget(self.connect_button)
        form.addRow("Address", row)
        form.addRow("API key", self.key)
        buttons = QHBoxLayout()
        buttons.addWidget(self.use_button)
        buttons.addStretch(1)
        buttons.addWidget(self.forget_button)
        layout = QVBoxLayout(self)
        layout.addWidget(note)
        layout.addLayout(form)
        layout.addWidget(self.models, 1)
        layout.addWidget(self.status)
        layout.addLayout(buttons)
        self.url = ""  # the address whose models are listed
        self._address_changed(self.address.currentText())

    def _address_changed(self, text: str) -> None:
        """Another address: its models are not listed yet; the key field says whether one is
        kept."""
        self._clear_models()
        self.key.clear()
        self.key.setPlaceholderText("none needed, or the server's key")
        if not text.strip():
            return
        url = normalize_url(text)

        def kept(has_key):
            if has_key and normalize_url(self.address.currentText()) == url:
                self.key.setPlaceholderText("a key is kept for this server (type to replace it)")

        self.submit(lambda: keys.load_key(url) is not None, kept, lambda message: None)

    def connect_server(self) -> None:
        """Lists the server's models with the typed key (or the kept one); a typed key that the
        server accepted is then kept."""
        if not self.address.currentText().strip():
            self.status.setText(f"Type the server's address, as {ADDRESS_HINT}")
            return
        url, typed = normalize_url(self.address.currentText()), self.key.text().strip()
        self.connect_button.setEnabled(False)
        self.status.setText(f"Connecting to {url}…")

        def call():
            names = list_models(url, typed or keys.load_key(url))
            return names, (keys.save_key(url, typed) if typed else None)

        def listed(result):
            names, where = result
            self.connect_button.setEnabled(True)
            self.key.clear()
            self._clear_models()
            self.url = url
            self.models.addItems(names)
            if names:
                current = names.index(self.current_model) if self.current_model in names else 0
                self.models.setCurrentRow(current)
            said = f"{len(names)} model{'s' if len(names) != 1 else ''} on {url}"
            if where == keys.KEYRING:
                said += "; its key is kept in the system keyring"
            elif where == keys.FILE:
                said += (
                    f"; its key is kept in {keys.key_file()}, which only you can read (there is "
                    "no system keyring here)"
                )
            self.status.setText(said)
            if typed:
                self.key.setPlaceholderText("a key is kept for this server (type to replace it)")

        def failed(message):
            self.connect_button.setEnabled(True)
            self._clear_models()
            self.status.setText(message)

        self.submit(call, listed, failed)

    def _clear_models(self) -> None:
        self.models.clear()
        self.url = ""
        self.use_button.setEnabled(False)

    def selected_model(self) -> str | None:
        item = self.models.currentItem()
        return item.text() if item is not None and self.url else None

    def use(self) -> None:
        model = self.selected_model()
        if model is None:
            return
        self.current_model = model
        if self.address.findText(self.url) < 0:
            self.address.blockSignals(True)  # the same server, now by its full address
            self.address.insertItem(0, self.url)
            self.address.setCurrentIndex(0)
            self.address.blockSignals(False)
        self.status.setText(f"Chatting with {model} on {self.url}")
        self.chosen.emit(self.url, model)

    def forget(self) -> None:
        """Deletes the key kept for the address and drops it from the list."""
        text = self.address.currentText().strip()
        if not text:
            return
        url = normalize_url(text)

        def deleted(_):
            for i in (self.address.findText(url), self.address.findText(text)):
                if i >= 0:
                    self.address.removeItem(i)
            self.status.setText(f"Forgot {url} and its key")
            self.forgotten.emit(url)

        self.submit(
            lambda: keys.delete_key(url),
            deleted,
            lambda message: self.status.setText(f"Cannot forget {url}'s key: {message}"),
        )
