//! What Python Jinja2, as transformers' `apply_chat_template` sets it up,
//! does differently from minijinja's defaults, made to match here
//! (docs/templates.md lists each difference and the test that pins it):
//! `tojson` is Python's `json.dumps(ensure_ascii=False)` (`", "` and `": "`
//! separators, floats as Python writes them, no HTML escaping); `string`
//! and printing write `True`, `False`, `None` and Python's float forms;
//! `trim` and argument-less `strip` / `lstrip` / `rstrip` / `split` take
//! Python's whitespace; messages carry `thinking` beside
//! `reasoning_content`, as transformers aliases it.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind, Output, State};
use std::fmt::Write as _;

/// Python's `str.isspace()` for one character: Unicode White_Space plus
/// the four ASCII separators U+001C..U+001F.
pub fn is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `repr(float)`: the shortest digits that read back, positional
/// for exponents -4..15, else `d.ddde+XX`.
pub fn float(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.into();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} writes an exponent");
    let exp: i32 = exp.parse().expect("{:e} writes an integer exponent");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1;
        let text = if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if point as usize >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            let (int, frac) = digits.split_at(point as usize);
            format!("{int}.{frac}")
        };
        format!("{sign}{text}")
    } else {
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{exp_sign}{:02}", exp.abs())
    }
}

/// Python's `str(value)` for what a template holds.
pub fn str_of(value: &Value) -> String {
    match value.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::None => "None".into(),
        ValueKind::Bool => if value.is_true() { "True" } else { "False" }.into(),
        ValueKind::Number if !value.is_integer() => {
            f64::try_from(value.clone()).map_or_else(|_| value.to_string(), float)
        }
        _ => value.to_string(),
    }
}

/// Printing `{{ value }}`: Python's `str`, then the default formatter for
/// everything that is not a scalar Python writes differently.
pub fn formatter(out: &mut Output, state: &State, value: &Value) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None | ValueKind::Bool => out.write_str(&str_of(value)).map_err(Error::from),
        ValueKind::Number if !value.is_integer() => {
            out.write_str(&str_of(value)).map_err(Error::from)
        }
        _ => minijinja::escape_formatter(out, state, value),
    }
}

/// The `string` filter.
pub fn string(value: &Value) -> Value {
    if value.kind() == ValueKind::String {
        return value.clone();
    }
    Value::from(str_of(value))
}

/// The `trim` filter: `value.strip(chars)`.
pub fn trim(value: &str, chars: Option<&str>) -> String {
    match chars {
        Some(chars) => value.trim_matches(|c| chars.contains(c)).to_owned(),
        None => value.trim_matches(is_space).to_owned(),
    }
}

/// String methods, Python's whitespace for argument-less strips and
/// split, the rest
/// from minijinja-contrib's pycompat.
pub fn method(state: &State, value: &Value, method: &str, args: &[Value]) -> Result<Value, Error> {
    if let (Some(s), true) = (value.as_str(), args.is_empty()) {
        match method {
            "strip" => return Ok(Value::from(s.trim_matches(is_space))),
            "lstrip" => return Ok(Value::from(s.trim_start_matches(is_space))),
            "rstrip" => return Ok(Value::from(s.trim_end_matches(is_space))),
            "split" => {
                return Ok(s
                    .split(is_space)
                    .filter(|w| !w.is_empty())
                    .map(Value::from)
                    .collect())
            }
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// The `tojson` filter as transformers defines it:
/// `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
pub fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.as_str() {
            Some(s) => s.to_owned(),
            None => " ".repeat(i64::try_from(v)?.max(0) as usize),
        }),
    };
    let (item, key) = match separators.filter(|v| !v.is_none()) {
        Some(v) => {
            let parts: Vec<String> = v.try_iter()?.map(|p| p.to_string()).collect();
            match parts.as_slice() {
                [item, key] => (item.clone(), key.clone()),
                _ => return Err(bad("tojson: separators must be a pair of strings")),
            }
        }
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let mut writer = Json {
        out: String::new(),
        ascii: ensure_ascii.unwrap_or(false),
        sort: sort_keys.unwrap_or(false),
        indent,
        item,
        key,
    };
    writer.value(value)?;
    Ok(Value::from_safe_string(writer.out))
}

fn bad(message: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, message.to_owned())
}

struct Json {
    out: String,
    ascii: bool,
    sort: bool,
    indent: Option<String>,
    item: String,
    key: String,
}

/// A container being written: its items and how many are written.
enum Open {
    Seq(Vec<Value>, usize),
    Map(Value, Vec<(String, Value)>, usize),
}

