//! Chat template rendering: Python string methods, and the limits that stop
//! hostile templates with an error while the process keeps running.

use super::*;

fn user(content: &str) -> Vec<Message> {
    vec![Message {
        role: "user".into(),
        content: content.into(),
    }]
}

#[test]
fn python_string_methods_work() {
    let out = render("{{ messages[0].content.strip() }}", &user("  hi  "), false).unwrap();
    assert_eq!(out, "hi");
}

#[test]
fn an_endless_template_runs_out_of_fuel() {
    let template = "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}";
    let started = std::time::Instant::now();
    let error = render(template, &user("x"), false).unwrap_err();
    assert!(error.to_string().contains("fuel"), "{error}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    // The next render works: nothing was left broken.
    assert_eq!(render("{{ 1 + 1 }}", &user("x"), false).unwrap(), "2");
}

#[test]
fn endless_recursion_is_stopped() {
    let template = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}";
    let error = render(template, &user("x"), false).unwrap_err();
    assert!(error.to_string().contains("recursion"), "{error}");
}

#[test]
fn a_giant_output_is_stopped_at_the_cap() {
    // 100 x 1 MB: well within the fuel, far past the cap.
    let template = "{% for i in range(100) %}{{ 'x' * 1000000 }}{% endfor %}";
    let error = render(template, &user("x"), false).unwrap_err();
    let text = error.to_string();
    assert!(text.contains("byte limit"), "{text}");
    assert!(!text.contains('\n'));
    // Exactly at the cap is allowed; one byte more is not.
    assert_eq!(
        render_limited("{{ 'ab' * 3 }}", &user("x"), false, 6).unwrap(),
        "ababab"
    );
    assert!(render_limited("{{ 'ab' * 3 }}x", &user("x"), false, 6).is_err());
}

#[test]
fn raise_exception_becomes_an_error() {
    let error = render("{{ raise_exception('no system role') }}", &user("x"), false).unwrap_err();
    assert!(error.to_string().contains("no system role"), "{error}");
}

#[test]
fn syntax_errors_are_one_line() {
    let error = render("{% for %}", &user("x"), false).unwrap_err();
    let text = error.to_string();
    assert!(text.starts_with("chat template: "), "{text}");
    assert!(!text.contains('\n'), "{text}");
}

#[test]
fn adversarial_messages_render_as_text() {
    // Template syntax inside a message is data, never evaluated.
    let content = "{{ raise_exception('x') }}{% for i in range(99999999) %}\u{0}\u{FFFF}";
    let out = render(
        "{% for m in messages %}{{ m.role }}:{{ m.content }}{% endfor %}",
        &user(content),
        false,
    )
    .unwrap();
    assert_eq!(out, format!("user:{content}"));
}
