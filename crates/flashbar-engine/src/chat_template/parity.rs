//! Parity with Python Jinja2 as transformers runs it: every conversation in
//! tests/fixtures/templates/conversations.json, rendered with each template
//! there, gives byte for byte the text (or the error) that
//! tests/python/test_chat_templates.py recorded from transformers in
//! expected.json, and checks again on each run (docs/templates.md).

use super::*;
use serde_json::Value as Json;

fn fixtures() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/templates")
}

fn read(name: &str) -> Json {
    let text = std::fs::read_to_string(fixtures().join(name)).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn qwen_templates_render_as_transformers_does() {
    let conversations = read("conversations.json");
    let expected = read("expected.json");
    let mut checked = 0;
    let mut failures = Vec::new();
    for (template_name, outputs) in expected.as_object().unwrap() {
        let template = std::fs::read_to_string(fixtures().join(template_name)).unwrap();
        for case in conversations.as_array().unwrap() {
            let name = case["name"].as_str().unwrap();
            let messages: Vec<Message> = serde_json::from_value(case["messages"].clone())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let args = TemplateArgs {
                tools: case
                    .get("tools")
                    .map(|t| serde_json::from_value(t.clone()).unwrap()),
                kwargs: case
                    .get("kwargs")
                    .and_then(Json::as_object)
                    .cloned()
                    .unwrap_or_default(),
            };
            let add = case["add_generation_prompt"].as_bool().unwrap();
            let got = render_chat(&template, &args.input(&messages, add));
            let want = &outputs[name];
            let same = match (&got, want.get("text"), want.get("error")) {
                (Ok(text), Some(Json::String(w)), _) => text == w,
                (Err(e), _, Some(Json::String(w))) => e.to_string().contains(w.as_str()),
                _ => false,
            };
            if !same {
                failures.push(format!(
                    "{template_name} / {name}:\n  got  {got:?}\n  want {want}"
                ));
            }
            checked += 1;
        }
    }
    let templates = expected.as_object().unwrap().len();
    assert!(templates >= 3, "expected.json has {templates} templates");
    assert_eq!(checked, templates * conversations.as_array().unwrap().len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
