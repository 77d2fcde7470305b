"""Chat template parity: our renderer (minijinja) against Python Jinja2 as
transformers' `apply_chat_template` runs it.

Each conversation in tests/fixtures/templates/conversations.json is rendered
here with transformers, for each template there, and must equal what
expected.json records; the Rust test `chat_template::parity` renders the
same conversations with our renderer and must equal expected.json too, so
the two agree byte for byte (docs/templates.md). After a template or a
conversation changes, FLASHBAR_WRITE_TEMPLATE_EXPECTED=1 rewrites
expected.json from transformers.
"""

import copy
import json
import os
from pathlib import Path

import jinja2
import pytest
from transformers.utils.chat_template_utils import render_jinja_template

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "templates"
TEMPLATES = ["qwen3_5.jinja", "qwen3_6.jinja", "python_builtins.jinja"]
QWEN = TEMPLATES[:2]


def conversations():
    return json.loads((FIXTURES / "conversations.json").read_text(encoding="utf-8"))


def render(template, case):
    """What `tokenizer.apply_chat_template(..., tokenize=False)` returns,
    with the tokenizer's special tokens given as our renderer gives them."""
    rendered, _ = render_jinja_template(
        conversations=[copy.deepcopy(case["messages"])],
        tools=case.get("tools"),
        chat_template=template,
        add_generation_prompt=case["add_generation_prompt"],
        bos_token="",
        eos_token="",
        **case.get("kwargs", {}),
    )
    return rendered[0]


def outcome(template, case):
    try:
        return {"text": render(template, case)}
    except jinja2.exceptions.TemplateError as error:
        return {"error": str(error)}


def test_jinja2_is_the_version_transformers_is_pinned_with():
    assert jinja2.__version__ == "3.1.6"


def test_enough_conversations_cover_the_features():
    cases = conversations()
    assert len(cases) >= 20
    assert len({c["name"] for c in cases}) == len(cases)
    messages = [m for c in cases for m in c["messages"]]
    assert any("tools" in c for c in cases)
    assert any(m.get("tool_calls") for m in messages)
    assert any(m["role"] == "tool" for m in messages)
    assert any(m.get("reasoning_content") for m in messages)
    assert {c.get("kwargs", {}).get("enable_thinking") for c in cases} >= {True, False, None}
    assert any(any(ord(ch) > 0xFFFF for ch in m["content"]) for m in messages)


@pytest.mark.parametrize("template_name", TEMPLATES)
def test_transformers_renders_what_expected_json_records(template_name):
    template = (FIXTURES / template_name).read_text(encoding="utf-8")
    got = {c["name"]: outcome(template, c) for c in conversations()}
    path = FIXTURES / "expected.json"
    expected = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    if os.environ.get("FLASHBAR_WRITE_TEMPLATE_EXPECTED") == "1":
        expected[template_name] = got
        path.write_text(json.dumps(expected, indent=1, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")
    assert got == expected[template_name]
    assert any("text" in o for o in got.values())
    if template_name in QWEN:
        # Some conversations the template itself refuses.
        assert any("error" in o for o in got.values())


@pytest.mark.parametrize("template_name", QWEN)
def test_null_content_renders_as_empty_content(template_name):
    # Our messages carry text, so a client's `"content": null` on a
    # tool-calling turn reaches the template as ""; the Qwen templates
    # render both alike, which is what makes that conversion lossless.
    template = (FIXTURES / template_name).read_text(encoding="utf-8")
    for case in conversations():
        if not any(m["role"] == "assistant" and m.get("tool_calls") for m in case["messages"]):
            continue
        nulled = copy.deepcopy(case)
        for m in nulled["messages"]:
            if m["role"] == "assistant" and m.get("tool_calls") and m["content"] == "":
                m["content"] = None
        assert outcome(template, nulled) == outcome(template, case), case["name"]


def test_the_embedded_pair_ships_the_qwen3_5_template():
    config = Path(__file__).resolve().parents[2] / "models" / "default" / "target" / "tokenizer_config.json"
    shipped = json.loads(config.read_text(encoding="utf-8"))["chat_template"]
    assert shipped == (FIXTURES / "qwen3_5.jinja").read_text(encoding="utf-8")
