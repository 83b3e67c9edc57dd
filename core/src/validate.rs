//! Input checks shared by every entry point. They run before any SQL, so a
//! rejected call writes nothing.

use crate::error::{Error, Result};
use serde_json::Value;

/// Longest workflow, step, queue or signal name, in bytes.
pub const MAX_NAME_BYTES: usize = 255;
/// Longest concurrency or rate-limit key, in bytes.
pub const MAX_KEY_BYTES: usize = 1024;
/// Largest state, serialised, in bytes.
pub const MAX_STATE_BYTES: usize = 64 * 1024 * 1024;
/// Deepest nesting of arrays and objects in a state or payload (JSON readers,
/// ours included, refuse much deeper documents).
pub const MAX_DEPTH: usize = 100;

/// A workflow, step, queue or signal name: 1 to 255 bytes, no NUL, no control characters.
pub fn name(field: &'static str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(Error::input(field, "must not be empty"));
    }
    if value.len() > MAX_NAME_BYTES {
        return Err(Error::input(
            field,
            format!(
                "is {} bytes long; the limit is {MAX_NAME_BYTES}",
                value.len()
            ),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(Error::input(
            field,
            "must not contain NUL or control characters",
        ));
    }
    Ok(())
}

/// A concurrency or rate-limit key `name:rest`: the name part (before the first
/// `:`) must be non-empty; the whole is at most 1024 bytes without NUL.
pub fn key(field: &'static str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(Error::input(field, "must not be empty"));
    }
    if value.len() > MAX_KEY_BYTES {
        return Err(Error::input(
            field,
            format!(
                "is {} bytes long; the limit is {MAX_KEY_BYTES}",
                value.len()
            ),
        ));
    }
    if value.contains('\0') {
        return Err(Error::input(field, "must not contain NUL bytes"));
    }
    if key_name(value).is_empty() {
        return Err(Error::input(
            field,
            format!("{value:?} has an empty name: keys look like \"name:rest\""),
        ));
    }
    Ok(())
}

/// The name of a key: the part before the first `:`.
pub fn key_name(key: &str) -> &str {
    key.split(':').next().unwrap_or(key)
}

/// A state: a JSON object without NUL characters (PostgreSQL's jsonb cannot hold
/// them) and at most [`MAX_STATE_BYTES`] once serialised.
pub fn state(field: &'static str, value: &Value) -> Result<()> {
    if !value.is_object() {
        return Err(Error::input(
            field,
            format!("must be a JSON object, got {}", json_kind(value)),
        ));
    }
    content(field, value)
}

/// The serialised-size check, done where the state is serialised anyway.
pub fn state_size(field: &'static str, serialised_len: usize) -> Result<()> {
    if serialised_len > MAX_STATE_BYTES {
        return Err(Error::input(
            field,
            format!("is {serialised_len} bytes; the limit is {MAX_STATE_BYTES}"),
        ));
    }
    Ok(())
}

/// Any JSON value (a signal payload): no NUL characters, not too deep.
pub fn payload(field: &'static str, value: &Value) -> Result<()> {
    content(field, value)
}

/// A schema name: a plain lower-case SQL identifier, so it can be quoted safely
/// into statement text.
pub fn schema(value: &str) -> Result<()> {
    let ok = !value.is_empty()
        && value.len() <= 48
        && value.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(Error::config(format!(
            "schema {value:?} must be 1 to 48 characters of a-z, 0-9 and _, not starting with a digit"
        )))
    }
}

/// No NUL characters (PostgreSQL's jsonb cannot hold them) and at most
/// [`MAX_DEPTH`] levels of nesting.
fn content(field: &'static str, value: &Value) -> Result<()> {
    match walk(value, 1) {
        Some(Problem::Nul) => Err(Error::input(
            field,
            "must not contain NUL (\\u0000) characters",
        )),
        Some(Problem::Deep) => Err(Error::input(
            field,
            format!("is nested more than {MAX_DEPTH} levels deep"),
        )),
        None => Ok(()),
    }
}

enum Problem {
    Nul,
    Deep,
}

fn walk(value: &Value, depth: usize) -> Option<Problem> {
    match value {
        Value::Array(_) | Value::Object(_) if depth > MAX_DEPTH => Some(Problem::Deep),
        Value::String(s) if s.contains('\0') => Some(Problem::Nul),
        Value::Array(a) => a.iter().find_map(|v| walk(v, depth + 1)),
        Value::Object(o) => o.iter().find_map(|(k, v)| {
            if k.contains('\0') {
                Some(Problem::Nul)
            } else {
                walk(v, depth + 1)
            }
        }),
        _ => None,
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A priority: 0 (first) to 9 (last).
pub fn priority(field: &'static str, value: i16) -> Result<()> {
    if !(0..=9).contains(&value) {
        return Err(Error::input(field, format!("must be 0 to 9, got {value}")));
    }
    Ok(())
}

/// Attempts per step: at least 1.
pub fn max_attempts(field: &'static str, value: i32) -> Result<()> {
    if value < 1 {
        return Err(Error::input(
            field,
            format!("must be at least 1, got {value}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names() {
        assert!(name("workflow", "Account.Sync").is_ok());
        assert!(name("workflow", "").is_err());
        assert!(name("workflow", &"x".repeat(256)).is_err());
        assert!(name("workflow", "a\0b").is_err());
    }

    #[test]
    fn keys() {
        assert!(key("concurrency_key", "account:7").is_ok());
        assert!(key("concurrency_key", "stripe").is_ok());
        assert!(key("concurrency_key", ":7").is_err());
        assert!(key("concurrency_key", "a\0").is_err());
        assert_eq!(key_name("order:42:x"), "order");
        assert_eq!(key_name("order"), "order");
    }

    #[test]
    fn states() {
        assert!(state("state", &json!({"a": [1, "x"]})).is_ok());
        assert!(state("state", &json!([1])).is_err());
        assert!(state("state", &json!({"a": "b\u{0}"})).is_err());
        assert!(state("state", &json!({"a\u{0}": 1})).is_err());
        let mut deep = json!(1);
        for _ in 0..MAX_DEPTH - 1 {
            deep = json!([deep]);
        }
        assert!(state("state", &json!({ "d": deep.clone() })).is_ok());
        let err = state("state", &json!({ "d": [deep] })).unwrap_err();
        assert!(err.to_string().contains("levels deep"), "{err}");
    }

    #[test]
    fn schemas() {
        assert!(schema("gendurable").is_ok());
        assert!(schema("t_1").is_ok());
        assert!(schema("1t").is_err());
        assert!(schema("a\"b").is_err());
        assert!(schema("").is_err());
    }
}
