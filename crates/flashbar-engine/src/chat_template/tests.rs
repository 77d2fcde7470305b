//! Chat template rendering: Python string methods, and the limits that stop
//! hostile templates with an error while the process keeps running.

use super::*;

fn user(content: &str) -> Vec<Message> {
    vec![Message::new("user", content)]
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
        render_limited("{{ 'ab' * 3 }}", &ChatInput::messages(&user("x"), false), 6).unwrap(),
        "ababab"
    );
    assert!(render_limited(
        "{{ 'ab' * 3 }}x",
        &ChatInput::messages(&user("x"), false),
        6
    )
    .is_err());
}

#[test]
fn raise_exception_becomes_an_error() {
    // The template refusing its messages is the request's fault: a bad
    // `messages` parameter, where a broken template is the model's.
    let error = render("{{ raise_exception('no system role') }}", &user("x"), false).unwrap_err();
    assert!(
        matches!(&error, EngineError::InvalidParam { param: "messages", message } if message == "no system role"),
        "{error:?}"
    );
    let error = render("{{ 1 + none }}", &user("x"), false).unwrap_err();
    assert!(matches!(error, EngineError::Template(_)), "{error:?}");
}

#[test]
fn a_refusal_quoting_a_newline_is_one_line() {
    // Found by the fuzzer (fuzz/seeds/chat_template/refusal-newline-role.bin):
    // a role with a newline in it, named by the template's refusal.
    let messages = vec![Message::new("us</think>\n\nanswer\u{1}", "x")];
    let template = "{{ raise_exception('unknown role ' ~ messages[0].role) }}";
    let error = render(template, &messages, false).unwrap_err();
    let text = error.to_string();
    assert!(!text.contains('\n'), "{text}");
    assert!(
        text.contains(r"unknown role us</think>\n\nanswer\u{1}"),
        "{text}"
    );
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

/// Runs `f` on a thread with a small stack, as a caller with little stack
/// to spare: rendering must not depend on the caller's stack.
fn on_small_stack<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn_scoped(scope, f)
            .unwrap()
            .join()
            .unwrap()
    })
}

/// `head`, then `unit` repeated as often as fits in the byte limit, then `tail`.
fn longest(head: &str, unit: &str, tail: &str) -> String {
    let n = (MAX_TEMPLATE_BYTES - head.len() - tail.len()) / unit.len();
    format!("{head}{}{tail}", unit.repeat(n))
}

#[test]
fn the_fuzz_crash_inputs_get_a_one_line_error() {
    // Kept in fuzz/seeds/chat_template/: a chain of 30,000 additions
    // (deep-plus-chain.bin), a syntax tree 30,000 levels deep that
    // minijinja's constant folder recursed through: before the fix the fuzz
    // target died on it with SIGSEGV and no artifact, as in the CI smoke;
    // and 60,000 minus signs before a name (timeout-minus-chain.bin, found
    // by the fuzzer after the stack fix), folded in n² steps: a timeout.
    let additions = format!("{{{{ 1{} }}}}", "+1".repeat(30_000));
    let minus = format!("{{{{ {}m }}}}", "-".repeat(60_000));
    for template in [additions, minus] {
        let started = std::time::Instant::now();
        let error = on_small_stack(|| render(&template, &user("x"), false)).unwrap_err();
        let text = error.to_string();
        assert!(text.contains("more than 1000 tokens (line 1)"), "{text}");
        assert!(!text.contains('\n'), "{text}");
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }
}

#[test]
fn the_tag_bound_counts_tokens_not_bytes() {
    // Strings, comments and raw blocks count as one token or none.
    let long = "x".repeat(MAX_TEMPLATE_BYTES / 4);
    let template = format!(
        "{{{{ '{long}' | length }}}}{{# {long} #}}{{% raw %}}{{{{ {} }}}}{{% endraw %}}",
        "1+".repeat(2000)
    );
    assert_eq!(
        on_small_stack(|| render(&template, &user("x"), false)).unwrap(),
        format!("{}{{{{ {} }}}}", long.len(), "1+".repeat(2000))
    );
    // Exactly at the bound renders; one token more is refused.
    let at = |n: usize| format!("{{{{ 1{} }}}}", "+1".repeat(n));
    assert_eq!(
        render(&at((MAX_TAG_TOKENS - 1) / 2), &user("x"), false).unwrap(),
        "500"
    );
    let text = render(&at(MAX_TAG_TOKENS / 2), &user("x"), false)
        .unwrap_err()
        .to_string();
    assert!(text.contains("tokens"), "{text}");
    // A `}}` inside a dict literal does not end the tag early.
    let dict = format!("{{{{ {{'a': {{}}}} ~ {} 1 }}}}", "-".repeat(MAX_TAG_TOKENS));
    assert!(render(&dict, &user("x"), false)
        .unwrap_err()
        .to_string()
        .contains("tokens"));
}

