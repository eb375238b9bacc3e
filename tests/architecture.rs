//! The crate's shape, checked: imports run one way across the layers of `docs/architecture.md`
//! (core ← node ← client ← lock ← features), with no circle between top-level modules, and no
//! source file grows past the size the map promises.
//!
//! It reads `src/` as text: every `crate::<module>` path outside comments is an arrow from the
//! file's top-level module to `<module>`. A folder is one module: its files may refer to each
//! other (a child file adds an `impl` block to its parent's type); arrows between folders, and
//! between files at the top of `src/`, are what the layers constrain.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layer of each top-level module, lowest first. A module may import from its own layer's
/// modules (without a circle) and from lower layers, never from a higher one.
const LAYERS: &[(&str, u8)] = &[
    ("core", 0),
    ("error", 0),
    ("metrics", 0),
    // Documentation only: the guides of `docs/`, no code.
    ("guide", 0),
    ("node", 1),
    ("client", 2),
    ("lock", 3),
    ("fencing", 4),
    ("election", 4),
    ("schedule", 4),
    ("run_once", 4),
    ("blocking", 4),
    ("multi", 4),
    ("semaphore", 4),
    ("testkit", 5),
    // Test-only: the model checker and the fencing model call the pure core.
    ("model", 6),
    ("fencing_model", 6),
];

/// The longest source file allowed, in lines (tests included): one idea per file.
const MAX_FILE_LINES: usize = 700;

/// Files still being split (each entry names who splits it); the list only shrinks.
const PENDING_SPLIT: &[&str] = &[];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a library file belongs to (`None` for `lib.rs` and the binary).
fn module_of(rel: &Path) -> Option<String> {
    let mut parts = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned());
    let first = parts.next()?;
    if first == "lib.rs" || first == "bin" {
        return None;
    }
    Some(first.trim_end_matches(".rs").to_owned())
}

/// Every `crate::<name>` in `text`, comments left out.
fn crate_refs(text: &str) -> BTreeSet<String> {
    let mut refs = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            // `crate::{a, b}` groups are not used in this crate; a name is one module.
            if !name.is_empty() {
                refs.insert(name);
            }
            rest = after;
        }
    }
    refs
}

struct Crate {
    /// module -> modules it imports (other than itself), with one file that does.
    arrows: BTreeMap<String, BTreeMap<String, String>>,
    sizes: Vec<(String, usize)>,
}

fn read_crate() -> Crate {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let layer_names: BTreeSet<&str> = LAYERS.iter().map(|(m, _)| *m).collect();
    let mut arrows: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut sizes = Vec::new();
    for file in files {
        let rel = file.strip_prefix(&src).expect("under src").to_path_buf();
        let text = std::fs::read_to_string(&file).expect("source is UTF-8");
        sizes.push((rel.display().to_string(), text.lines().count()));
        let Some(module) = module_of(&rel) else {
            continue;
        };
        for target in crate_refs(&text) {
            // Items of the crate root (re-exports in lib.rs) are not modules.
            if target != module && layer_names.contains(target.as_str()) {
                arrows
                    .entry(module.clone())
                    .or_default()
                    .entry(target)
                    .or_insert_with(|| rel.display().to_string());
            }
        }
    }
    Crate { arrows, sizes }
}

fn layer(module: &str) -> Option<u8> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|(_, l)| *l)
}

#[test]
fn every_top_level_module_has_a_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let unknown: BTreeSet<String> = files
        .iter()
        .filter_map(|f| module_of(f.strip_prefix(&src).expect("under src")))
        .filter(|m| layer(m).is_none())
        .collect();
    assert!(
        unknown.is_empty(),
        "modules without a layer (add them to LAYERS and docs/architecture.md): {unknown:?}"
    );
}

#[test]
fn imports_never_run_up_a_layer() {
    let krate = read_crate();
    let mut up = Vec::new();
    for (from, targets) in &krate.arrows {
        for (to, file) in targets {
            if let (Some(lf), Some(lt)) = (layer(from), layer(to))
                && lt > lf
            {
                up.push(format!(
                    "{file}: {from} (layer {lf}) imports {to} (layer {lt})"
                ));
            }
        }
    }
    assert!(
        up.is_empty(),
        "imports that run back up:\n{}",
        up.join("\n")
    );
}

#[test]
fn no_circle_between_modules() {
    let krate = read_crate();
    // Depth-first search for a back edge.
    fn visit(
        m: &str,
        arrows: &BTreeMap<String, BTreeMap<String, String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == m) {
            let mut circle = path[at..].to_vec();
            circle.push(m.to_owned());
            return Some(circle);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_owned());
        for to in arrows.get(m).into_iter().flat_map(|t| t.keys()) {
            if let Some(c) = visit(to, arrows, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    for m in krate.arrows.keys() {
        if let Some(circle) = visit(m, &krate.arrows, &mut Vec::new(), &mut done) {
            panic!("a circle of imports: {}", circle.join(" -> "));
        }
    }
}

#[test]
fn no_source_file_is_a_hiding_place_for_several_modules() {
    let krate = read_crate();
    let big: Vec<String> = krate
        .sizes
        .iter()
        .filter(|(f, n)| *n > MAX_FILE_LINES && !PENDING_SPLIT.contains(&f.as_str()))
        .map(|(f, n)| format!("{f}: {n} lines"))
        .collect();
    assert!(
        big.is_empty(),
        "files over {MAX_FILE_LINES} lines (split them by idea):\n{}",
        big.join("\n")
    );
}
