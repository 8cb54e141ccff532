"""The window's right column: the Statistics and Settings tabs, at a bounded width."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QScrollArea, QTabWidget

from kwker.app.views.settings_panel import SettingsPanel
from kwker.app.views.stats_panel import StatsPanel

WIDTH = 340  # the panel's width, unless the screen is narrow
MIN_WIDTH = 260


class SidePanel(QTabWidget):
    def __init__(self):
        super().__init__()
        self.stats = StatsPanel()
        self.settings_panel = SettingsPanel()
        # The settings are a long form: they scroll, so that the window fits a laptop's screen
        self.settings_tab = QScrollArea()
        self.settings_tab.setWidget(self.settings_panel)
        self.settings_tab.setWidgetResizable(True)
        self.settings_tab.setFrameShape(QScrollArea.NoFrame)
        self.settings_tab.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.addTab(self.stats, "Statistics")
        self.addTab(self.settings_tab, "Settings")
        # a bounded width: the figures change while an answer streams, and a panel that followed
        # its longest line squeezed the chat mid-answer; its rows wrap instead
        self.setMinimumWidth(MIN_WIDTH)
        self.setMaximumWidth(WIDTH)
