"""A model's own sampling preset: the settings its makers say it answers well at.

Three places may say, and the first that names a setting wins:

1. the GGUF file's `general.sampling.*` keys (llama.cpp's converter writes them from the model's
   generation_config.json);
2. a model folder's `generation_config.json` (transformers' file: do_sample, temperature, ...);
3. the catalog's entry for the model (resources/catalog.json, "preset"): what Kwker measured on
   the models it lists, where the files say nothing or too little (SmolLM2's files name no
   sampling at all, and at temperature 0.7 with no repetition penalty it loops: perf-notes #41).

What none of them names keeps the app's default. A user's own setting beats all of this (the
app's settings keep only the values a user changed; kwker.app.settings).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kwker.loading.sampling_defaults import checked

CATALOG = "Kwker's catalog"  # where a value came from, as the settings panel says it


@dataclass
class Preset:
    values: dict = field(default_factory=dict)  # setting -> value
    sources: dict = field(default_factory=dict)  # setting -> GGUF / GENERATION_CONFIG / CATALOG

    def merge_under(self, values: dict, source: str) -> None:
        """Adds `values` for the settings this preset does not name yet."""
        for key, value in values.items():
            if key not in self.values:
                self.values[key], self.sources[key] = value, source


def model_preset(decoder, spec: str | None) -> Preset:
    """The preset of a loaded decoder (its files' own, `decoder.sampling_defaults`: see
    kwker.loading.load) over the catalog's entry for `spec` (a hub id)."""
    from kwker.models.catalog import entry

    preset = Preset()
    source, values = getattr(decoder, "sampling_defaults", (None, {}))
    if source:
        preset.merge_under(values, source)
    listed = entry(spec) if spec else None
    if listed is not None and listed.preset:
        preset.merge_under(checked(listed.preset), CATALOG)
    return preset


def looped(tokens: list[int], cap: int, n: int = 8, times: int = 4) -> bool:
    """Whether an answer looped: it ran to the token cap with some run of n tokens in it `times`
    times or more (what a model stuck repeating itself leaves; a long list or table that merely
    reaches the cap does not repeat 8 tokens 4 times over)."""
    if len(tokens) < cap:
        return False
    seen: dict[tuple, int] = {}
    for i in range(len(tokens) - n + 1):
        gram = tuple(tokens[i : i + n])
        seen[gram] = seen.get(gram, 0) + 1
        if seen[gram] >= times:
            return True
    return False
