#!/usr/bin/env python3
"""Writes tests/fixtures/chat/: conversations rendered by transformers' apply_chat_template (Jinja2).

    pip install transformers tokenizers jinja2 && python3 scripts/make_chat_fixture.py

One folder a template family. Its tokenizer_config.json holds the family's real chat_template
string, as the released checkpoint's tokenizer_config.json holds it, and its bos/eos tokens.
The five first families' templates are written from the strings below; the others' are read
from their committed tokenizer_config.json, copied from the public sources SOURCES names (the
Hub itself cannot be reached from here). cases.json holds, for 4+ conversations a family
(with and without a system message, multi-turn, tool calls where the template takes tools,
content as a list of text parts where it reads them, add_generation_prompt), what apply_chat_template gives: the text, or the error the template
raises; the ids tokenizer.json gives for the text (tokenized as apply_chat_template does, no
special tokens added; checked against tokenize=True where the family's bos/eos are in the
stand-in's vocabulary, as AutoTokenizer adds them otherwise) and the assistant mask. The tokenizer is
a stand-in from tests/fixtures/tokenizers/ (the families' own tokenizers are not fixtures):
the template's text is what is compared, and its ids with a real tokenizer of the same kind.

strftime_now returns DATE (transformers' datetime.now() is patched), recorded as "date".

The mask (1 = the token carries loss):
- templates with {% generation %} blocks: transformers' return_assistant_tokens_mask.
- others, by rendering prefixes: for each assistant message k of the conversation M, with T
  the whole text, the trained span starts after render(M[:k], add_generation_prompt=True)
  (or, where T does not start with that, after render(M[:k]); where neither is a prefix of T,
  as Mistral's templates move the system message to the last user turn, at the content's first
  occurrence after the previous span and after the previous message's content). It ends where the next message begins, render(M[:k+1]),
  when T starts with that; else after the content (stripped) and the text the template writes
  after it in render(M[:k+1]), when T has both there; for a message without content (a tool
  call), after the longest end of render(M[:k+1]) that T continues with at the span's start
  (Qwen3 writes a <think> block in the last assistant turn only); else at the last whitespace
  before T and render(M[:k+1]) differ. Trailing whitespace is not trained.
  A token carries loss when it holds a character of a span (return_assistant_tokens_mask's
  rule: from the token holding the span's first character to the one holding its last).
alpaca.json holds Alpaca rows with the prompt Stanford Alpaca's train.py formats for them.
tests/test_chat_data.cpp checks our rendering, ids and masks against these.
"""
import datetime as real_datetime
import json
import os
import shutil
import tempfile

import transformers.utils.chat_template_utils as chat_template_utils
from tokenizers import Tokenizer
from transformers import AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "chat")
DATE = real_datetime.datetime(2024, 7, 26, 12, 0, 0)


class FixedDatetime(real_datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return DATE


chat_template_utils.datetime = FixedDatetime

# The chat_template strings as the checkpoints' tokenizer_config.json files hold them.
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# Qwen/Qwen2-*-Instruct.
QWEN2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
         "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
         "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
         "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# meta-llama/Llama-2-7b-chat-hf.
LLAMA2 = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
          "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
          "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
          "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
          "{% if loop.index0 == 0 and system_message != false %}"
          "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
          "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
          "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
          "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")
# meta-llama/Meta-Llama-3-8B-Instruct.
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}"
          "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] "
          "| trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
          "{{ content }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
# HuggingFaceH4/zephyr-7b-beta.
ZEPHYR = ("{% for message in messages %}\n{% if message['role'] == 'user' %}\n"
          "{{ '<|user|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n"
          "{{ '<|system|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n"
          "{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n"
          "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}")
# A template using a construct the interpreter does not run ({% call %} blocks).
UNSUPPORTED = ("{% macro turn(role) %}<|{{ role }}|>{{ caller() }}{% endmacro %}"
               "{% for message in messages %}{% call turn(message['role']) %}{{ message['content'] }}{% endcall %}"
               "{% endfor %}")

# stanford_alpaca's train.py PROMPT_DICT; the output follows the prompt directly.
ALPACA_PROMPTS = {
    "prompt_input": (
        "Below is an instruction that describes a task, paired with an input that provides further context. "
        "Write a response that appropriately completes the request.\n\n"
        "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:"
    ),
    "prompt_no_input": (
        "Below is an instruction that describes a task. "
        "Write a response that appropriately completes the request.\n\n"
        "### Instruction:\n{instruction}\n\n### Response:"
    ),
}
ALPACA_ROWS = [
    {"instruction": "Give three tips for staying healthy.", "output": "Eat well, sleep, move."},
    {"instruction": "Translate to French.", "input": "Good morning", "output": "Bonjour"},
    {"instruction": "Name a colour.", "input": "", "output": "Blue"},
]

