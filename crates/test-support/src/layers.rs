//! Module layering: which modules of a crate use each other, directly or around a cycle.
//!
//! A reader follows a crate from the bottom up only if no module reaches back to one that uses
//! it. This reads a crate's source with `syn` (no compiler needed) and lists the cycles of
//! its module graph:
//!
//! - a node is one source file (one module) reached from the crate root (`lib.rs`, or
//!   `main.rs` in a crate without a library); test-only modules (`#[cfg(test)]`) and items
//!   are left out, and so are other binaries (`src/bin`, a `main.rs` beside a `lib.rs`);
//! - module A uses module B when a `use` or a path in A's code names an item of B: `crate::`,
//!   `super::` and `self::` paths, and paths through A's own child modules;
//! - a `pub use` (any visibility) is a re-export, not a use: naming an item through it counts
//!   as using the module that defines the item. So a parent that gathers its children's items
//!   for others does not, by that, depend on them;
//! - the crate root is left out as a target: it is every module's namespace (its
//!   re-exports and the crate's vocabulary types).
//!
//! Limits: paths inside macro arguments count only where the arguments parse as expressions,
//! and an inline non-test `mod x { .. }` is read as part of the file around it.
//!
//! Paths a module imports by name and then uses (`use crate::sbc; sbc::execute(..)`) count
//! through the `use`, at module granularity, which is what a cycle is about.
//!
//! A cycle whose files all lie in one directory module (`connection/mod.rs` and the
//! `connection/session.rs` that uses `super::*`) may be one module split into files for
//! reading: each cycle says which directory holds it, if one does, and the test allows the
//! directories it lists by name.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// A module path inside the crate: `["tpc", "rod"]` for `crate::tpc::rod`.
type ModPath = Vec<String>;

/// What one source file says about the modules it uses.
#[derive(Default)]
struct ModuleFile {
    /// Absolute paths named in `use` items and path expressions (not re-exports).
    uses: Vec<ModPath>,
    /// Re-exported names: the name as seen from this module, and the path it stands for.
    reexports: BTreeMap<String, ModPath>,
    /// Child modules declared here; `#[cfg(test)]` ones are left out.
    children: Vec<String>,
}

/// The cycles of the module graph of the crate whose source is in `src`: each cycle is the
/// sorted list of its files (relative to `src`), and a line per file naming the files of
/// the cycle it uses. Empty when the crate is layered. Errors are files that do not parse.
pub fn module_cycles(src: &Path) -> Result<Vec<Cycle>, String> {
    let modules = read_crate(src)?;
    let edges = dependencies(&modules);
    Ok(strongly_connected(&edges)
        .into_iter()
        .map(|cycle| {
            let mut lines = vec![cycle.join(" <-> ")];
            for file in &cycle {
                let uses: Vec<&str> = edges[file]
                    .iter()
                    .filter(|f| cycle.contains(f))
                    .map(String::as_str)
                    .collect();
                lines.push(format!("  {file} uses {}", uses.join(", ")));
            }
            Cycle {
                directory: one_directory(&cycle),
                report: lines.join("\n"),
            }
        })
        .collect())
}

/// A cycle of a crate's module graph.
#[derive(Debug)]
pub struct Cycle {
    /// The directory of `src` (not `src` itself) below which all its files lie, if one does.
    pub directory: Option<String>,
    /// Its files and, per file, the files of the cycle it uses.
    pub report: String,
}

/// The directory of `src` below which every file of `cycle` lies, if one does.
fn one_directory(cycle: &[String]) -> Option<String> {
    let top = |file: &String| {
        let mut parts = Path::new(file).components();
        let first = parts.next()?;
        parts
            .next()
            .map(|_| first.as_os_str().to_string_lossy().into_owned())
    };
    let first = top(&cycle[0])?;
    cycle
        .iter()
        .all(|file| top(file).as_ref() == Some(&first))
        .then_some(first)
}

