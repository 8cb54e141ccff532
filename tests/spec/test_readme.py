"""The README's promises: its two set-up commands are what CI runs, its examples print what it
shows, its links lead somewhere, and the layout in docs/development.md matches the tree."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_spec_examples import markdown_examples, run_examples

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
pytestmark = pytest.mark.slow  # the examples load the default model


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_the_test_command_is_what_ci_runs():
    run_it, test_it = (b.strip() for b in blocks(README, "bash")[:2])
    assert run_it.endswith('pip install ".[chat]" && kwker-chat')
    assert test_it.endswith('pip install ".[test]" && python -m pytest')
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install ".[test]" && python -m pytest' in ci


def test_the_command_line_example_prints_what_the_readme_shows(tmp_path):
    (command,) = [b.strip() for b in blocks(README, "bash") if b.startswith("kwker generate")]
    shown = re.search(re.escape(command) + r"\n```\s*```text\n(.*?)```", README, re.S).group(1)
    prompt = re.fullmatch(r'kwker generate "(.*)"', command).group(1)
    r = subprocess.run(
        [sys.executable, "-m", "kwker.cli", "generate", prompt],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == shown.strip()


def test_the_python_example_prints_what_the_readme_shows():
    examples = markdown_examples(README)
    assert len(examples) == 1 and "kwker.load(" in examples[0][0]
    run_examples(examples)


def test_every_docs_page_is_linked_and_every_link_leads_to_a_file():
    links = set(re.findall(r"\]\(([^)#]+)\)", README))
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages <= links, pages - links
    for page in [README, *((ROOT / p).read_text() for p in pages)]:
        for link in re.findall(r"\]\(([^)#:]+)\)", page):
            base = ROOT if page is README else ROOT / "docs"
            assert (base / link).exists(), link


def modules(folder: Path) -> set[str]:
    """A folder's modules and packages, as `name.py` and `name/`."""
    return {
        p.name + ("/" if p.is_dir() else "")
        for p in folder.iterdir()
        if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists()))
        and p.name not in ("__init__.py", "__main__.py")
    }


def is_shim(path: Path) -> bool:
    """An old module name kept for a release: it only warns and re-exports."""
    return path.is_file() and "moved_module(" in path.read_text()


@pytest.mark.parametrize(
    ("bullet", "folders"),
    [("`engine/kwker/`", ["engine/kwker"]), ("`app/`", ["app", "app/views"])],
)
def test_the_layout_names_the_tree(bullet, folders):
    """docs/development.md's layout names each module and package of these folders (`name.py`,
    `name/`), old names kept for a release aside, and nothing that is not there."""
    text = (ROOT / "docs" / "development.md").read_text()
    layout = text[text.index("## Layout") :]
    section = layout[layout.index(bullet) + len(bullet) :].split("\n- ", 1)[0]
    named = set(re.findall(r"`([a-z_0-9]+(?:\.py|/))`", section))
    present = set().union(*(modules(ROOT / f) for f in folders))
    shims = {m for f in folders for m in modules(ROOT / f) if is_shim(ROOT / f / m)}
    anywhere = {p.name for f in folders for p in (ROOT / f).rglob("*")} | {
        p.name + "/" for f in folders for p in (ROOT / f).rglob("*") if p.is_dir()
    }
    assert named <= anywhere, sorted(named - anywhere)  # a submodule may be named too
    assert present - shims <= named, sorted(present - shims - named)
