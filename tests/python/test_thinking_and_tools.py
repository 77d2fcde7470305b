"""Reasoning and tool calls through the official OpenAI Python client.

These run the HTTP server over the scripted stand-in model
(crates/flashbar-server/examples/scripted_server.rs, over
`worker::echo::ScriptedBackend`): it answers each chat with a scripted reply,
cut into 3-character tokens, as a thinking Qwen3.5 model would write it. The
embedded 13.8M model writes neither reasoning nor tool calls, so this is a
test of our parsing and protocol (reasoning split, tool-call parsing, whole and
streamed wire shapes, the round trip back through the chat template), not of
a model. The real model's side (DFlash lossless with tools and thinking on) is
in test_server.py and crates/flashbar-engine/tests/chat_templates.rs.
"""

import json
import os
import signal
import subprocess
import threading
from pathlib import Path

import openai
import pytest

ROOT = Path(__file__).resolve().parents[2]
BINARY = (
    Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "debug" / "examples" / "scripted_server"
)

QUESTION = "What's the weather in Paris?"
TOOL_RESULT = '{"temp_c": 21}'
MALFORMED = "Break the call."
CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n2\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n"
    "</function>\n</tool_call>"
)
SCRIPT = {
    # Thinking on: the prompt ends in an open <think>, so the reply starts inside.
    QUESTION: "The user wants the weather; call the tool.\n</think>\n\nLet me check.\n\n" + CALL,
    TOOL_RESULT: "21 degrees: answer.\n</think>\n\nIt is 21 °C in Paris ☀️.",
    MALFORMED: "Hmm.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>",
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "metric": {"type": "boolean"},
                },
                "required": ["city"],
            },
        },
    }
]
THINKING = {"chat_template_kwargs": {"enable_thinking": True}}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    if not BINARY.exists():
        pytest.fail(f"{BINARY} is missing: run `cargo build -p flashbar-server --example scripted_server`")
    script = tmp_path_factory.mktemp("script") / "script.json"
    script.write_text(json.dumps(SCRIPT))
    proc = subprocess.Popen(
        [str(BINARY), str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    first = []
    reader = threading.Thread(target=lambda: first.append(proc.stdout.readline()))
    reader.start()
    reader.join(30)
    line = first[0] if first else ""
    if not line.startswith("listening on "):
        proc.kill()
        pytest.fail(f"scripted_server did not start: {line!r} {proc.stderr.read()}")
    url = line.split("listening on ", 1)[1].strip()
    yield openai.OpenAI(base_url=url + "/v1", api_key="sk-x", timeout=30, max_retries=0)
    proc.send_signal(signal.SIGINT)
    try:
        assert proc.wait(10) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def whole(client, messages, **kwargs):
    response = client.chat.completions.create(model="default", messages=messages, **kwargs)
    choice = response.choices[0]
    message = choice.message
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
    for c in message.tool_calls or []:
        assert c.id.startswith("call_") and c.type == "function"
    reasoning = getattr(message, "reasoning_content", None) or ""
    return response, (message.content or "", reasoning, calls, choice.finish_reason)


def streamed(client, messages, **kwargs):
    """The same answer reassembled from its chunks as a client does."""
    stream = client.chat.completions.create(model="default", messages=messages, stream=True, **kwargs)
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        content += delta.content or ""
        reasoning += getattr(delta, "reasoning_content", None) or ""
        for call in delta.tool_calls or []:
            if call.index not in calls:
                # The first delta of a call carries its id and name.
                assert call.id.startswith("call_") and call.function.name
                calls[call.index] = [call.function.name, call.function.arguments or ""]
            else:
                assert call.id is None
                calls[call.index][1] += call.function.arguments or ""
        finish = choice.finish_reason or finish
    parsed = [(name, json.loads(args)) for _, (name, args) in sorted(calls.items())]
    return content, reasoning, parsed, finish


def test_a_tool_round_trip_whole_and_streamed_agree(client):
    """Ask with a tool, get the call, send its result back, get the answer."""
    messages = [{"role": "user", "content": QUESTION}]
    response, first = whole(client, messages, tools=TOOLS, extra_body=THINKING)
    assert first == (
        "Let me check.",
        "The user wants the weather; call the tool.",
        [("get_weather", {"city": "Paris", "days": 2, "metric": True})],
        "tool_calls",
    )
    details = response.usage.completion_tokens_details
    assert 0 < details.reasoning_tokens < response.usage.completion_tokens
    assert streamed(client, messages, tools=TOOLS, extra_body=THINKING) == first

    message = response.choices[0].message
    messages += [
        {
            "role": "assistant",
            "content": message.content,
            "reasoning_content": message.reasoning_content,
            "tool_calls": [c.model_dump() for c in message.tool_calls],
        },
        {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": TOOL_RESULT},
    ]
    _, final = whole(client, messages, tools=TOOLS, extra_body=THINKING)
    assert final == ("It is 21 °C in Paris ☀️.", "21 degrees: answer.", [], "stop")
    assert streamed(client, messages, tools=TOOLS, extra_body=THINKING) == final


def test_without_tools_a_call_is_plain_content(client):
    messages = [{"role": "user", "content": QUESTION}]
    _, answer = whole(client, messages, extra_body=THINKING)
    assert answer == ("Let me check.\n\n" + CALL, "The user wants the weather; call the tool.", [], "stop")
    assert streamed(client, messages, extra_body=THINKING) == answer


def test_a_malformed_call_is_content_not_an_error(client):
    messages = [{"role": "user", "content": MALFORMED}]
    _, answer = whole(client, messages, tools=TOOLS, extra_body=THINKING)
    content, reasoning, calls, finish = answer
    assert content.startswith("<tool_call>\n<function=get_weather>") and content.endswith("</tool_call>")
    assert (reasoning, calls, finish) == ("Hmm.", [], "stop")
    assert streamed(client, messages, tools=TOOLS, extra_body=THINKING) == answer


def test_thinking_off_is_all_answer(client):
    """With thinking off the prompt's think block is closed: nothing is reasoning."""
    messages = [{"role": "user", "content": TOOL_RESULT}]
    response, answer = whole(client, messages, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert answer[1] == "" and answer[0].startswith("21 degrees: answer.\n</think>")
    assert response.usage.completion_tokens_details.reasoning_tokens == 0
