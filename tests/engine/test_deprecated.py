"""The old paths and names of the torch wing and of the file loader keep working for one release:
each warns DeprecationWarning at the line that used it and gives the new object."""

import sys

import pytest
import synthetic_gguf as sg
from helpers import tiny_llama

import kwker.hf.compiled
import kwker.hf.decoder
import kwker.hf.generate
import kwker.hf.torch_ops
import kwker.loading.build
import kwker.loading.load

# old module -> (its new module, names it gives: its own and, last, one it forwards)
MOVED = {
    "kwker.decode": (kwker.hf.decoder, ["KwkDecoder", "install", "uninstall", "build_step"]),
    "kwker.compiled": (kwker.hf.compiled, ["CompiledDecoder", "package_key", "weights_hash"]),
    "kwker.hf_generate": (kwker.hf.generate, ["attach", "installed", "_fallback_reason"]),
    "kwker.torch_ops": (kwker.hf.torch_ops, ["install", "installed", "uninstall", "_state"]),
}


def import_afresh(name: str):
    """Imports the module `name` as a first import does (its body runs, and warns, again)."""
    sys.modules.pop(name, None)
    with pytest.warns(DeprecationWarning, match=f"{name} is now ") as said:
        __import__(name)  # an import statement's path (importlib.import_module's frame is seen)
    module = sys.modules[name]
    assert len(said) == 1
    return module, said[0]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_warns_and_gives_the_new_objects(old):
    new, names = MOVED[old]
    module, warning = import_afresh(old)
    assert f"{old} is now {new.__name__}" in str(warning.message)
    assert warning.filename == __file__  # the importing line, not importlib's
    for name in names:
        assert getattr(module, name) is getattr(new, name), name


def test_the_old_names_warn_and_work():
    decode, _ = import_afresh("kwker.decode")
    assert decode.default_threads is kwker.loading.build.default_threads
    with pytest.warns(DeprecationWarning, match="runner_unsupported is now .*unsupported_reason"):
        runner_unsupported = decode.runner_unsupported
    assert runner_unsupported is kwker.hf.decoder.unsupported_reason
    assert runner_unsupported(tiny_llama(), 64) is None
    assert "positive integer" in runner_unsupported(tiny_llama(), 0)
    compiled, _ = import_afresh("kwker.compiled")
    for module in (decode, compiled):
        with pytest.warns(DeprecationWarning, match="Decoder is now .*hf.compiled.CompiledDecoder"):
            assert module.Decoder is kwker.hf.compiled.CompiledDecoder
    with pytest.warns(DeprecationWarning, match="load_decoder is now .*load_files") as said:
        from kwker.loading.load import load_decoder
    assert load_decoder is kwker.loading.load.load_files and said[0].filename == __file__
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        kwker.loading.load.nothing  # noqa: B018


def test_the_old_file_loader_loads_what_the_new_one_does(tmp_path):
    path = sg.write_gguf(tmp_path / "Tiny-Q8_0.gguf", "tiny", "Q8_0", seed=2)
    with pytest.warns(DeprecationWarning):
        old = kwker.loading.load.load_decoder(path, 64, cache=False)
    new = kwker.loading.load.load_files(path, 64, cache=False)
    prompt = [5, 9, 33, 102, 7]
    ours, theirs = (d.generate(prompt, max_new_tokens=12, min_new_tokens=12) for d in (old, new))
    assert ours.tolist() == theirs.tolist() and ours.shape == (1, 17)


def test_kwker_modules_on_old_paths_fail_under_pytest():
    """pyproject turns kwker's own DeprecationWarnings into errors: a kwker module left on an old
    path fails the suite rather than warning unseen."""
    module = type(sys)("kwker.still_on_the_old_path")
    code = "def late():\n    from kwker.loading.load import load_decoder\n"
    exec(compile(code, "<kwker.still_on_the_old_path>", "exec"), module.__dict__)
    with pytest.raises(DeprecationWarning, match="load_decoder is now"):
        module.late()