HF = "huggingface/huggingface.js "
AUTOMAP = HF + "packages/ollama-utils/src/chat-template-automap.ts (the GGUF's copy of the template, Ollama "
E2E = HF + "packages/jinja/test/e2e.test.js (key "
# name: (template written here or None: read the committed one, tokenizer fixture, bos, eos, the model, where
# its template text was copied from, which conversations it takes: "tools" / "tools_str" / None).
FAMILIES = {
    "chatml": (CHATML, "qwen2", None, "<|im_end|>", "generic ChatML", "written here", None),
    "qwen2": (QWEN2, "qwen2", None, "<|im_end|>", "Qwen/Qwen2-7B-Instruct", "written here", None),
    "llama2": (LLAMA2, "llama2", "<s>", "</s>", "meta-llama/Llama-2-7b-chat-hf", "written here", None),
    "llama3": (LLAMA3, "llama3", "<|begin_of_text|>", "<|eot_id|>", "meta-llama/Meta-Llama-3-8B-Instruct",
               "written here", None),
    "zephyr": (ZEPHYR, "llama2", "<s>", "</s>", "HuggingFaceH4/zephyr-7b-beta", "written here", None),
    "llama3_1": (None, "llama3", None, None, "meta-llama/Llama-3.1-8B-Instruct",
                 E2E + "meta-llama/Llama-3.1-8B-Instruct); the same text in " + AUTOMAP + "library/llama3.1:8b)",
                 "tools"),
    "llama3_2": (None, "llama3", None, None, "meta-llama/Llama-3.2-3B-Instruct", AUTOMAP + "library/llama3.2:3b)",
                 "tools"),
    "mistral_v1": (None, "mistral", None, None, "mistralai/Mistral-7B-Instruct-v0.1",
                   E2E + "TheBloke/Mistral-7B-Instruct-v0.1-GPTQ, a copy of its tokenizer_config.json); the same "
                   "text in " + AUTOMAP + "library/mistral:7b-instruct-fp16)", None),
    "mistral_v3": (None, "mistral", None, None, "mistralai/Mistral-7B-Instruct-v0.3",
                   E2E + "mistralai/Mistral-7B-Instruct-v0.3 (JSON Schema))", "tools"),
    "mistral_nemo": (None, "mistral", None, None, "mistralai/Mistral-Nemo-Instruct-2407",
                     E2E + "mistralai/Mistral-Nemo-Instruct-2407)", "tools"),
    "qwen2_5": (None, "qwen2", None, None, "Qwen/Qwen2.5-7B-Instruct", E2E + "Qwen/Qwen2.5-7B-Instruct)", "tools"),
    "qwen3": (None, "qwen2", None, None, "Qwen/Qwen3-0.6B",
              E2E + "Qwen/Qwen3-0.6B); the same text in " + AUTOMAP + "library/qwen3:0.6b)", "tools"),
    "gemma2": (None, "llama2", None, None, "google/gemma-2-2b-it", AUTOMAP + "library/gemma2:2b)", None),
    "gemma3": (None, "llama2", None, None, "google/gemma-3-1b-it", AUTOMAP + "library/gemma3:1b)", None),
    "phi3": (None, "llama2", None, None, "microsoft/Phi-3-mini-4k-instruct", AUTOMAP + "library/phi3:3.8b)", None),
    "phi3_5": (None, "llama2", None, None, "microsoft/Phi-3.5-mini-instruct", AUTOMAP + "library/phi3.5:3.8b)", None),
    "deepseek_r1": (None, "qwen2", None, None, "deepseek-ai/DeepSeek-R1", E2E + "deepseek-ai/DeepSeek-R1)",
                    "tools_str"),
    "deepseek_v3": (None, "qwen2", None, None, "deepseek-ai/DeepSeek-V3", AUTOMAP + "library/deepseek-v3:671b)",
                    "tools_str"),
    "granite3_1": (None, "gpt_neox", None, None, "ibm-granite/granite-3.1-1b-a400m-instruct",
                   AUTOMAP + "library/granite3.1-moe:1b)", "tools"),
    "smollm2": (None, "qwen2", None, None, "HuggingFaceTB/SmolLM2-135M-Instruct", AUTOMAP + "library/smollm2:135m)",
                None),
    "smollm3": (None, "qwen2", None, None, "HuggingFaceTB/SmolLM3-3B", E2E + "HuggingFaceTB/SmolLM3-3B)", None),
}

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city today.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city's name"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}]


