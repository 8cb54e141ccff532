"""The engine's layers: a module imports only from its own layer or below, so kwker reads top to
bottom, cli > bench > serve > models > loading > generation > scheduler > sequence > speculative >
runner, sampling and precision. Every module has a layer, and the packages and modules directly
under kwker import each other one way only (a loop between two packages is a loop even when no
module imports itself back)."""

from itertools import pairwise
from pathlib import Path

from import_graph import NATIVE, cycles, imports, module_names

PACKAGE = Path(__file__).resolve().parents[2] / "engine" / "kwker"

# kwker.hf, and its old modules (warning shims for one release)
TORCH_WING = ["kwker.hf", "kwker.decode", "kwker.compiled", "kwker.hf_generate", "kwker.torch_ops"]

# Top to bottom: (layer, the modules in it). A name covers its package's modules too; the most
# specific name wins. New modules get a row here: a test fails on a module with no layer.
LAYERS = [
    # the doors: the command line, and kwker's own __init__ (kwker.load imports from below)
    ("cli", ["kwker", "kwker.cli"]),
    # the benchmark, the quality table, and llama.cpp, their peer
    ("bench", ["kwker.bench", "kwker.quality", "kwker.llama_cpp_amx"]),
    # the HTTP server, the client of such a server (the app's remote backend), their API keys
    ("serve", ["kwker.serve", "kwker.remote", "kwker.api_keys"]),
    ("models", ["kwker.models"]),
    # files -> packed weights, by model family; the torch wing packs a transformers model's
    # weights as loading packs a file's
    ("loading", ["kwker.loading", "kwker.families", "kwker.rope", *TORCH_WING]),
    # a decoder's generation API and what it adds to a chat: tool calls, thinking
    (
        "generation",
        [
            "kwker.generation",
            "kwker.tools",
            "kwker.tool_formats",
            "kwker.tool_constraint",
            "kwker.thinking",
        ],
    ),
    ("scheduler", ["kwker.scheduler"]),
    # a sequence's feed and logits: its grammar, its stream of text and statistics
    ("sequence", ["kwker.sequence", "kwker.constrained", "kwker.streaming", "kwker.speedup"]),
    ("speculative", ["kwker.speculative", "kwker.suffix"]),
    # with the native module, what asks it which kernels run, and the old names' warnings
    (
        "runner, sampling, precision",
        [
            "kwker.runner",
            "kwker.sampling",
            "kwker.precision",
            NATIVE,
            "kwker.cpu_backend",
            "kwker._deprecation",
        ],
    ),
]


def layer_of(name: str, layers=LAYERS) -> int | None:
    """The index in layers (0 the top) of the most specific name covering the module, or None."""
    best = None
    for index, (_, names) in enumerate(layers):
        for covering in names:
            # the root package covers only its own __init__, not every module under it
            inside = name.startswith(covering + ".") and "." in covering
            if (name == covering or inside) and (best is None or len(covering) > len(best[1])):
                best = (index, covering)
    return None if best is None else best[0]


def all_imports(package: Path) -> list[tuple[str, str, str]]:
    """(importer, imported, where: path:line) for every import between kwker's modules."""
    modules = module_names(package)
    return [
        (name, target, f"{path.relative_to(package.parent)}:{line}")
        for name, path in sorted(modules.items())
        if path is not None
        for target, line in imports(name, path, modules)
    ]


def upward_imports(package: Path, layers=LAYERS) -> list[str]:
    """An import of a module from a higher layer, one line each."""
    found = []
    for name, target, where in all_imports(package):
        mine, theirs = layer_of(name, layers), layer_of(target, layers)
        if mine is not None and theirs is not None and theirs < mine:
            found.append(
                f"{name} -> {target} ({where}): {layers[mine][0]} imports from "
                f"{layers[theirs][0]}, above it"
            )
    return found


def unit(name: str) -> str:
    """The package or module directly under kwker that holds the module."""
    return ".".join(name.split(".")[:2])


def package_loops(package: Path) -> list[str]:
    """Each loop between kwker's packages and top-level modules, with an import for each step."""
    graph, example = {}, {}
    for name, target, where in all_imports(package):
        a, b = unit(name), unit(target)
        graph.setdefault(a, set())
        graph.setdefault(b, set())
        if a != b:
            graph[a].add(b)
            example.setdefault((a, b), f"{name} -> {target} ({where})")
    return [
        " -> ".join(loop) + ": " + "; ".join(example[ab] for ab in pairwise(loop))
        for loop in cycles(graph)
    ]


def test_every_module_has_a_layer():
    unplaced = [m for m in sorted(module_names(PACKAGE)) if layer_of(m) is None]
    assert not unplaced, f"place these in LAYERS (test_layers.py): {unplaced}"


def test_every_name_in_the_layers_is_a_module():
    listed = [name for _, names in LAYERS for name in names]
    assert len(listed) == len(set(listed)), "a name in two layers"
    modules = module_names(PACKAGE)
    gone = [n for n in listed if not any(m == n or m.startswith(n + ".") for m in modules)]
    assert not gone, f"no such modules: take them out of LAYERS: {gone}"


def test_every_module_imports_from_its_layer_or_below():
    assert len(all_imports(PACKAGE)) > 100  # the walk sees the package
    upward = upward_imports(PACKAGE)
    assert not upward, "\n".join(upward)


def test_no_loops_between_packages():
    loops = package_loops(PACKAGE)
    assert not loops, "\n".join(loops)


def test_an_upward_import_and_a_package_loop_are_named(tmp_path):
    """The checks on a made-up kwker: a lazy import up a layer, and two packages that import each
    other though no module imports itself back."""
    files = {
        "__init__.py": "",
        "cli.py": "def main():\n    pass\n",
        "runner.py": "import os\n\n\ndef late():\n    from kwker.cli import main\n",
        "bench/__init__.py": "",
        "bench/main.py": "def run():\n    from kwker import quality\n",
        "bench/peers.py": "from . import main as _\n",
        "quality.py": "from kwker.bench.peers import X\nfrom kwker import _native\n",
    }
    package = tmp_path / "kwker"
    for name, text in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    layers = [("cli", ["kwker.cli"]), ("bench", ["kwker.bench", "kwker.quality"])]
    layers += [("runner", ["kwker.runner", NATIVE])]
    assert upward_imports(package, layers) == [
        "kwker.runner -> kwker.cli (kwker/runner.py:5): runner imports from cli, above it"
    ]
    assert package_loops(package) == [
        "kwker.bench -> kwker.quality -> kwker.bench: "
        "kwker.bench.main -> kwker.quality (kwker/bench/main.py:2); "
        "kwker.quality -> kwker.bench.peers (kwker/quality.py:1)"
    ]
    assert layer_of("kwker", layers) is None and layer_of("kwker.bench.main", layers) == 1