/// Every non-test module of the crate, by module path, with the file it is in.
fn read_crate(src: &Path) -> Result<BTreeMap<ModPath, (String, ModuleFile)>, String> {
    let mut modules = BTreeMap::new();
    let root = [src.join("lib.rs"), src.join("main.rs")]
        .into_iter()
        .find(|f| f.exists())
        .ok_or_else(|| format!("no lib.rs or main.rs in {}", src.display()))?;
    let mut pending = vec![(Vec::new(), root)];
    while let Some((path, file)) = pending.pop() {
        let text = std::fs::read_to_string(&file)
            .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        let ast =
            syn::parse_file(&text).map_err(|e| format!("cannot parse {}: {e}", file.display()))?;
        let mut module = ModuleFile::default();
        read_items(&path, &ast.items, &mut module);
        for child in &module.children {
            let mut child_path = path.clone();
            child_path.push(child.clone());
            if let Some(child_file) = child_file(src, &path, &file, child) {
                pending.push((child_path, child_file));
            }
        }
        let rel = file
            .strip_prefix(src)
            .unwrap_or(&file)
            .to_string_lossy()
            .into_owned();
        modules.insert(path, (rel, module));
    }
    Ok(modules)
}

/// The file of child module `child` declared in `parent_file` (module `parent`).
fn child_file(src: &Path, parent: &ModPath, parent_file: &Path, child: &str) -> Option<PathBuf> {
    let owns_dir = parent.is_empty()
        || parent_file
            .file_name()
            .is_some_and(|name| name == "mod.rs" || name == "lib.rs" || name == "main.rs");
    let dir = if owns_dir {
        parent_file.parent()?.to_path_buf()
    } else {
        // `a/b.rs` declares its children in `a/b/`.
        let mut dir = src.to_path_buf();
        dir.extend(parent);
        dir
    };
    [
        dir.join(format!("{child}.rs")),
        dir.join(child).join("mod.rs"),
    ]
    .into_iter()
    .find(|f| f.exists())
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

fn read_items(me: &ModPath, items: &[syn::Item], module: &mut ModuleFile) {
    for item in items {
        match item {
            syn::Item::Mod(m) if is_test_only(&m.attrs) => {}
            syn::Item::Mod(m) if m.content.is_none() => module.children.push(m.ident.to_string()),
            syn::Item::Use(u) if is_test_only(&u.attrs) => {}
            syn::Item::Use(u) => {
                let mut leaves = Vec::new();
                use_leaves(Vec::new(), &u.tree, &mut leaves);
                let reexport = !matches!(u.vis, syn::Visibility::Inherited);
                for (name, path) in leaves {
                    let Some(abs) = absolute(me, &module.children, &path) else {
                        continue;
                    };
                    match (reexport, name) {
                        (true, Some(name)) => {
                            module.reexports.insert(name, abs);
                        }
                        (true, None) => {}
                        (false, _) => module.uses.push(abs),
                    }
                }
            }
            other => {
                if !item_is_test_only(other) {
                    let mut paths = PathCollector::default();
                    paths.visit_item(other);
                    for path in paths.found {
                        if let Some(abs) = absolute(me, &module.children, &path) {
                            module.uses.push(abs);
                        }
                    }
                }
            }
        }
    }
}

fn item_is_test_only(item: &syn::Item) -> bool {
    match item {
        syn::Item::Fn(i) => is_test_only(&i.attrs),
        syn::Item::Impl(i) => is_test_only(&i.attrs),
        syn::Item::Struct(i) => is_test_only(&i.attrs),
        syn::Item::Enum(i) => is_test_only(&i.attrs),
        syn::Item::Const(i) => is_test_only(&i.attrs),
        syn::Item::Static(i) => is_test_only(&i.attrs),
        syn::Item::Trait(i) => is_test_only(&i.attrs),
        syn::Item::Type(i) => is_test_only(&i.attrs),
        syn::Item::Mod(i) => is_test_only(&i.attrs),
        _ => false,
    }
}

/// The leaves of a use tree: the name each brings in (`None` for a glob) and its path.
fn use_leaves(
    prefix: Vec<String>,
    tree: &syn::UseTree,
    out: &mut Vec<(Option<String>, Vec<String>)>,
) {
    match tree {
        syn::UseTree::Path(p) => {
            let mut next = prefix;
            next.push(p.ident.to_string());
            use_leaves(next, &p.tree, out);
        }
        syn::UseTree::Name(n) => {
            let mut path = prefix;
            let name = n.ident.to_string();
            if name != "self" {
                path.push(name.clone());
            }
            let shown = if name == "self" {
                path.last().cloned()
            } else {
                Some(name)
            };
            out.push((shown, path));
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix;
            if r.ident != "self" {
                path.push(r.ident.to_string());
            }
            out.push((Some(r.rename.to_string()), path));
        }
        syn::UseTree::Glob(_) => out.push((None, prefix)),
        syn::UseTree::Group(g) => {
            for tree in &g.items {
                use_leaves(prefix.clone(), tree, out);
            }
        }
    }
}

/// Every path with at least two segments in an item's code.
#[derive(Default)]
struct PathCollector {
    found: Vec<Vec<String>>,
}

impl<'ast> Visit<'ast> for PathCollector {
    /// A `use` inside a function body: its leaves are paths like any other.
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if !is_test_only(&u.attrs) {
            let mut leaves = Vec::new();
            use_leaves(Vec::new(), &u.tree, &mut leaves);
            self.found.extend(leaves.into_iter().map(|(_, path)| path));
        }
    }

    /// A macro's arguments, where they read as expressions (`assert!`, `format!`,
    /// `tracing::warn!`, `matches!`'s first argument...): their paths count too.
    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        use syn::parse::Parser;
        let args = syn::punctuated::Punctuated::<syn::Expr, syn::Token![,]>::parse_terminated;
        if let Ok(exprs) = args.parse2(mac.tokens.clone()) {
            for expr in &exprs {
                self.visit_expr(expr);
            }
        }
        syn::visit::visit_macro(self, mac);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.segments.len() > 1 {
            self.found
                .push(path.segments.iter().map(|s| s.ident.to_string()).collect());
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test_only(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test_only(&f.attrs) {
            syn::visit::visit_impl_item_fn(self, f);
        }
    }
}

/// `path` as seen from module `me` (with child modules `children`), made absolute; `None`
/// for paths outside the crate (other crates, the standard library, local names).
fn absolute(me: &ModPath, children: &[String], path: &[String]) -> Option<ModPath> {
    let first = path.first()?;
    match first.as_str() {
        "crate" => Some(path[1..].to_vec()),
        "self" | "super" => {
            let mut base = me.clone();
            let mut rest = path;
            while let Some(head) = rest.first() {
                match head.as_str() {
                    "super" => {
                        base.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                rest = &rest[1..];
            }
            base.extend(rest.iter().cloned());
            Some(base)
        }
        name if children.iter().any(|c| c == name) => {
            let mut abs = me.clone();
            abs.extend(path.iter().cloned());
            Some(abs)
        }
        _ => None,
    }
}

/// The module (by path) defining what `path` names: the longest prefix that is a module,
/// followed through that module's re-exports.
fn defining_module(
    modules: &BTreeMap<ModPath, (String, ModuleFile)>,
    path: &[String],
    hops: usize,
) -> Option<ModPath> {
    for len in (0..=path.len()).rev() {
        let prefix = &path[..len];
        let Some((_, module)) = modules.get(prefix) else {
            continue;
        };
        if let Some(next) = path.get(len) {
            if let Some(target) = module.reexports.get(next) {
                if hops < 16 {
                    let mut followed = target.clone();
                    followed.extend(path[len + 1..].iter().cloned());
                    return defining_module(modules, &followed, hops + 1);
                }
            }
        }
        return Some(prefix.to_vec());
    }
    None
}

/// File -> the files it uses.
fn dependencies(
    modules: &BTreeMap<ModPath, (String, ModuleFile)>,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut edges = BTreeMap::new();
    for (path, (file, module)) in modules {
        let mut used = BTreeSet::new();
        for target in &module.uses {
            let Some(defining) = defining_module(modules, target, 0) else {
                continue;
            };
            if defining.is_empty() || &defining == path {
                continue;
            }
            used.insert(modules[&defining].0.clone());
        }
        edges.insert(file.clone(), used);
    }
    edges
}

/// Strongly connected components with more than one file (Tarjan), each sorted.
fn strongly_connected(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Search<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Search<'a> {
        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.edges.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut search = Search {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !search.index.contains_key(v.as_str()) {
            search.visit(v);
        }
    }
    search.found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cycles of a crate made of `files` (path relative to `src`, contents) in a
    /// temporary directory.
    fn all_cycles_of(files: &[(&str, &str)]) -> Vec<Cycle> {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let file = dir.path().join(path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(file, text).unwrap();
        }
        module_cycles(dir.path()).unwrap()
    }

    /// The reports of those cycles not within one directory.
    fn cycles_of(files: &[(&str, &str)]) -> Vec<String> {
        all_cycles_of(files)
            .into_iter()
            .filter(|c| c.directory.is_none())
            .map(|c| c.report)
            .collect()
    }

    #[test]
    fn two_modules_using_each_other_are_a_cycle() {
        let cycles = cycles_of(&[
            ("lib.rs", "mod a; mod b;"),
            ("a.rs", "use crate::b::B; pub struct A(B);"),
            ("b.rs", "pub struct B; pub fn f(_: &crate::a::A) {}"),
        ]);
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        assert!(cycles[0].starts_with("a.rs <-> b.rs"), "{cycles:?}");
    }

    #[test]
    fn a_cycle_through_a_re_export_is_found_and_a_re_export_alone_is_none() {
        // `lu` names `fam::State`, which `fam/mod.rs` re-exports from `fam/state.rs`; the
        // commands in `fam/cmd.rs` use `lu`. Layered: `fam/mod.rs` only re-exports.
        let layered = [
            ("lib.rs", "mod fam; mod lu;"),
            (
                "fam/mod.rs",
                "mod cmd; mod state; pub use state::State; pub use cmd::run;",
            ),
            ("fam/state.rs", "pub struct State;"),
            ("fam/cmd.rs", "pub fn run(_: &crate::lu::Lu) {}"),
            ("lu.rs", "use crate::fam::State; pub struct Lu(State);"),
        ];
        assert!(cycles_of(&layered).is_empty());
        // The state moved back beside the commands: a cycle, seen through the re-export.
        let cyclic = [
            ("lib.rs", "mod fam; mod lu;"),
            ("fam/mod.rs", "mod cmd; pub use cmd::{run, State};"),
            (
                "fam/cmd.rs",
                "pub struct State; pub fn run(_: &crate::lu::Lu) {}",
            ),
            ("lu.rs", "use crate::fam::State; pub struct Lu(State);"),
        ];
        let cycles = cycles_of(&cyclic);
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        assert!(cycles[0].starts_with("fam/cmd.rs <-> lu.rs"), "{cycles:?}");
    }

    #[test]
    fn uses_inside_function_bodies_and_macro_arguments_count() {
        for b in [
            "pub fn f() { use crate::a::A; let _ = A; }",
            "pub fn f() { assert!(crate::a::ok(), \"{}\", 1); }",
        ] {
            let cycles = cycles_of(&[
                ("lib.rs", "mod a; mod b;"),
                (
                    "a.rs",
                    "pub struct A; pub fn ok() -> bool { crate::b::f(); true }",
                ),
                ("b.rs", b),
            ]);
            assert_eq!(cycles.len(), 1, "{b}: {cycles:?}");
        }
    }

    #[test]
    fn super_paths_and_child_paths_are_uses_and_test_code_is_not() {
        // Inside one directory module the cycle says so; through a module outside it, not.
        let inside = [
            ("lib.rs", "mod p;"),
            ("p/mod.rs", "mod c; pub struct T; pub fn f() { c::g(); }"),
            ("p/c.rs", "pub fn g() { let _ = super::T; }"),
        ];
        let cycles = all_cycles_of(&inside);
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        assert_eq!(cycles[0].directory.as_deref(), Some("p"));
        let cycles = cycles_of(&[
            ("lib.rs", "mod p; mod q;"),
            ("p/mod.rs", "mod c; pub struct T; pub fn f() { c::g(); }"),
            ("p/c.rs", "pub fn g() { crate::q::h(); }"),
            ("q.rs", "pub fn h() { let _ = crate::p::T; }"),
        ]);
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        assert!(
            cycles[0].starts_with("p/c.rs <-> p/mod.rs <-> q.rs"),
            "{cycles:?}"
        );
        let cycles = cycles_of(&[
            ("lib.rs", "mod a; mod b;"),
            (
                "a.rs",
                "pub struct A; #[cfg(test)] mod tests { use crate::b::B; }",
            ),
            (
                "b.rs",
                "pub struct B(crate::a::A); #[cfg(test)] fn t() { let _ = crate::a::A; }",
            ),
        ]);
        assert!(cycles.is_empty(), "{cycles:?}");
    }
}