impl Json {
    /// Writes `value`. A loop over an explicit stack, not recursion: a
    /// template can nest a value as deep as its fuel allows (see the note
    /// on stack depth in chat_template.rs).
    fn value(&mut self, value: &Value) -> Result<(), Error> {
        let mut stack: Vec<Open> = Vec::new();
        let mut next = Some(value.clone());
        loop {
            if let Some(value) = next.take() {
                if let Some(open) = self.scalar_or_open(&value)? {
                    stack.push(open);
                }
            }
            let depth = stack.len();
            let Some(top) = stack.last_mut() else {
                return Ok(());
            };
            match top {
                Open::Seq(items, i) if *i < items.len() => {
                    let (index, item) = (*i, items[*i].clone());
                    *i += 1;
                    self.next(index, depth);
                    next = Some(item);
                }
                Open::Map(map, keys, i) if *i < keys.len() => {
                    let index = *i;
                    let (name, key) = keys[index].clone();
                    let item = map.get_item(&key)?;
                    *i += 1;
                    self.next(index, depth);
                    self.string(&name);
                    let sep = self.key.clone();
                    self.out.push_str(&sep);
                    next = Some(item);
                }
                Open::Seq(items, _) => {
                    let empty = items.is_empty();
                    stack.pop();
                    self.close(']', empty, depth - 1);
                }
                Open::Map(_, keys, _) => {
                    let empty = keys.is_empty();
                    stack.pop();
                    self.close('}', empty, depth - 1);
                }
            }
        }
    }

    /// Writes a scalar whole, or the opening bracket of a container.
    fn scalar_or_open(&mut self, value: &Value) -> Result<Option<Open>, Error> {
        match value.kind() {
            ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self
                .out
                .push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number if value.is_integer() => self.out.push_str(&value.to_string()),
            ValueKind::Number => {
                let x = f64::try_from(value.clone())?;
                self.out.push_str(&match float(x).as_str() {
                    "nan" => "NaN".into(),
                    "inf" => "Infinity".into(),
                    "-inf" => "-Infinity".into(),
                    other => other.to_owned(),
                });
            }
            ValueKind::String => self.string(value.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                self.out.push('[');
                return Ok(Some(Open::Seq(value.try_iter()?.collect(), 0)));
            }
            ValueKind::Map => {
                let mut keys: Vec<(String, Value)> = Vec::new();
                for k in value.try_iter()? {
                    let name = match k.kind() {
                        ValueKind::String => k.as_str().unwrap_or_default().to_owned(),
                        ValueKind::None => "null".into(),
                        ValueKind::Bool => if k.is_true() { "true" } else { "false" }.into(),
                        ValueKind::Number => str_of(&k),
                        _ => return Err(bad("tojson: keys must be str, int, float, bool or None")),
                    };
                    keys.push((name, k));
                }
                if self.sort {
                    keys.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.out.push('{');
                return Ok(Some(Open::Map(value.clone(), keys, 0)));
            }
            _ => {
                return Err(bad(&format!(
                    "tojson: Object of type {} is not JSON serializable",
                    value.kind()
                )))
            }
        }
        Ok(None)
    }

    fn next(&mut self, index: usize, depth: usize) {
        if index > 0 {
            let sep = self.item.clone();
            self.out.push_str(&sep);
        }
        if let Some(indent) = &self.indent {
            self.out.push('\n');
            self.out.push_str(&indent.repeat(depth));
        }
    }

    fn close(&mut self, bracket: char, empty: bool, depth: usize) {
        if !empty {
            if let Some(indent) = &self.indent {
                self.out.push('\n');
                self.out.push_str(&indent.repeat(depth));
            }
        }
        self.out.push(bracket);
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{8}' => self.out.push_str("\\b"),
                '\u{c}' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ascii && (c as u32) > 0x7e) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(self.out, "\\u{unit:04x}");
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}

/// The messages as transformers hands them to a template: a message with
/// `reasoning_content` also carries it as `thinking`, first, the way
/// transformers aliases it for templates that read that name.
pub fn messages(messages: &[crate::chat_template::Message]) -> Value {
    messages
        .iter()
        .map(|message| {
            let plain = serde_json::to_value(message).unwrap_or_default();
            match (&message.reasoning_content, plain) {
                (Some(reasoning), serde_json::Value::Object(fields)) => {
                    let mut aliased = serde_json::Map::new();
                    aliased.insert("thinking".into(), reasoning.clone().into());
                    aliased.extend(fields);
                    Value::from_serialize(&aliased)
                }
                (_, plain) => Value::from_serialize(&plain),
            }
        })
        .collect()
}
