"""Light and dark themes (following the system unless the user picks one) and the chat view's style
sheet."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

LIGHT = {
    "window": "#f6f7f9",
    "base": "#ffffff",
    "text": "#1d2126",
    "muted": "#6b7380",
    "accent": "#2f6fde",
    "user": "#e8f0fe",
    "assistant": "#ffffff",
    "code": "#f1f3f5",
    "codehead": "#e3e6ea",
    "border": "#d8dce2",
    "lookup": "#fff1b8",
    "draft": "#d7f5dd",
}
DARK = {
    "window": "#1e2126",
    "base": "#25292f",
    "text": "#e6e8eb",
    "muted": "#9aa3ad",
    "accent": "#6ea1ff",
    "user": "#2c3a52",
    "assistant": "#25292f",
    "code": "#1b1e22",
    "codehead": "#30353c",
    "border": "#3a4048",
    "lookup": "#5c4d12",
    "draft": "#1f4d2a",
}


def system_is_dark() -> bool:
    hints = QGuiApplication.styleHints()
    return hasattr(hints, "colorScheme") and hints.colorScheme() == Qt.ColorScheme.Dark


def colors_for(theme: str) -> dict:
    dark = theme == "dark" or (theme == "system" and system_is_dark())
    return DARK if dark else LIGHT


def apply(app: QApplication, theme: str) -> dict:
    c = colors_for(theme)
    app.setStyle("Fusion")
    pal = QPalette()
    for role, key in (
        (QPalette.Window, "window"),
        (QPalette.Base, "base"),
        (QPalette.AlternateBase, "window"),
        (QPalette.Text, "text"),
        (QPalette.WindowText, "text"),
        (QPalette.ButtonText, "text"),
        (QPalette.Button, "base"),
        (QPalette.Highlight, "accent"),
        (QPalette.ToolTipBase, "base"),
        (QPalette.ToolTipText, "text"),
        (QPalette.PlaceholderText, "muted"),
        (QPalette.Link, "accent"),
    ):
        pal.setColor(role, QColor(c[key]))
    pal.setColor(QPalette.HighlightedText, QColor("#ffffff"))
    # disabled controls draw in the muted colour, so they look disabled (Fusion reads these)
    for role in (QPalette.Text, QPalette.WindowText, QPalette.ButtonText):
        pal.setColor(QPalette.Disabled, role, QColor(c["muted"]))
    pal.setColor(QPalette.Disabled, QPalette.Button, QColor(c["window"]))
    app.setPalette(pal)
    # Spin and combo boxes are left to Fusion: a style sheet's border on them makes Qt draw their
    # arrows itself, as empty squares in the dark theme.
    app.setStyleSheet(f"""
        QListView, QPlainTextEdit, QTextBrowser, QLineEdit {{
            border: 1px solid {c["border"]}; border-radius: 6px; padding: 4px; }}
        QPushButton {{ border: 1px solid {c["border"]}; border-radius: 6px; padding: 6px 12px; }}
        QPushButton:disabled {{ color: {c["muted"]}; background: {c["window"]};
            border: 1px dashed {c["border"]}; }}
        QPushButton#send {{ background: {c["accent"]}; color: white; border: none; font-weight: bold; }}
        QPushButton#send:disabled {{ background: {c["border"]}; color: {c["muted"]}; }}
        QPushButton#send[stop="true"] {{ background: #d9534f; }}
        QLabel#muted {{ color: {c["muted"]}; }}
        QLabel#big {{ font-size: 20px; font-weight: bold; }}
    """)
    return c


def chat_css(c: dict) -> str:
    return f"""
    body {{ color: {c["text"]}; }}
    a {{ color: {c["accent"]}; text-decoration: none; }}
    .who {{ margin: 0; }}
    .note, .links, .lang, .stats {{ color: {c["muted"]}; font-size: small; }}
    p.stats {{ margin-top: 2px; }}
    p.cut {{ color: {c["muted"]}; text-align: center; font-style: italic; margin: 10px 0; }}
    div.error {{ color: #c0392b; margin: 8px 0; }}
    div.welcome {{ color: {c["muted"]}; margin: 24px 8px; }}
    div.welcome h2 {{ color: {c["text"]}; }}
    div.msg {{ margin-bottom: 14px; }}
    p.thinkhead {{ margin: 2px 0; font-size: small; }}
    p.toolhead {{ margin: 4px 0; font-size: small; }}
    table.toolcall {{ background: {c["code"]}; border: 1px solid {c["border"]};
                      margin: 2px 0 6px 0; font-size: small; }}
    table.thinking {{ color: {c["muted"]}; border-left: 2px solid {c["border"]};
                      margin: 2px 0 6px 0; }}
    table.code {{ background: {c["code"]}; border: 1px solid {c["border"]}; margin: 6px 0; }}
    td.codehead {{ background: {c["codehead"]}; font-size: small; }}
    pre {{ font-family: monospace; margin: 0; white-space: pre-wrap; }}
    code {{ font-family: monospace; background: {c["code"]}; }}
    """
