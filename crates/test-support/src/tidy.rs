//! Sizes of source files and functions, for the tidy test's ratchet (`tests/tidy.rs`).
//!
//! A long file or function is where a reader loses the thread, and where unrelated concerns
//! meet (issue 41). This measures the workspace's non-test code as `cargo fmt` leaves it,
//! reading text rather than parsing it (line numbers need no compiler and no span support):
//!
//! - a function starts at a line whose code begins with `fn` (after visibility and `const`,
//!   `async`, `unsafe`, `extern "..."`), and ends at the first later line that is its
//!   indentation followed by `}` (rustfmt's closing brace); a declaration ending in `;` has
//!   no body and is not counted;
//! - test code is left out: a `#[cfg(test)]` inline module, and files a `#[cfg(test)] mod
//!   name;` declares (with everything under their directory).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// One measured piece: a file (`name` empty) or a function in it, and its lines.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Size {
    /// The file, relative to the directory measured, with `/` separators.
    pub file: String,
    /// The function's name; empty for the file itself.
    pub name: String,
    pub lines: usize,
}

impl Size {
    /// `file` for a file, `file name` for a function: the key of an allow-list entry.
    pub fn key(&self) -> String {
        if self.name.is_empty() {
            self.file.clone()
        } else {
            format!("{} {}", self.file, self.name)
        }
    }
}

/// Every `.rs` file under `crates/*/src` of the workspace at `root`, except test files.
pub fn source_files(root: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(root)? {
        let src = entry?.path().join("src");
        if src.is_dir() {
            walk(&src, &mut files)?;
        }
    }
    let mut test_only = BTreeSet::new();
    for file in &files {
        let text = std::fs::read_to_string(file)?;
        for name in test_modules_declared(&text) {
            let dir = module_dir(file);
            test_only.insert(dir.join(format!("{name}.rs")));
            test_only.insert(dir.join(&name));
        }
    }
    files.retain(|f| !test_only.iter().any(|t| f == t || f.starts_with(t)));
    files.sort();
    Ok(files)
}

fn walk(dir: &Path, files: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            walk(&path, files)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    Ok(())
}

/// Where the files of `file`'s child modules live.
fn module_dir(file: &Path) -> PathBuf {
    let parent = file.parent().unwrap_or(Path::new("")).to_path_buf();
    match file.file_name().and_then(|n| n.to_str()) {
        Some("lib.rs" | "main.rs" | "mod.rs") => parent,
        _ => parent.join(file.file_stem().unwrap_or_default()),
    }
}

/// Lines with their indentation and code (a line comment's text is not code).
fn code_lines(text: &str) -> Vec<(usize, &str)> {
    text.lines()
        .map(|l| {
            let code = l.trim_start();
            (l.len() - code.len(), code)
        })
        .collect()
}

/// The next line after `i` that is not an attribute.
fn after_attributes(lines: &[(usize, &str)], mut i: usize) -> Option<usize> {
    i += 1;
    while i < lines.len() && lines[i].1.starts_with("#[") {
        i += 1;
    }
    (i < lines.len()).then_some(i)
}

/// The item a line starts, without its visibility: `mod x;`, `fn f(`...
fn without_visibility(code: &str) -> &str {
    let Some(rest) = code.strip_prefix("pub") else {
        return code;
    };
    let rest = match rest.strip_prefix('(') {
        Some(inner) => inner.split_once(')').map_or("", |(_, r)| r),
        None => rest,
    };
    rest.trim_start()
}

/// Names of the modules `text` declares test-only in files of their own.
fn test_modules_declared(text: &str) -> Vec<String> {
    let lines = code_lines(text);
    let mut names = Vec::new();
    for (i, (_, code)) in lines.iter().enumerate() {
        if *code != "#[cfg(test)]" {
            continue;
        }
        let Some(j) = after_attributes(&lines, i) else {
            continue;
        };
        let item = without_visibility(lines[j].1);
        if let Some(name) = item.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
            names.push(name.trim().to_string());
        }
    }
    names
}

