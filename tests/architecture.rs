//! The crate's shape, checked: imports run one way across the layers of `docs/architecture.md`
//! (core ← node ← client ← lock ← features), with no circle between top-level modules, and no
//! source file grows past the size the map promises, and comments and guides state rules, not history.
//! The public client is a face over the engine: `Redlock`'s public methods live in the face's
//! files, and neither the face nor a feature imports the node layer.
//!
//! It reads `src/` as text: every `crate::<module>` path outside comments is an arrow from the
//! file's top-level module to `<module>`, and a `crate::<Item>` path of an item the crate root
//! re-exports (`pub use crate::<module>::...` in `lib.rs`) is an arrow to the module it comes
//! from. A folder is one module for the layers: its child files add `impl` blocks to their
//! folder's types (arrows to and from the folder's `mod.rs` are its face). Between the child
//! files of one folder (`super::<file>`, `crate::<folder>::<file>`) no circle is allowed either.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layer of each top-level module, lowest first. A module may import from its own layer's
/// modules (without a circle) and from lower layers, never from a higher one.
const LAYERS: &[(&str, u8)] = &[
    ("core", 0),
    ("error", 0),
    ("eviction", 0),
    ("metrics", 0),
    // Documentation only: the guides of `docs/`, no code.
    ("guide", 0),
    ("node", 1),
    ("client", 2),
    ("lock", 3),
    ("fencing", 4),
    ("election", 4),
    ("run_once", 4),
    ("blocking", 4),
    ("multi", 4),
    ("semaphore", 4),
    ("testkit", 5),
    // Test-only: the model checker and the fencing model call the pure core.
    ("model", 6),
];

/// The longest source file allowed, in lines, in `src/` and `tests/`: one idea per file.
const MAX_FILE_LINES: usize = 700;

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

/// The items `lib.rs` re-exports, each with the top-level module it comes from
/// (`pub use crate::<module>::...::{A, B};`, one statement possibly over several lines).
fn root_items(src: &Path) -> BTreeMap<String, String> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    let mut items = BTreeMap::new();
    for stmt in statements(&lib) {
        let Some(path) = stmt.strip_prefix("pub use crate::") else {
            continue;
        };
        let module: String = path
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        for name in use_names(path) {
            items.insert(name, module.clone());
        }
    }
    items
}

/// The statements of `text`'s code (split at `;`, trimmed), comments left out, each on one
/// line.
fn statements(text: &str) -> Vec<String> {
    let code: String = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join(" ");
    code.split(';').map(|stmt| stmt.trim().to_owned()).collect()
}

/// The names a `use` path brings in (`a::b::{C, D as E}` brings `C` and `E`).
fn use_names(path: &str) -> Vec<String> {
    let names = match (path.find('{'), path.rfind('}')) {
        (Some(open), Some(close)) if open < close => &path[open + 1..close],
        _ => path.rsplit("::").next().unwrap_or(""),
    };
    names
        .split(',')
        // `A as B` brings in `B`.
        .map(|name| name.split(" as ").last().unwrap_or("").trim())
        .filter(|name| !name.is_empty() && *name != "self")
        .map(str::to_owned)
        .collect()
}

/// Every sibling file a child file of a folder refers to: `super::<file>` (from a child file,
/// `super` is the folder) and `crate::<folder>::<file>`, comments and the file's unit tests (from
/// a `#[cfg(test)]` at the start of a line on) left out. Only names of the folder's child files
/// count (`siblings`).
fn sibling_refs(text: &str, folder: &str, siblings: &BTreeSet<String>) -> BTreeSet<String> {
    let mut refs = BTreeSet::new();
    let long = format!("crate::{folder}::");
    for line in text.lines().take_while(|l| !l.starts_with("#[cfg(test)]")) {
        let code = line.split("//").next().unwrap_or("");
        for prefix in ["super::", long.as_str()] {
            let mut rest = code;
            while let Some(at) = rest.find(prefix) {
                let after = &rest[at + prefix.len()..];
                let name: String = after
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if siblings.contains(&name) {
                    refs.insert(name);
                }
                rest = after;
            }
        }
    }
    refs
}

