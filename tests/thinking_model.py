"""A tiny random Qwen3 that speaks a thinking model's chat template: SmolLM2's tokenizer (its
ChatML turns are Qwen's) with Qwen3's `<think>` and `</think>` added as plain tokens, and Qwen3's
own chat template's thinking logic (Qwen/Qwen3-8B's tokenizer_config.json, without its tool
calls): earlier answers lose their reasoning, the turns after the last question keep it, and
enable_thinking=false writes an empty thinking into the generation prompt."""

import copy

import torch

QWEN3_TEMPLATE = """\
{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n')\
.split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n')\
 + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""


def qwen3_tokenizer(smollm2_tokenizer):
    """SmolLM2's tokenizer as a Qwen3 one: the thinking tags and Qwen3's template."""
    tok = copy.deepcopy(smollm2_tokenizer)
    tok.add_tokens(["<think>", "</think>"])  # plain added tokens, as Qwen3's are
    tok.chat_template = QWEN3_TEMPLATE
    tok.eos_token = "<|im_end|>"
    return tok


def tiny_qwen3(vocab: int, seed: int = 3):
    """A random Qwen3ForCausalLM small enough to load in a moment."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            max_position_embeddings=4096, tie_word_embeddings=True,
        )
    )  # fmt: skip
    with torch.no_grad():  # widened, so that the greedy choice is no accident of scale
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(3.0)
    return model.eval()
