"""Every code example in the product spec runs and prints what the page shows."""

import contextlib
import io
import re
from pathlib import Path

HERE = Path(__file__).parent


def page_examples(text: str) -> list[tuple[str, str]]:
    """(code, expected output) pairs of generate-text.txt: a block opens on a line starting
    'Python', ends at 'Output', and its output runs to the next blank line."""
    lines = text.splitlines()
    examples, i = [], 0
    while i < len(lines):
        if lines[i].startswith("Python") and "machine" in lines[i]:
            j = lines.index("Output", i)
            code = "\n".join(lines[i + 1 : j])
            k = j + 1
            while k < len(lines) and lines[k].strip():
                k += 1
            examples.append((code, "\n".join(lines[j + 1 : k])))
            i = k
        else:
            i += 1
    return examples


def markdown_examples(text: str) -> list[tuple[str, str]]:
    """(code, expected output) pairs of a Markdown page: a ```python block followed by a ```text
    block."""
    return re.findall(r"```python\n(.*?)```\s*```text\n(.*?)```", text, flags=re.S)


def run_examples(examples):
    namespace: dict = {}
    for code, expected in examples:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, "<spec example>", "exec"), namespace)
        assert out.getvalue().strip() == expected.strip(), code


def test_generate_text_page_examples():
    examples = page_examples((HERE / "generate-text.txt").read_text())
    assert len(examples) == 4
    run_examples(examples)


def test_faster_generation_page_examples():
    examples = markdown_examples((HERE / "faster-generation.md").read_text())
    assert len(examples) == 1
    run_examples(examples)