struct Crate {
    /// module -> modules it imports (other than itself), with one file that does.
    arrows: BTreeMap<String, BTreeMap<String, String>>,
    sizes: Vec<(String, usize)>,
    /// Per folder: child file -> sibling files it refers to.
    files: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
}

fn read_crate() -> Crate {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let layer_names: BTreeSet<&str> = LAYERS.iter().map(|(m, _)| *m).collect();
    let root = root_items(&src);
    let mut arrows: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut sizes = Vec::new();
    let mut folder_files: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for file in &files {
        let rel = file.strip_prefix(&src).expect("under src");
        let parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        // Child files directly in a folder (not `mod.rs`, not in a subfolder).
        if let [folder, name] = parts.as_slice()
            && name != "mod.rs"
            && folder != "bin"
        {
            folder_files
                .entry(folder.clone())
                .or_default()
                .insert(name.trim_end_matches(".rs").to_owned(), BTreeSet::new());
        }
    }
    for (folder, children) in &mut folder_files {
        let siblings: BTreeSet<String> = children.keys().cloned().collect();
        for (child, refs) in children.iter_mut() {
            let text = std::fs::read_to_string(src.join(folder).join(format!("{child}.rs")))
                .expect("source is UTF-8");
            *refs = sibling_refs(&text, folder, &siblings);
            refs.remove(child);
        }
    }
    for file in files {
        let rel = file.strip_prefix(&src).expect("under src").to_path_buf();
        let text = std::fs::read_to_string(&file).expect("source is UTF-8");
        sizes.push((format!("src/{}", rel.display()), text.lines().count()));
        let Some(module) = module_of(&rel) else {
            continue;
        };
        for name in crate_refs(&text) {
            // An item of the crate root is an arrow to the module it is re-exported from.
            let target = root.get(&name).cloned().unwrap_or(name);
            if target != module && layer_names.contains(target.as_str()) {
                arrows
                    .entry(module.clone())
                    .or_default()
                    .entry(target)
                    .or_insert_with(|| rel.display().to_string());
            }
        }
    }
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut test_files = Vec::new();
    rust_files(&tests, &mut test_files);
    for file in test_files {
        let rel = file.strip_prefix(&tests).expect("under tests");
        let text = std::fs::read_to_string(&file).expect("source is UTF-8");
        sizes.push((format!("tests/{}", rel.display()), text.lines().count()));
    }
    Crate {
        arrows,
        sizes,
        files: folder_files,
    }
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

/// A circle in a graph of names, if any (depth-first search for a back edge).
fn find_circle(arrows: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        arrows: &BTreeMap<String, BTreeSet<String>>,
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
        for to in arrows.get(m).into_iter().flatten() {
            if let Some(c) = visit(to, arrows, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    arrows
        .keys()
        .find_map(|m| visit(m, arrows, &mut Vec::new(), &mut done))
}

#[test]
fn no_circle_between_modules() {
    let krate = read_crate();
    let arrows: BTreeMap<String, BTreeSet<String>> = krate
        .arrows
        .iter()
        .map(|(m, t)| (m.clone(), t.keys().cloned().collect()))
        .collect();
    if let Some(circle) = find_circle(&arrows) {
        panic!("a circle of imports: {}", circle.join(" -> "));
    }
}

#[test]
fn no_circle_between_the_files_of_a_folder() {
    let krate = read_crate();
    let circles: Vec<String> = krate
        .files
        .iter()
        .filter_map(|(folder, files)| {
            find_circle(files).map(|c| format!("{folder}/: {}", c.join(" -> ")))
        })
        .collect();
    assert!(
        circles.is_empty(),
        "circles of imports:\n{}",
        circles.join("\n")
    );
}

#[test]
fn no_source_file_is_a_hiding_place_for_several_modules() {
    let krate = read_crate();
    let big: Vec<String> = krate
        .sizes
        .iter()
        .filter(|(_, n)| *n > MAX_FILE_LINES)
        .map(|(f, n)| format!("{f}: {n} lines"))
        .collect();
    assert!(
        big.is_empty(),
        "files over {MAX_FILE_LINES} lines (split them by idea):\n{}",
        big.join("\n")
    );
}

/// Each `issue N` or `wave N` (any case) in `text`: the line number and the line.
fn history_refs(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let lower = line.to_ascii_lowercase();
        let bytes = lower.as_bytes();
        for word in ["issue ", "wave "] {
            let mut from = 0;
            while let Some(at) = lower[from..].find(word) {
                let start = from + at;
                let end = start + word.len();
                let word_start = start == 0 || !bytes[start - 1].is_ascii_alphanumeric();
                if word_start && bytes.get(end).is_some_and(u8::is_ascii_digit) {
                    found.push((n + 1, line.trim().to_string()));
                }
                from = end;
            }
        }
    }
    found
}

/// Comments and guides state rules, not the story of how the code got there (that is in the
/// commit messages): no `issue N` or `wave N` in `src/`, the README or a published guide
/// (`docs/*.md`; `docs/notes/` is the team's, outside the guides).
#[test]
fn no_history_in_the_source_or_the_guides() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    files.push(root.join("README.md"));
    for entry in std::fs::read_dir(root.join("docs")).expect("docs/") {
        let path = entry.expect("docs/ entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    let mut bad = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("readable");
        for (line, content) in history_refs(&text) {
            let rel = file.strip_prefix(root).unwrap_or(file);
            bad.push(format!("{}:{line}: {content}", rel.display()));
        }
    }
    assert!(
        bad.is_empty(),
        "history where a rule belongs:\n{}",
        bad.join("\n")
    );
}

/// The layer of the features: the types users hold on top of locks.
const FEATURES: u8 = 4;

/// The face's own file: `Redlock` and its public methods, each a delegation to the engine.
const FACE: &str = "src/lock/redlock.rs";

/// Each `impl Redlock` block's public methods in `text` (`pub fn` / `pub async fn`, not
/// `pub(crate)`), by name.
fn public_redlock_methods(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with("impl Redlock {") {
            inside = true;
        } else if line.starts_with('}') {
            inside = false;
        } else if inside {
            let code = line.trim_start();
            for prefix in ["pub fn ", "pub async fn "] {
                if let Some(rest) = code.strip_prefix(prefix) {
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    found.push(name);
                }
            }
        }
    }
    found
}

/// The public client is a face over the engine: `Redlock`'s public methods live in the face's
/// file (`lock/redlock.rs`) or in a feature's own files (`multi.rs`, `semaphore.rs`), never in
/// the engine (`client/`, whose type is the crate-private `Engine`) or below it. The blocking
/// client (`blocking::Redlock`) and the model's client are other types of that name.
#[test]
fn the_public_client_methods_live_in_the_face() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut misplaced = Vec::new();
    let mut face_methods = 0;
    for file in &files {
        let rel = file.strip_prefix(&src).expect("under src");
        let shown = format!("src/{}", rel.display());
        let Some(module) = module_of(rel) else {
            continue;
        };
        if module == "blocking" || module == "model" {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("source is UTF-8");
        let methods = public_redlock_methods(&text);
        if shown == FACE {
            face_methods = methods.len();
        } else if !methods.is_empty() && layer(&module) != Some(FEATURES) {
            misplaced.push(format!("{shown}: {}", methods.join(", ")));
        }
        if module == "client" && text.lines().any(|l| l.starts_with("pub struct Engine")) {
            misplaced.push(format!("{shown}: the engine is public"));
        }
    }
    assert!(face_methods > 0, "{FACE} holds no public method of Redlock");
    assert!(
        misplaced.is_empty(),
        "public client methods outside the face ({FACE}) and the features:\n{}",
        misplaced.join("\n")
    );
}

/// The face and the features reach the nodes only through the engine: no file of `lock/` or
/// of a feature imports `node/` (what they name of it, the engine hands on: `client/side.rs`).
#[test]
fn the_face_and_the_features_never_import_the_node_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let root = root_items(&src);
    let mut bad = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).expect("under src");
        let Some(module) = module_of(rel) else {
            continue;
        };
        if module != "lock" && layer(&module) != Some(FEATURES) {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("source is UTF-8");
        let reaches_node = crate_refs(&text)
            .into_iter()
            .any(|name| root.get(&name).map_or(name.as_str(), String::as_str) == "node");
        if reaches_node
            || text
                .lines()
                .any(|l| l.trim_start().starts_with("use super::super::node"))
        {
            bad.push(format!("src/{}", rel.display()));
        }
    }
    assert!(
        bad.is_empty(),
        "files of the face or a feature that import node/ (go through client/):\n{}",
        bad.join("\n")
    );
}