/// Whether line `i` is `indent` spaces and a closing brace (rustfmt's end of a block).
fn closes(lines: &[(usize, &str)], i: usize, indent: usize) -> bool {
    lines[i].0 == indent && (lines[i].1 == "}" || lines[i].1 == "};")
}

/// The function a line starts, if it does: its name.
fn function_name(code: &str) -> Option<&str> {
    let mut rest = without_visibility(code);
    loop {
        if let Some(r) = ["const ", "async ", "unsafe ", "default "]
            .iter()
            .find_map(|q| rest.strip_prefix(q))
        {
            rest = r;
        } else if let Some(r) = rest.strip_prefix("extern ") {
            // `extern "C" fn`: the ABI string, then the rest.
            rest = r.trim_start_matches(|c: char| c != ' ').trim_start();
        } else {
            break;
        }
    }
    let name = rest.strip_prefix("fn ")?;
    let end = name
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(name.len());
    (end > 0).then(|| &name[..end])
}

/// The non-test lines of `text` and the length of each function in them.
pub fn measure(file: &str, text: &str) -> Vec<Size> {
    let lines = code_lines(text);
    let mut sizes = Vec::new();
    let mut counted = 0;
    let mut i = 0;
    while i < lines.len() {
        let (indent, code) = lines[i];
        // An inline test module: skipped to its closing brace.
        if code == "#[cfg(test)]" {
            if let Some(j) = after_attributes(&lines, i) {
                let item = without_visibility(lines[j].1);
                if item.starts_with("mod ") && item.ends_with('{') {
                    let end = (j + 1..lines.len())
                        .find(|&k| closes(&lines, k, indent))
                        .unwrap_or(lines.len() - 1);
                    i = end + 1;
                    continue;
                }
            }
        }
        counted += 1;
        if let Some(name) = function_name(code) {
            // The signature ends with the body's `{` or, for a declaration, with `;`.
            let opens = (i..lines.len()).find(|&k| {
                let c = lines[k].1;
                c.ends_with('{') || c.ends_with(';') || c.ends_with('}')
            });
            if let Some(k) = opens {
                let c = lines[k].1;
                let end = if c.ends_with('{') {
                    (k + 1..lines.len()).find(|&e| closes(&lines, e, indent))
                } else if c.ends_with('}') {
                    Some(k)
                } else {
                    None
                };
                if let Some(end) = end {
                    sizes.push(Size {
                        file: file.to_string(),
                        name: name.to_string(),
                        lines: end - i + 1,
                    });
                }
            }
        }
        i += 1;
    }
    sizes.push(Size {
        file: file.to_string(),
        name: String::new(),
        lines: counted,
    });
    sizes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn functions_and_files_are_measured_without_test_code() {
        let text = "\
//! A module.

pub(crate) fn short() -> u8 {
    1
}

impl X {
    pub async fn longer(
        &self,
    ) -> u8
    where
        Self: Sized,
    {
        let x = 1;
        x
    }

    fn declared(&self);
    fn one_liner() {}
}

#[cfg(test)]
mod tests {
    fn in_a_test() {
        let y = 2;
    }
}
";
        let sizes = measure("a.rs", text);
        let get = |name: &str| sizes.iter().find(|s| s.name == name).map(|s| s.lines);
        assert_eq!(get("short"), Some(3));
        assert_eq!(get("longer"), Some(9));
        assert_eq!(get("one_liner"), Some(1));
        assert_eq!(get("declared"), None);
        assert_eq!(get("in_a_test"), None);
        assert_eq!(get(""), Some(21), "the file without its test module");
    }

    #[test]
    fn test_modules_in_files_of_their_own_are_found() {
        let text = "mod real;\n#[cfg(test)]\n#[path = \"x.rs\"]\nmod tests;\n#[cfg(test)]\npub(crate) mod scenarios;\n";
        assert_eq!(test_modules_declared(text), ["tests", "scenarios"]);
        assert_eq!(
            module_dir(Path::new("src/tpc/rod.rs")),
            Path::new("src/tpc/rod")
        );
        assert_eq!(module_dir(Path::new("src/lib.rs")), Path::new("src"));
    }
}
