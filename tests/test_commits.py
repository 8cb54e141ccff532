"""Commit subjects stay short (issue 51): at most 72 characters, figures and reasons in the body.
The repo's commit-msg hook refuses a longer one, and this checks the commits since the last tag,
so that a commit made without the hook is caught too."""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HOOK = ROOT / ".githooks" / "commit-msg"
LIMIT = 72
# Where the rule began, for a clone that carries no tags
RULE_START = "74fbd0f"


def git(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def test_subjects_since_the_last_tag_fit():
    if git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout (an sdist): there are no commits to check")
    tag = git("describe", "--tags", "--abbrev=0").stdout.strip()
    base = tag if tag else RULE_START
    listed = git("log", "--format=%h %s", f"{base}..HEAD")
    if listed.returncode != 0:  # a shallow clone without the base: its newest commit at least
        listed = git("log", "-1", "--format=%h %s")
    long = [line for line in listed.stdout.splitlines() if len(line.split(" ", 1)[1]) > LIMIT]
    assert not long, "subjects over 72 characters:\n" + "\n".join(long)


@pytest.mark.parametrize(
    ("message", "accepted"),
    [
        ("Short subject\n\nA body that runs long " + "x" * 200 + "\n", True),
        ("y" * 72 + "\n", True),
        ("y" * 73 + "\n", False),
        ("Subject\nno blank line before the body\n", False),
        ("# a comment git strips\nSubject\n", True),
    ],
)
def test_the_hook_refuses_a_long_subject(tmp_path, message, accepted):
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message)
    r = subprocess.run(["sh", str(HOOK), str(path)], capture_output=True, text=True)
    assert (r.returncode == 0) == accepted, r.stderr
