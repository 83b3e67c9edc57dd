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

/// More nested containers than this are refused: serde_json reads back at
/// most 127 from the database (and the engine wraps some values once more),
/// so a deeper state could be written but never read.
pub const MAX_DEPTH: usize = 100;

/// Values within both bounds convert in well under a millisecond, so they
/// may be converted on a normal scheduler; larger ones go to a dirty one.
const SMALL_VALUES: usize = 1_000;
const SMALL_BYTES: usize = 64 * 1024;

/// Whether a JSON value is small (see `SMALL_VALUES`). Stops looking as soon
/// as it is not.
pub fn json_is_small(root: &Value) -> bool {
    let (mut values, mut bytes) = (1, 0);
    let mut stack = vec![root];
    while let Some(v) = stack.pop() {
        match v {
            Value::String(s) => bytes += s.len(),
            Value::Array(a) => {
                values += a.len();
                if values > SMALL_VALUES {
                    return false;
                }
                stack.extend(a);
            }
            Value::Object(o) => {
                values += o.len();
                if values > SMALL_VALUES {
                    return false;
                }
                for (k, x) in o {
                    bytes += k.len();
                    stack.push(x);
                }
            }
            _ => {}
        }
        if bytes > SMALL_BYTES {
            return false;
        }
    }
    true
}

/// Whether a term is small (see `SMALL_VALUES`). Stops looking as soon as
/// it is not.
pub fn term_is_small(root: Term) -> bool {
    let (mut values, mut bytes) = (1, 0);
    let mut stack = vec![root];
    while let Some(t) = stack.pop() {
        match t.get_type() {
            TermType::Binary => bytes += t.decode::<Binary>().map_or(0, |b| b.len()),
            TermType::List => {
                let Ok(items) = t.into_list_iterator() else {
                    continue;
                };
                for item in items {
                    values += 1;
                    if values > SMALL_VALUES {
                        return false;
                    }
                    stack.push(item);
                }
            }
            TermType::Map => {
                values += 2 * t.map_size().unwrap_or(0);
                if values > SMALL_VALUES {
                    return false;
                }
                if let Some(entries) = MapIterator::new(t) {
                    for (k, v) in entries {
                        stack.push(k);
                        stack.push(v);
                    }
                }
            }
            TermType::Tuple => {
                let items = rustler::types::tuple::get_tuple(t).unwrap_or_default();
                values += items.len();
                if values > SMALL_VALUES {
                    return false;
                }
                stack.extend(items);
            }
            _ => {}
        }
        if bytes > SMALL_BYTES {
            return false;
        }
    }
    true
}

/// A container being converted. The conversion keeps its own stack rather
/// than recursing: it runs on scheduler threads, whose stacks are small.
enum Frame<'a> {
    Array(std::vec::IntoIter<Term<'a>>, Vec<Value>),
    Object(
        std::vec::IntoIter<(String, Term<'a>)>,
        Map<String, Value>,
        Option<String>,
    ),
}

pub fn term_to_json(root: Term) -> Result<Value, String> {
    let mut stack: Vec<Frame> = Vec::new();
    let mut next = Some(root);
    loop {
        // Convert the next term: a scalar now, a container by pushing a frame.
        let mut value = match next.take() {
            None => None,
            Some(t) => match t.get_type() {
                TermType::List => {
                    if stack.len() >= MAX_DEPTH {
                        return Err(format!("nested deeper than {MAX_DEPTH} levels"));
                    }
                    let items: Vec<Term> = t
                        .decode()
                        .map_err(|_| "an improper list is not JSON".to_string())?;
                    let n = items.len();
                    stack.push(Frame::Array(items.into_iter(), Vec::with_capacity(n)));
                    None
                }
                TermType::Map => {
                    if stack.len() >= MAX_DEPTH {
                        return Err(format!("nested deeper than {MAX_DEPTH} levels"));
                    }
                    let entries = map_entries(t)?;
                    stack.push(Frame::Object(entries.into_iter(), Map::new(), None));
                    None
                }
                _ => Some(scalar(t)?),
            },
        };
        // Hand finished values to their parents until one needs a child.
        loop {
            if let Some(v) = value.take() {
                match stack.last_mut() {
                    None => return Ok(v),
                    Some(Frame::Array(_, out)) => out.push(v),
                    Some(Frame::Object(_, out, key)) => {
                        let k = key.take().unwrap_or_default();
                        match out.entry(k) {
                            serde_json::map::Entry::Vacant(e) => {
                                e.insert(v);
                            }
                            serde_json::map::Entry::Occupied(e) => {
                                return Err(format!(
                                    "the key {:?} appears twice (as a string and an atom)",
                                    e.key()
                                ))
                            }
                        }
                    }
                }
            }
            let done = match stack.last_mut() {
                None => unreachable!("a container frame is on the stack"),
                Some(Frame::Array(items, _)) => match items.next() {
                    Some(t) => {
                        next = Some(t);
                        false
                    }
                    None => true,
                },
                Some(Frame::Object(entries, _, key)) => match entries.next() {
                    Some((k, t)) => {
                        *key = Some(k);
                        next = Some(t);
                        false
                    }
                    None => true,
                },
            };
            if !done {
                break;
            }
            value = Some(match stack.pop() {
                Some(Frame::Array(_, out)) => Value::Array(out),
                Some(Frame::Object(_, out, _)) => Value::Object(out),
                None => unreachable!(),
            });
        }
    }
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

fn map_entries(term: Term) -> Result<Vec<(String, Term)>, String> {
    let iter = MapIterator::new(term).ok_or("bad map")?;
    let mut entries = Vec::new();
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
        entries.push((key, v));
    }
    Ok(entries)
}

fn scalar(term: Term) -> Result<Value, String> {
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

/// A map of options as JSON, walked `depth` levels of maps deep so that a
/// value that is not JSON is reported with the option names leading to it
/// (`(["step_rate_limits", "Account.Sync", "push"], "a tuple is not JSON")`).
/// Values below that depth convert whole. Options are few: the walk
/// recurses at most `depth` levels.
pub fn options_to_json(term: Term, depth: usize) -> Result<Value, (Vec<String>, String)> {
    if depth == 0 || term.get_type() != TermType::Map {
        return term_to_json(term).map_err(|e| (Vec::new(), e));
    }
    let mut out = Map::new();
    for (key, value) in map_entries(term).map_err(|e| (Vec::new(), e))? {
        let v = options_to_json(value, depth - 1).map_err(|(mut path, e)| {
            path.insert(0, key.clone());
            (path, e)
        })?;
        if out.contains_key(&key) {
            return Err((vec![key], "given twice (as a string and an atom)".into()));
        }
        out.insert(key, v);
    }
    Ok(Value::Object(out))
}
