//! JSON values <-> Elixir terms.
//!
//! Elixir to JSON: maps (string or atom keys) become objects, lists arrays,
//! binaries strings (UTF-8 only), integers and floats numbers, `true`,
//! `false` and `nil` themselves, other atoms strings. Tuples, pids,
//! references, functions, structs and improper lists are refused.
//!
//! JSON to Elixir: objects become maps with string keys, arrays lists,
//! strings binaries, numbers integers or floats, `null` is `nil`.

use rustler::types::atom;
use rustler::types::map::MapIterator;
use rustler::{Atom, Binary, Encoder, Env, Term, TermType};
use serde_json::{Map, Number, Value};

/// Deeper nesting than this is refused (the conversion recurses).
const MAX_DEPTH: usize = 256;

pub fn term_to_json(term: Term) -> Result<Value, String> {
    to_json(term, 0)
}

fn describe(term: Term) -> &'static str {
    match term.get_type() {
        TermType::Tuple => "a tuple",
        TermType::Pid => "a pid",
        TermType::Port => "a port",
        TermType::Ref => "a reference",
        TermType::Fun => "a function",
        _ => "a value of another type",
    }
}

fn to_json(term: Term, depth: usize) -> Result<Value, String> {
    if depth > MAX_DEPTH {
        return Err(format!("nested deeper than {MAX_DEPTH} levels"));
    }
    match term.get_type() {
        TermType::Atom => {
            let a: Atom = term.decode().map_err(|_| "bad atom".to_string())?;
            if a == atom::nil() {
                Ok(Value::Null)
            } else if a == atom::true_() {
                Ok(Value::Bool(true))
            } else if a == atom::false_() {
                Ok(Value::Bool(false))
            } else {
                Ok(Value::String(
                    term.atom_to_string().map_err(|_| "bad atom".to_string())?,
                ))
            }
        }
        TermType::Binary => binary_str(term).map(Value::String),
        TermType::Integer => {
            if let Ok(i) = term.decode::<i64>() {
                Ok(Value::Number(i.into()))
            } else if let Ok(u) = term.decode::<u64>() {
                Ok(Value::Number(u.into()))
            } else {
                Err("an integer does not fit in 64 bits".into())
            }
        }
        TermType::Float => {
            let f: f64 = term.decode().map_err(|_| "bad float".to_string())?;
            Number::from_f64(f)
                .map(Value::Number)
                .ok_or_else(|| "a float is not finite".to_string())
        }
        TermType::List => {
            let items: Vec<Term> = term
                .decode()
                .map_err(|_| "an improper list is not JSON".to_string())?;
            items
                .into_iter()
                .map(|t| to_json(t, depth + 1))
                .collect::<Result<Vec<_>, _>>()
                .map(Value::Array)
        }
        TermType::Map => {
            let iter = MapIterator::new(term).ok_or("bad map")?;
            let mut obj = Map::new();
            for (k, v) in iter {
                let key = match k.get_type() {
                    TermType::Binary => binary_str(k)?,
                    TermType::Atom => {
                        let name = k.atom_to_string().map_err(|_| "bad atom".to_string())?;
                        if name == "__struct__" {
                            return Err(format!(
                                "a struct ({}) is not JSON; convert it to a map or a string first",
                                v.atom_to_string().unwrap_or_default()
                            ));
                        }
                        name
                    }
                    TermType::Integer => match k.decode::<i64>() {
                        Ok(i) => i.to_string(),
                        Err(_) => return Err("a map key is too large an integer".into()),
                    },
                    _ => {
                        return Err(format!(
                            "map keys must be strings, atoms or integers, got {}",
                            describe(k)
                        ))
                    }
                };
                if obj.insert(key.clone(), to_json(v, depth + 1)?).is_some() {
                    return Err(format!(
                        "the key {key:?} appears twice (as a string and an atom)"
                    ));
                }
            }
            Ok(Value::Object(obj))
        }
        _ => Err(format!("{} is not JSON", describe(term))),
    }
}

fn binary_str(term: Term) -> Result<String, String> {
    let b: Binary = term
        .decode()
        .map_err(|_| "a bitstring is not JSON".to_string())?;
    std::str::from_utf8(b.as_slice())
        .map(str::to_owned)
        .map_err(|_| "a binary is not valid UTF-8".to_string())
}

pub fn json_to_term<'a>(env: Env<'a>, v: &Value) -> Term<'a> {
    match v {
        Value::Null => atom::nil().encode(env),
        Value::Bool(b) => b.encode(env),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.encode(env)
            } else if let Some(u) = n.as_u64() {
                u.encode(env)
            } else {
                n.as_f64().unwrap_or(0.0).encode(env)
            }
        }
        Value::String(s) => s.encode(env),
        Value::Array(a) => a
            .iter()
            .map(|x| json_to_term(env, x))
            .collect::<Vec<_>>()
            .encode(env),
        Value::Object(o) => {
            let keys: Vec<Term> = o.keys().map(|k| k.encode(env)).collect();
            let vals: Vec<Term> = o.values().map(|x| json_to_term(env, x)).collect();
            Term::map_from_term_arrays(env, &keys, &vals)
                .unwrap_or_else(|_| atom::nil().encode(env))
        }
    }
}
