"""Chat templates rendered as transformers renders them (`apply_chat_template`), without it.

A chat template is Jinja from the model's files, so untrusted code: it runs in Jinja's immutable
sandbox, with the environment transformers 5.24 gives it (`_compile_jinja_template` in
transformers.utils.chat_template_utils): trim_blocks and lstrip_blocks, the loop controls
(`break`, `continue`), `{% generation %}` blocks (rendered as their body; transformers tracks
them only for assistant masks), a `tojson` that leaves non-ASCII text as it is and takes indent,
separators and sort_keys, `raise_exception(message)`, `strftime_now(format)`, and `dict` and
`namespace` that refuse underscore names. Its inputs are rebuilt from plain JSON types first, as
transformers rebuilds them, so that no object with methods reaches the template.

    text = render_chat(template, messages, tools=tools, add_generation_prompt=True,
                       bos_token="<s>", enable_thinking=False)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache

# a message's reasoning under the names templates read it by: the first is the standard one
# (Qwen's), "thinking" gpt-oss's; transformers fills both from whichever is given
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def render_chat(
    template: str,
    messages: list[dict],
    *,
    tools: list[dict] | None = None,
    documents: list[dict] | None = None,
    add_generation_prompt: bool = False,
    **variables,
) -> str:
    """The text `template` makes of one conversation. tools: JSON schemas (OpenAI's
    {"type": "function", "function": {...}}); documents: {title, text} dicts; variables: the
    template's own (the special tokens, enable_thinking, ...). Raises jinja2's TemplateError
    (raise_exception's too) or a TypeError for inputs of the wrong shape."""
    if not messages:
        raise ValueError("cannot apply a chat template to an empty conversation")
    if tools is not None and not all(isinstance(t, dict) for t in tools):
        raise TypeError("tools are JSON schemas (dicts)")
    if documents is not None and not all(isinstance(d, dict) for d in documents):
        raise TypeError("documents are dicts with 'title' and 'text' keys")
    chat = []
    for message in messages:
        if not isinstance(message, Mapping):
            raise TypeError(f"chat messages are dicts, not {message!r}")
        # a None value is left out: templates test for a missing key, and would write "None"
        chat.append(_plain({k: v for k, v in message.items() if v is not None}))
    return _compiled(template).render(
        messages=_with_reasoning_aliases(chat),
        tools=_plain(tools),
        documents=_plain(documents),
        add_generation_prompt=add_generation_prompt,
        **_plain(variables),
    )


def _with_reasoning_aliases(chat: list[dict]) -> list[dict]:
    out = []
    for message in chat:
        reasoning = next(
            (message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None
        )
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def _plain(value):
    """`value` rebuilt from JSON's types (transformers' _plain_template_data): anything else is
    replaced by a placeholder naming its type, "<ndarray>"; numpy scalars become Python's."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):  # subclasses (enums) carry methods
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if type(value).__module__ == "numpy" and hasattr(value, "item") and value.ndim == 0:
        return _plain(value.item())  # np.bool_(False) would be a truthy placeholder
    if callable(getattr(value, "model_dump", None)):  # a pydantic model
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


def _raise_exception(message):
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Jinja's own tojson escapes HTML characters, which a prompt must not have
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format):
    return datetime.now().strftime(format)


class _TemplateDict:
    """`dict` in a template: builds dicts, and gives no way to dict's class attributes."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


@lru_cache(maxsize=16)
def _compiled(template: str):
    import jinja2.ext
    import jinja2.nodes
    import jinja2.utils
    from jinja2.exceptions import SecurityError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """{% generation %}...{% endgeneration %}: the assistant's part, rendered as it is."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_body")
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class Namespace(jinja2.utils.Namespace):
        """namespace() without underscore attributes, which lead to CPython's internals."""

        def __init__(*args, **kwargs):  # Jinja's signature, so that namespace(self=...) works
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise SecurityError(
                    f"chat templates cannot store underscore attributes on a namespace: {name!r}"
                )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals.update(
        raise_exception=_raise_exception,
        strftime_now=_strftime_now,
        dict=_TemplateDict(),
        namespace=Namespace,
    )
    return env.from_string(template)