/// Clippy's `too_many_lines` (Cargo.toml `[lints.clippy]`, 80 lines in `clippy.toml`) holds
/// every function of `src/`, `tests/` and `benches/`, with no exception: no function opts out
/// with `#[expect(clippy::too_many_lines)]` or `#[allow(clippy::too_many_lines)]` (a long one
/// is split by phase instead).
#[test]
fn no_function_opts_out_of_the_80_line_limit() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = std::fs::read_to_string(root.join("clippy.toml")).expect("clippy.toml");
    assert!(
        config.contains("too-many-lines-threshold = 80"),
        "clippy.toml sets the 80-line limit"
    );
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    assert!(
        manifest.contains("[lints.clippy]\ntoo_many_lines = \"warn\""),
        "Cargo.toml enables clippy::too_many_lines"
    );
    let mut files = Vec::new();
    for dir in ["src", "tests", "benches"] {
        rust_files(&root.join(dir), &mut files);
    }
    let mut marked = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("source is UTF-8");
        for (n, line) in text.lines().enumerate() {
            let attribute =
                line.trim_start().starts_with("#[") || line.trim_start().starts_with("#![");
            if attribute && line.contains("clippy::too_many_lines") {
                let rel = file.strip_prefix(root).unwrap_or(file);
                marked.push(format!("{}:{}", rel.display(), n + 1));
            }
        }
    }
    assert!(
        marked.is_empty(),
        "functions exempted from the 80-line limit (split them by phase instead):\n{}",
        marked.join("\n")
    );
}