def tool_conversation(arguments):
    call = {"id": "call12345", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    return [{"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "{\"celsius\": 21}"},
            {"role": "assistant", "content": "It is 21 °C in Paris."}]


# (messages, add_generation_prompt, tools)
CONVERSATIONS = [
    ([{"role": "user", "content": "Summarize: Alice met Bob at the station."},
      {"role": "assistant", "content": "Alice and Bob met."}], False, None),
    ([{"role": "system", "content": "You are a terse assistant."},
      {"role": "user", "content": "What is 12 + 30?"},
      {"role": "assistant", "content": "42"},
      {"role": "user", "content": "And doubled?"},
      {"role": "assistant", "content": "It is 84, twice 42."}], False, None),
    ([{"role": "user", "content": "  Write two lines about tea.\n"},
      {"role": "assistant", "content": " Green tea, hot.\nA quiet café. "},
      {"role": "user", "content": "Now one word."},
      {"role": "assistant", "content": "Steam"},
      {"role": "user", "content": "Thanks!"},
      {"role": "assistant", "content": "You're welcome."}], False, None),
    ([{"role": "system", "content": "Answer in French.\nBe brief."},
      {"role": "user", "content": "Hello"},
      {"role": "assistant", "content": "Bonjour !"}], False, None),
    ([{"role": "user", "content": "Name a prime number."},
      {"role": "assistant", "content": "7"},
      {"role": "user", "content": "Another one?"}], True, None),
    # The replies' words in the question before them, with a system message Mistral moves.
    ([{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Answer Yes or No: is the sky blue?"},
      {"role": "assistant", "content": "Yes"},
      {"role": "user", "content": "Sure?"},
      {"role": "assistant", "content": "Yes"}], False, None),
]
# Content as a list of parts (transformers' multimodal layout): Gemma 3's template takes a
# system message only so, and reads text parts from any message.
def parts(text):
    return [{"type": "text", "text": text}]


PARTS_CONVERSATIONS = [
    ([{"role": "system", "content": parts("Be brief.")},
      {"role": "user", "content": parts("Hello")},
      {"role": "assistant", "content": parts("Hi!")}], False, None),
    ([{"role": "system", "content": parts("Answer in French.")},
      {"role": "user", "content": "Hello"},
      {"role": "assistant", "content": "Bonjour !"},
      {"role": "user", "content": parts("Thanks")}], True, None),
]
PARTS_FAMILIES = {"gemma3"}
TOOL_CONVERSATIONS = {"tools": (tool_conversation({"city": "Paris"}), False, TOOLS),
                      "tools_str": (tool_conversation("{\"city\": \"Paris\"}"), False, TOOLS)}


def write_config(folder, template, bos, eos):
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template, "eos_token": eos}
    if bos is not None:
        config["bos_token"] = bos
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=1, ensure_ascii=False)
        f.write("\n")


def render(tokenizer, messages, add_generation_prompt, tools):
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)


def try_render(tokenizer, messages, add_generation_prompt, tools):
    try:
        return render(tokenizer, messages, add_generation_prompt, tools)
    except Exception:  # the template refused this prefix: no rendering to align with
        return None


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def longest_tail_at(text, start, rendered):
    """The length of the longest non-empty end of `rendered` that text continues with at start (0: none)."""
    for q in range(len(rendered)):
        if text.startswith(rendered[q:], start):
            return len(rendered) - q
    return 0


def message_text(message):
    """The content's text: the string, or its text parts joined."""
    content = message.get("content") or ""
    if isinstance(content, list):
        return "".join(part["text"] for part in content if part.get("type") == "text")
    return content


def prefix_spans(tokenizer, messages, text, tools):
    """[start, end) character spans of each assistant turn's trained text (see the module doc)."""
    spans = []
    cursor = 0  # where the previous span ended
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        content = message_text(message).strip()
        start = None
        for before in ([try_render(tokenizer, messages[:k], True, tools), try_render(tokenizer, messages[:k], False, tools)]
                       if k else []):
            if before is not None and text.startswith(before) and len(before) >= cursor:
                start = len(before)
                break
        if start is None:  # the template moves text around (Mistral puts the system message last): find the content
            # after the message before it (the user's turn, a tool's result), whose text may hold the reply's words
            previous = message_text(messages[k - 1]).strip() if k else ""
            previous_at = text.find(previous, cursor) if previous else -1
            start = text.find(content, previous_at + len(previous) if previous_at >= 0 else cursor) if content else -1
            if start < 0:
                raise ValueError(f"assistant message {k}: its content is not in the rendered text")
        through = render(tokenizer, messages[:k + 1], False, tools)
        after = through[through.rfind(content) + len(content):].rstrip() if content and content in through else None
        found = text.find(content, start) if content else -1
        if text.startswith(through) and len(through) > start:
            end = len(through)
        elif after is not None and found >= 0 and text.startswith(after, found + len(content)):
            end = found + len(content) + len(after)
        elif not content and (tail := longest_tail_at(text, start, through.rstrip())):
            end = start + tail
        else:
            shared = max(common_prefix(text, through), start)
            cut = max(text.rfind(c, start, shared) for c in " \t\n\r")
            end = cut + 1 if cut >= start else start
        end = start + len(text[start:end].rstrip())
        if end > start:
            spans.append((start, end))
        cursor = max(cursor, end)
    return spans


