"""kwker-chat names the system packages Qt's X11 platform lacks, instead of Qt's abort."""

from kwker.app import system_check


def test_missing_xcb_libraries_are_named_by_their_packages(monkeypatch):
    monkeypatch.setattr(system_check.sys, "platform", "linux")
    monkeypatch.setenv("DISPLAY", ":0")
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    present = {"xcb-cursor", "xcb-image", "xcb-render-util", "xkbcommon-x11"}
    missing = system_check.missing_xcb_packages(lambda lib: lib if lib in present else None)
    assert missing == ["libxcb-icccm4", "libxcb-keysyms1"]
    assert "sudo apt install libxcb-icccm4 libxcb-keysyms1" in system_check.xcb_message(missing)


def test_other_platforms_need_nothing(monkeypatch):
    monkeypatch.setattr(system_check.sys, "platform", "linux")
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")
    assert system_check.missing_xcb_packages(lambda lib: None) == []
    monkeypatch.setenv("QT_QPA_PLATFORM", "wayland")
    assert system_check.missing_xcb_packages(lambda lib: None) == []


def test_no_display_is_said_plainly_not_aborted(tmp_path):
    """Without DISPLAY or WAYLAND_DISPLAY, Qt would abort (rc 134, SIGABRT) with a wrong xcb
    hint."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env.pop("QT_QPA_PLATFORM", None)
    env["KWKER_DATA_DIR"] = str(tmp_path)
    code = "import sys; from kwker.app import main; sys.exit(main([]))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 1
    assert "needs a display" in r.stderr and "kwker generate" in r.stderr
    assert "xcb" not in r.stderr