/// The names of the node layer that the engine hands on (`pub use` / `pub(crate) use` of
/// `crate::node::...` in a file of `client/`), each with the file that does.
fn node_items_handed_on(src: &Path) -> BTreeMap<String, String> {
    let mut files = Vec::new();
    rust_files(&src.join("client"), &mut files);
    let mut items = BTreeMap::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("source is UTF-8");
        for stmt in statements(&text) {
            let Some(path) = ["pub use crate::node", "pub(crate) use crate::node"]
                .iter()
                .find_map(|p| stmt.strip_prefix(p))
            else {
                continue;
            };
            let rel = file.strip_prefix(src).unwrap_or(file);
            for name in use_names(path) {
                items.insert(name, format!("src/{}", rel.display()));
            }
        }
    }
    items
}

/// The identifiers of `text`'s code, comments left out.
fn identifiers(text: &str) -> BTreeSet<String> {
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .flat_map(|code| code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')))
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect()
}

/// What features once named of the node layer to send their commands (whether a call respects
/// the restart hold-out, the commands and scripts, the subscriber of a per-node subscription):
/// the engine's calls named for what a feature needs send them now.
const NODE_VOCABULARY: &[&str] = &[
    "HoldOut",
    "Subscriber",
    "commands",
    "scripts",
    "pubsub",
    "FENCED_WRITE",
    "LEADER_WRITE",
    "LEADER_RESIGN",
];

/// Features reach the nodes only through engine calls named for what they need
/// (`client/side.rs`): no feature file names an item of the node layer, neither one the engine
/// hands on (a `pub use crate::node::...` in `client/`) nor the node vocabulary features once
/// sent their commands with.
#[test]
fn the_features_name_nothing_of_the_node_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let handed_on = node_items_handed_on(&src);
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut bad = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).expect("under src");
        let Some(module) = module_of(rel) else {
            continue;
        };
        if layer(&module) != Some(FEATURES) {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("source is UTF-8");
        for name in identifiers(&text) {
            if let Some(from) = handed_on.get(&name) {
                bad.push(format!(
                    "src/{}: {name} (handed on by {from})",
                    rel.display()
                ));
            } else if NODE_VOCABULARY.contains(&name.as_str()) {
                bad.push(format!("src/{}: {name}", rel.display()));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "feature files that name the node layer (call the engine instead):\n{}",
        bad.join("\n")
    );
}