def mask_of(offsets, spans):
    """return_assistant_tokens_mask's rule: tokens holding a span's first through last character."""
    mask = [0] * len(offsets)
    for start, end in spans:
        holding = [i for i, (s, e) in enumerate(offsets) if s < end and e > start]
        for i in holding:
            mask[i] = 1
    return mask


def case(tokenizer, raw_tokenizer, specials_in_vocab, template, messages, add_generation_prompt, tools):
    record = {"messages": messages, "add_generation_prompt": add_generation_prompt}
    if tools is not None:
        record["tools"] = tools
    try:
        text = render(tokenizer, messages, add_generation_prompt, tools)
    except Exception as error:  # the template raises (e.g. Gemma takes no system message)
        record["error"] = str(error)
        return record
    # The ids tokenizer.json gives the text, as apply_chat_template tokenizes it (no special tokens added).
    # AutoTokenizer gives the same where the config's bos/eos are in the stand-in's vocabulary; elsewhere it
    # appends them as new tokens, which a real tokenizer of the family would not need.
    encoding = raw_tokenizer.encode(text, add_special_tokens=False)
    ids, offsets = encoding.ids, encoding.offsets
    if specials_in_vocab:  # apply_chat_template(tokenize=True) gives the same ids: checked, not assumed.
        direct = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True,
                                               add_generation_prompt=add_generation_prompt)
        direct = direct["input_ids"] if isinstance(direct, dict) or hasattr(direct, "keys") else direct
        assert list(direct) == ids
    if "{% generation %}" in template or "{%- generation" in template or "{% generation -%}" in template:
        out = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
                                            return_assistant_tokens_mask=True,
                                            add_generation_prompt=add_generation_prompt)
        assert specials_in_vocab and list(out["input_ids"]) == ids
        mask = list(out["assistant_masks"])
    else:
        mask = mask_of(offsets, prefix_spans(tokenizer, messages, text, tools))
    record.update({"text": text, "ids": ids, "mask": mask})
    return record


def main():
    for name, (template, tokenizer_name, bos, eos, model, source, tool_kind) in FAMILIES.items():
        folder = os.path.join(OUT, name)
        if template is not None:
            write_config(folder, template, bos, eos)
        with open(os.path.join(folder, "tokenizer_config.json")) as f:
            template = json.load(f)["chat_template"]
        with tempfile.TemporaryDirectory() as scratch:
            shutil.copy(os.path.join(ROOT, "tests", "fixtures", "tokenizers", tokenizer_name, "tokenizer.json"), scratch)
            shutil.copy(os.path.join(folder, "tokenizer_config.json"), scratch)
            tokenizer = AutoTokenizer.from_pretrained(scratch)
            raw_tokenizer = Tokenizer.from_file(os.path.join(scratch, "tokenizer.json"))
            vocab = raw_tokenizer.get_vocab()
            specials_in_vocab = all(token in vocab for token in tokenizer.special_tokens_map.values()
                                    if isinstance(token, str))
            conversations = CONVERSATIONS + ([TOOL_CONVERSATIONS[tool_kind]] if tool_kind else []) + \
                (PARTS_CONVERSATIONS if name in PARTS_FAMILIES else [])
            cases = [case(tokenizer, raw_tokenizer, specials_in_vocab, template, *c) for c in conversations]
        with open(os.path.join(folder, "cases.json"), "w") as f:
            json.dump({"model": model, "template_source": source, "tokenizer": "tokenizers/" + tokenizer_name,
                       "date": DATE.strftime("%Y-%m-%d"), "cases": cases}, f, ensure_ascii=False)
            f.write("\n")
        print(name, [len(c["ids"]) if "ids" in c else "raises" for c in cases], "tokens,",
              [sum(c["mask"]) if "mask" in c else "-" for c in cases], "trained")
    write_config(os.path.join(OUT, "unknown"), UNSUPPORTED, "<s>", "</s>")
    alpaca = [{"row": row, "prompt": ALPACA_PROMPTS["prompt_input" if row.get("input", "") != "" else
                                                     "prompt_no_input"].format_map(row)} for row in ALPACA_ROWS]
    with open(os.path.join(OUT, "alpaca.json"), "w") as f:
        json.dump(alpaca, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
