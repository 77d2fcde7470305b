//! The tool-call parser on whole answers, on every split of them into
//! streamed pieces, and on malformed ones.
use super::*;
use serde_json::json;

fn tools() -> Vec<Value> {
    vec![
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "metric": {"type": "boolean"},
            "where": {"type": "object"},
            "hours": {"type": "array"},
            "note": {"type": ["string", "null"]},
            "scale": {"type": "number"}
        }}}}),
        json!({"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}),
    ]
}

fn call(name: &str, arguments: Value) -> Call {
    Call {
        name: name.into(),
        arguments: arguments.to_string(),
    }
}

/// Streams `text` in two and three pieces at every cut (char boundaries:
/// a `&str` cannot hold half a character; for ASCII text that is every
/// byte) and one character a piece; each gives what the whole gives.
fn every_split_agrees(text: &str, expected: &Parsed) {
    let tools = tools();
    assert_eq!(&parse(text, &tools), expected, "whole");
    let cuts: Vec<usize> = (0..=text.len())
        .filter(|&i| text.is_char_boundary(i))
        .collect();
    let stream = |pieces: &[&str]| {
        let mut parser = ToolCallParser::new(tools.clone());
        let mut out = Vec::new();
        for piece in pieces {
            out.extend(parser.push(piece));
        }
        out.extend(parser.finish());
        // A call's name comes before any of its arguments.
        for (i, piece) in out.iter().enumerate() {
            if let Piece::Arguments { index, .. } = piece {
                assert!(out[..i]
                    .iter()
                    .any(|p| matches!(p, Piece::Call { index: j, .. } if j == index)));
            }
        }
        join(out)
    };
    for &a in &cuts {
        for &b in cuts.iter().filter(|&&b| b >= a) {
            let pieces = [&text[..a], &text[a..b], &text[b..]];
            assert_eq!(&stream(&pieces), expected, "pieces {pieces:?}");
        }
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(&stream(&pieces), expected, "a character a piece");
}

#[test]
fn qwen3_5_calls_with_content_before_them() {
    let text = "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
    every_split_agrees(
        text,
        &Parsed {
            content: "Let me check.".into(),
            calls: vec![call("get_weather", json!({"city": "Paris", "days": 3}))],
        },
    );
}

#[test]
fn parameters_are_typed_by_the_schema() {
    let text = "<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n<parameter=where>\n{\"lat\": 1.5, \"lon\": -2}\n</parameter>\n<parameter=hours>\n[1, 2]\n</parameter>\n<parameter=note>\nNone\n</parameter>\n<parameter=scale>\n2.5e3\n</parameter>\n<parameter=extra>\n7\n</parameter>\n<parameter=days>\nsoon\n</parameter>\n</function>\n</tool_call>";
    every_split_agrees(
        text,
        &Parsed {
            content: String::new(),
            calls: vec![call(
                "get_weather",
                // A string stays text; no schema: text; "soon" is no integer: text.
                json!({"city": "42", "metric": true, "where": {"lat": 1.5, "lon": -2},
                       "hours": [1, 2], "note": null, "scale": 2500.0, "extra": "7", "days": "soon"}),
            )],
        },
    );
}

#[test]
fn multiline_and_unicode_values_stay_as_written() {
    let text = "Voilà 🌧\n<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich\nline two </param\n</parameter>\n</function>\n</tool_call>\n";
    every_split_agrees(
        text,
        &Parsed {
            content: "Voilà 🌧".into(),
            calls: vec![call(
                "get_weather",
                json!({"city": "Zürich\nline two </param"}),
            )],
        },
    );
}

#[test]
fn several_calls_and_a_call_without_arguments() {
    let text = "<tool_call>\n<function=now>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>\n\n";
    every_split_agrees(
        text,
        &Parsed {
            content: String::new(),
            calls: vec![
                call("now", json!({})),
                call("get_weather", json!({"city": "Rome"})),
            ],
        },
    );
}

#[test]
fn qwen3_json_calls() {
    let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": \"{}\"}\n</tool_call>";
    every_split_agrees(
        text,
        &Parsed {
            content: String::new(),
            calls: vec![
                call("get_weather", json!({"city": "Oslo", "days": 2})),
                call("now", json!({})),
            ],
        },
    );
}

#[test]
fn malformed_calls_are_content_as_written() {
    for text in [
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</tool_call>",
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": [1]}\n</tool_call>",
        "<tool_call>\n{\"name\": 3}\n</tool_call>",
        "<tool_call>\n{not json}\n</tool_call>",
        "<tool_call>\njust words\n</tool_call>",
        "<tool_call>\n<function=>\n</function>\n</tool_call>",
        "<tool_call>\n<function=now>\n</function>\ntrailing\n</tool_call>",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\na\n</parameter>\n<parameter=city>\nb\n</parameter>\n</function>\n</tool_call>",
        // Cut by the end of the generation.
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
        "<tool_ca",
    ] {
        every_split_agrees(
            text,
            &Parsed {
                content: text.into(),
                calls: Vec::new(),
            },
        );
    }
}

#[test]
fn a_malformed_call_keeps_the_text_around_it_and_a_good_one_after_it_parses() {
    let text =
        "Hi\n<tool_call>oops</tool_call>\n<tool_call>\n<function=now>\n</function>\n</tool_call>";
    every_split_agrees(
        text,
        &Parsed {
            content: "Hi\n<tool_call>oops</tool_call>".into(),
            calls: vec![call("now", json!({}))],
        },
    );
}

#[test]
fn answers_without_calls_pass_through_whole() {
    every_split_agrees(
        "No tools needed: 2 < 3 and <tool> is not a call.\n\n",
        &Parsed {
            content: "No tools needed: 2 < 3 and <tool> is not a call.\n\n".into(),
            calls: Vec::new(),
        },
    );
}

#[test]
fn arguments_stream_as_chunks_after_the_name() {
    let mut parser = ToolCallParser::new(tools());
    let mut out = parser.push("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>");
    out.extend(parser.finish());
    assert_eq!(
        out,
        vec![
            Piece::Call {
                index: 0,
                name: "get_weather".into()
            },
            Piece::Arguments {
                index: 0,
                chunk: "{".into()
            },
            Piece::Arguments {
                index: 0,
                chunk: "\"city\":\"Paris\"".into()
            },
            Piece::Arguments {
                index: 0,
                chunk: ",\"days\":3".into()
            },
            Piece::Arguments {
                index: 0,
                chunk: "}".into()
            },
        ]
    );
    assert_eq!(parser.calls(), 1);
}
