"""What a new user meets at the command line: help for every option, no invented prompt, a
missing local path named as such, the models to fetch on a fresh machine, and one line naming
the extra a missing optional dependency comes from."""

import argparse
import subprocess
import sys

import pytest
from synthetic_gguf import write_gguf

from kwker.cli import build_parser, missing_extra
from kwker.models import catalog


def kwker(*args, env=None, stdin=subprocess.DEVNULL, input=None, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "kwker.cli", *args],
        capture_output=True, text=True, env=env, timeout=timeout,
        **({"input": input} if input is not None else {"stdin": stdin}),
    )  # fmt: skip


def test_every_option_of_every_command_has_help():
    commands = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices
    bare = [
        f"{name} {action.dest}"
        for name, sub in commands.items()
        for action in sub._actions
        if not isinstance(action, argparse._HelpAction) and not action.help
    ]
    assert not bare, bare


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", "tiny", "Q8_0")


def test_generate_without_a_prompt_says_so_and_loads_nothing(tiny_gguf):
    r = kwker("generate", str(tiny_gguf))  # stdin empty: no prompt anywhere
    assert r.returncode != 0 and r.stdout == ""
    assert "prompt on standard input is empty" in r.stderr
    assert "[kwker]" not in r.stderr  # no model was loaded


def test_generate_reads_the_prompt_from_standard_input(tiny_gguf, tmp_path):
    env = {**__import__("os").environ, "KWKER_CACHE_DIR": str(tmp_path)}
    args = ("--no-chat", "--max-new-tokens", "5")
    piped = kwker("generate", str(tiny_gguf), *args, input="The sea is\n", env=env)
    given = kwker("generate", str(tiny_gguf), "The sea is", *args, env=env)
    assert piped.returncode == 0 and given.returncode == 0, piped.stderr + given.stderr
    assert piped.stdout == given.stdout and piped.stdout.strip()
    prompt_tokens = [
        e.split("prompt ")[1].split(" tokens")[0] for e in (piped.stderr, given.stderr)
    ]
    assert prompt_tokens[0] == prompt_tokens[1]


@pytest.mark.parametrize("spec", ["./no-such-model", "~/no/such/model", "a/b/c", "no such model"])
def test_a_missing_local_path_is_not_asked_of_the_hub(spec, tmp_path):
    # an endpoint that nothing listens on: a request to it would show as a connection error
    env = {
        **__import__("os").environ,
        "HF_ENDPOINT": "http://127.0.0.1:9",
        "KWKER_CACHE_DIR": str(tmp_path),
        "HF_HOME": str(tmp_path / "hf"),
    }
    r = kwker("generate", spec, "hi", env=env, timeout=60)
    assert r.returncode == 2
    assert "no such file or folder" in r.stderr and "127.0.0.1" not in r.stderr


def test_models_list_on_a_fresh_machine_names_what_can_be_fetched(tmp_path):
    env = {
        **__import__("os").environ,
        "KWKER_CACHE_DIR": str(tmp_path / "cache"),
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_CACHE": str(tmp_path / "hf" / "hub"),
        "HF_HUB_OFFLINE": "1",
    }
    r = kwker("models", "list", env=env)
    assert r.returncode == 0 and "no models" in r.stderr
    rows = {line.split("\t")[0] for line in r.stdout.splitlines()[2:]}
    assert rows == {e.id for e in catalog.catalog()}
    assert "kwker models download NAME" in r.stdout


@pytest.mark.parametrize(
    ("module", "extra"),
    [("fastapi", "serve"), ("uvicorn.config", "serve"), ("torch", "hf"), ("llama_cpp", "bench")],
)
def test_a_missing_optional_dependency_names_its_extra(module, extra):
    line = missing_extra(ModuleNotFoundError(f"No module named '{module}'", name=module))
    assert line.endswith(f'pip install "kwker[{extra}]"')
    assert missing_extra(ModuleNotFoundError("x", name="numpy")) is None  # a real breakage


def test_serve_without_the_serve_extra_is_one_line(tmp_path):
    # fastapi made unimportable in the child, as on an install without the extra
    code = (
        "import sys; sys.modules['fastapi'] = None\n"
        "from kwker.cli import main\n"
        "sys.exit(main(['serve', '--port', '0']))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        'kwker: this needs fastapi, from the "serve" extra: pip install "kwker[serve]"'
    ]
