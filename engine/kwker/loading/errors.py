"""The one error a model's files raise when they cannot be loaded as they are.

Every reader of model files (kwker.loading.gguf_file, .config, .sources, .build) raises it or a
subclass of it, so a caller that catches BadModelFile catches every damaged, lying or unsupported
file, and nothing else: any other exception from a load is a bug in Kwker, not in the file.
"""

from __future__ import annotations


class BadModelFile(ValueError):
    """A model file that cannot be loaded as it is; the message names the file and what in it is
    wrong (the tensor, the header field)."""
