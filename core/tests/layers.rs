//! The core's layers import one way (ARCHITECTURE.md): engine over node over
//! context over store over the foundations. Checked on the sources, so a
//! `use` that would close a circle fails here rather than in review.

use std::collections::BTreeSet;
use std::path::Path;

/// Each layer, and the layers it must not import from.
const FORBIDDEN: &[(&str, &[&str])] = &[
    ("node", &["engine"]),
    ("context", &["engine", "node"]),
    ("store", &["engine", "node", "context"]),
    (
        "foundations",
        &["engine", "node", "context", "store", "options"],
    ),
];

/// The files of the foundations: the types and rules every layer uses.
const FOUNDATIONS: &[&str] = &[
    "config.rs",
    "cron.rs",
    "error.rs",
    "instance.rs",
    "outcome.rs",
    "stats.rs",
    "transition.rs",
    "unique.rs",
    "validate.rs",
    "workflow.rs",
];

#[test]
fn layers_import_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut broken = Vec::new();
    for (layer, forbidden) in FORBIDDEN {
        let files: Vec<_> = match *layer {
            "foundations" => FOUNDATIONS.iter().map(|f| src.join(f)).collect(),
            "context" => vec![src.join("context.rs")],
            dir => rust_files(&src.join(dir)),
        };
        assert!(!files.is_empty(), "no files for layer {layer}");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for module in imported(&text) {
                if forbidden.contains(&module.as_str()) {
                    broken.push(format!("{} imports crate::{module}", file.display()));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "imports against the layering:\n{}",
        broken.join("\n")
    );
}

/// The top-level modules a file names as `crate::<module>` or in
/// `crate::{<module>::..., ...}`, outside comments.
fn imported(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let code = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    for rest in code.split("crate::").skip(1) {
        let names = match rest.strip_prefix('{') {
            Some(group) => group.split('}').next().unwrap_or("").split(',').collect(),
            None => vec![rest],
        };
        for name in names {
            let module: String = name
                .trim_start()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            out.insert(module);
        }
    }
    out
}

fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}