#[test]
fn the_deepest_syntax_trees_do_not_overflow_the_stack() {
    // Chains minijinja parses in a loop (its parser only guards recursion),
    // each as long as one tag allows, written into as many tags as the byte
    // limit allows, and `{% elif %}` chains, whose depth spans tags. Each
    // renders, or fails with a one-line error, in bounded time.
    let chains = [
        format!("{{{{ {}m }}}}", "-".repeat(MAX_TAG_TOKENS - 5)),
        format!("{{{{ m{} }}}}", "+m".repeat((MAX_TAG_TOKENS - 5) / 2)),
        format!("{{{{ 1{} }}}}", "|abs".repeat((MAX_TAG_TOKENS - 5) / 2)),
        format!(
            "{{{{ messages{} }}}}",
            ".a".repeat((MAX_TAG_TOKENS - 5) / 2)
        ),
        format!(
            "{{{{ messages{} }}}}",
            "[0]".repeat((MAX_TAG_TOKENS - 5) / 3)
        ),
        format!("{{{{ {}1 }}}}", "not ".repeat(MAX_TAG_TOKENS - 5)),
    ];
    let mut templates: Vec<String> = chains
        .iter()
        .map(|tag| tag.repeat(MAX_TEMPLATE_BYTES / tag.len()))
        .collect();
    templates.push(longest("{% if 0 %}", "{%elif 0%}", "{% endif %}"));
    templates.push(longest("{% if m %}", "{%elif m%}", "{% endif %}"));
    for template in &templates {
        assert!(template.len() <= MAX_TEMPLATE_BYTES);
        let started = std::time::Instant::now();
        let result = on_small_stack(|| render(template, &user("x"), false));
        if let Err(error) = result {
            let text = error.to_string();
            assert!(!text.contains('\n'), "{text}");
            assert!(
                !text.contains("limit") && !text.contains("tokens"),
                "{text}"
            );
        }
        let took = started.elapsed();
        assert!(took < std::time::Duration::from_secs(20), "{took:?}");
    }
}

#[test]
fn a_template_past_the_byte_limit_is_refused_before_parsing() {
    let template = "x".repeat(MAX_TEMPLATE_BYTES + 1);
    let text = render(&template, &user("x"), false)
        .unwrap_err()
        .to_string();
    assert!(text.contains("byte limit"), "{text}");
    assert!(!text.contains('\n'), "{text}");
    let template = "x".repeat(MAX_TEMPLATE_BYTES);
    assert_eq!(render(&template, &user("x"), false).unwrap(), template);
}

/// A template that nests `ns.x` (and `ns.y`) `rounds` times 70 levels deep,
/// then writes `tail`.
fn nested_values(rounds: usize, two: bool, tail: &str) -> String {
    let wrap = |name: &str| {
        format!(
            "{{% set ns.{name} = {}ns.{name}{} %}}",
            "[".repeat(70),
            "]".repeat(70)
        )
    };
    let second = if two { wrap("y") } else { String::new() };
    format!(
        "{{% set ns = namespace(x=0, y=0) %}}{{% for i in range({rounds}) %}}{}{second}{{% endfor %}}{tail}",
        wrap("x")
    )
}

#[test]
fn values_nested_as_deep_as_the_fuel_allows_do_not_overflow_the_stack() {
    // 5,000 rounds of 70 levels, 350,000 levels in all, is about as deep
    // as FUEL allows (5,200 rounds run out of it).
    let rounds = 5_000;
    let depth = rounds * 70;
    assert!(
        depth as u64 > FUEL * 8 / 10,
        "the test no longer reaches the fuel's depth"
    );
    let print = nested_values(rounds, false, "{{ ns.x }}");
    let prompt = on_small_stack(|| render(&print, &user("x"), false)).unwrap();
    assert_eq!(prompt.len(), 2 * depth + 1);
    let json = nested_values(rounds, false, "{{ ns.x | tojson | length }}");
    let prompt = on_small_stack(|| render(&json, &user("x"), false)).unwrap();
    assert_eq!(prompt, (2 * depth + 1).to_string());
    // Two values of half the depth, compared and sorted level by level.
    let compare = nested_values(
        rounds / 2,
        true,
        "{{ ns.x == ns.y }} {{ [ns.x, ns.y] | sort | length }}",
    );
    let prompt = on_small_stack(|| render(&compare, &user("x"), false)).unwrap();
    assert_eq!(prompt, "True 2");
    // Past the fuel: stopped with an error, the deep value dropped cleanly.
    let endless = nested_values(100_000, false, "{{ ns.x }}");
    let text = on_small_stack(|| render(&endless, &user("x"), false))
        .unwrap_err()
        .to_string();
    assert!(text.contains("fuel"), "{text}");
}
