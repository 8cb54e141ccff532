"""What Qt's X11 platform needs from the system, checked before the window opens.

PySide6's wheels carry Qt but not the X11 libraries its xcb platform plugin loads. Without them Qt
aborts with "Could not load the Qt platform plugin "xcb"", which names no package. The installers
carry these libraries themselves (packaging/kwker.spec); a pip install relies on the system's.
"""

from __future__ import annotations

import ctypes.util
import os
import sys

# library (as ctypes.util.find_library names it) -> the Debian/Ubuntu package that has it
XCB_LIBRARIES = {
    "xcb-cursor": "libxcb-cursor0",
    "xcb-icccm": "libxcb-icccm4",
    "xcb-keysyms": "libxcb-keysyms1",
    "xcb-image": "libxcb-image0",
    "xcb-render-util": "libxcb-render-util0",
    "xkbcommon-x11": "libxkbcommon-x11-0",
}


def uses_xcb() -> bool:
    """Whether Qt will pick its X11 platform: on Linux, asked for, or on a display without
    Wayland."""
    if not sys.platform.startswith("linux"):
        return False
    asked = os.environ.get("QT_QPA_PLATFORM", "")
    if asked:
        return asked.split(":")[0] == "xcb"
    return bool(os.environ.get("DISPLAY")) and not os.environ.get("WAYLAND_DISPLAY")


def missing_xcb_packages(find=ctypes.util.find_library) -> list[str]:
    """The packages whose libraries Qt's xcb platform would fail to load (none when frozen: the
    installers carry them)."""
    if getattr(sys, "frozen", False) or not uses_xcb():
        return []
    return [package for lib, package in XCB_LIBRARIES.items() if find(lib) is None]


def no_display() -> str | None:
    """Why there is no window to open, or None. On Linux without DISPLAY or WAYLAND_DISPLAY (and
    no platform asked for) Qt would abort (SIGABRT) with a hint about xcb that names the wrong
    cause."""
    if not sys.platform.startswith("linux") or os.environ.get("QT_QPA_PLATFORM"):
        return None
    if os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        return None
    return (
        "kwker-chat needs a display, and this session has none (DISPLAY and WAYLAND_DISPLAY are "
        'unset). Run it from a desktop session; in a terminal, `kwker generate "..."` answers '
        "and `kwker serve` serves a model."
    )


def xcb_message(packages: list[str]) -> str:
    return (
        "kwker-chat cannot open its window: Qt's X11 platform needs system libraries this machine "
        f"lacks. Install them with:\n\n    sudo apt install {' '.join(packages)}\n\n"
        "(Fedora: sudo dnf install xcb-util-cursor xcb-util-wm xcb-util-keysyms xcb-util-image "
        "xcb-util-renderutil libxkbcommon-x11), or use the .deb or the portable bundle, which "
        'carry them. Without a display, `kwker generate "..."` answers in the terminal.'
    )
