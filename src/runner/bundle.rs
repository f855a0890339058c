//! One file per runner: an entry point with the local modules it imports statically written
//! into it, dependencies first.
//!
//! The runners are kept as small ES modules (one copy of the frame plumbing and the loop, one
//! test suite each), but Node resolves, reads and links every module file before the first
//! line runs: each one costs the runner about half a millisecond before its `hello`, on every
//! sandbox start. So what a sandbox gets is assembled: the entry's static imports of `./`
//! modules become the modules' own text (their `export` keywords dropped), once each. Lazily
//! imported modules (a harness) stay separate files next to it.
//!
//! The runner modules keep to a narrow dialect this relies on, and assembling refuses
//! anything outside it, naming the file: top-level `import { a, b } from "./x.mjs";` (no
//! renaming), `export` only on `function`, `async function`, `var`, `let`, `const` or `class`
//! declarations, and no top-level name declared by two modules of one runner.

use std::collections::{BTreeMap, BTreeSet};

/// Why a runner cannot be assembled (a fault in this repository's `runner/`, caught by tests).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot assemble {entry}: {module}: {problem}")]
pub struct BundleError {
    pub entry: String,
    pub module: String,
    pub problem: String,
}

/// A top-level static import: where it stands, what it names, and from where.
struct Import {
    /// Line range (start inclusive, end exclusive) of the statement.
    lines: (usize, usize),
    /// A runner module (`./x.mjs` without its `./`), or `None` for a builtin (`node:fs`),
    /// which stays where it is.
    module: Option<String>,
    names: Vec<String>,
}

/// `entry` with every local module it imports statically (transitively) written into it,
/// dependencies first. `files` maps a file name to its text.
pub fn assemble(entry: &str, files: &BTreeMap<&str, &str>) -> Result<String, BundleError> {
    let fail = |module: &str, problem: String| BundleError {
        entry: entry.to_string(),
        module: module.to_string(),
        problem,
    };
    let mut order = Vec::new();
    visit(entry, files, &mut Vec::new(), &mut order, &fail)?;
    let mut declared: BTreeMap<String, String> = BTreeMap::new();
    let mut out = String::new();
    for module in &order {
        let text = files[module.as_str()];
        let lines: Vec<&str> = text.lines().collect();
        let imports = imports(module, &lines, &fail)?;
        // Builtin imports stay, so their bindings share the one scope with the declarations.
        let builtin_names = imports
            .iter()
            .filter(|i| i.module.is_none())
            .flat_map(|i| i.names.iter().cloned());
        for name in top_level_names(module, &lines, &fail)?
            .into_iter()
            .chain(builtin_names)
        {
            if let Some(other) = declared.insert(name.clone(), module.clone()) {
                return Err(fail(
                    module,
                    format!("the top-level name `{name}` is declared in {other} too"),
                ));
            }
        }
        for import in &imports {
            let Some(target) = &import.module else {
                continue;
            };
            let theirs = top_level_names(
                target,
                &files[target.as_str()].lines().collect::<Vec<_>>(),
                &fail,
            )?;
            if let Some(missing) = import.names.iter().find(|n| !theirs.contains(*n)) {
                return Err(fail(
                    module,
                    format!("imports `{missing}`, which {target} does not declare"),
                ));
            }
        }
        out.push_str(&format!("// ---- {module} ----\n"));
        let mut skip = imports
            .iter()
            .filter(|i| i.module.is_some())
            .map(|i| i.lines)
            .peekable();
        let mut i = 0;
        while i < lines.len() {
            if let Some(&(start, end)) = skip.peek() {
                if i == start {
                    i = end;
                    skip.next();
                    continue;
                }
            }
            out.push_str(strip_export(lines[i]));
            out.push('\n');
            i += 1;
        }
    }
    Ok(out)
}

/// Depth-first over static local imports; `order` receives each module after its imports.
fn visit(
    module: &str,
    files: &BTreeMap<&str, &str>,
    path: &mut Vec<String>,
    order: &mut Vec<String>,
    fail: &dyn Fn(&str, String) -> BundleError,
) -> Result<(), BundleError> {
    if order.iter().any(|m| m == module) {
        return Ok(());
    }
    if path.iter().any(|m| m == module) {
        return Err(fail(
            module,
            format!("an import cycle: {}", path.join(" -> ")),
        ));
    }
    let Some(text) = files.get(module) else {
        return Err(fail(module, "no such runner file".into()));
    };
    let lines: Vec<&str> = text.lines().collect();
    path.push(module.to_string());
    for import in imports(module, &lines, fail)? {
        if let Some(target) = &import.module {
            visit(target, files, path, order, fail)?;
        }
    }
    path.pop();
    order.push(module.to_string());
    Ok(())
}

/// The top-level `import { ... } from "...";` statements of a module.
fn imports(
    module: &str,
    lines: &[&str],
    fail: &dyn Fn(&str, String) -> BundleError,
) -> Result<Vec<Import>, BundleError> {
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if !lines[i].starts_with("import ") {
            i += 1;
            continue;
        }
        let start = i;
        let at = |problem: &str| fail(module, format!("line {}: {problem}", start + 1));
        // An import may span lines; it ends at the line holding `from "...";`.
        while i < lines.len() && !lines[i].contains(" from \"") {
            i += 1;
        }
        let Some(last) = lines.get(i) else {
            return Err(at("an unfinished import"));
        };
        let statement = lines[start..=i].join(" ");
        i += 1;
        let spec = last
            .split(" from \"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .ok_or_else(|| at("an unreadable import"))?;
        let names: Vec<String> = statement
            .split_once('{')
            .and_then(|(_, rest)| rest.split_once('}'))
            .map(|(inside, _)| inside)
            .ok_or_else(|| at("only `import { ... } from` is supported"))?
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(String::from)
            .collect();
        if let Some(renamed) = names.iter().find(|n| n.contains(' ')) {
            return Err(at(&format!(
                "`{renamed}`: a renamed import cannot be assembled"
            )));
        }
        found.push(Import {
            lines: (start, i),
            module: spec.strip_prefix("./").map(String::from),
            names,
        });
    }
    Ok(found)
}

/// Names a module declares at its top level (functions, variables, classes). An `export`
/// of anything else (a list, a default) has no place in an assembled file.
fn top_level_names(
    module: &str,
    lines: &[&str],
    fail: &dyn Fn(&str, String) -> BundleError,
) -> Result<BTreeSet<String>, BundleError> {
    const DECLARATIONS: [&str; 6] = [
        "async function ",
        "function ",
        "var ",
        "let ",
        "const ",
        "class ",
    ];
    let mut names = BTreeSet::new();
    for (n, line) in lines.iter().enumerate() {
        let decl = strip_export(line);
        let rest = DECLARATIONS.iter().find_map(|d| decl.strip_prefix(d));
        let Some(rest) = rest else {
            if line.starts_with("export ") {
                return Err(fail(
                    module,
                    format!("line {}: only declarations may be exported", n + 1),
                ));
            }
            continue;
        };
        let name: String = rest
            .trim_start_matches('*')
            .trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '$')
            .collect();
        if !name.is_empty() {
            names.insert(name);
        }
    }
    Ok(names)
}

/// A declaration without its `export` keyword.
fn strip_export(line: &str) -> &str {
    line.strip_prefix("export ").unwrap_or(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runner files by name, and a case of them: the files, the module named, the problem.
    type Files<'a> = &'a [(&'a str, &'a str)];
    type Case<'a> = (Files<'a>, &'a str, &'a str);

    fn files<'a>(list: Files<'a>) -> BTreeMap<&'a str, &'a str> {
        list.iter().copied().collect()
    }

    #[test]
    fn dependencies_come_first_once_and_lose_their_import_and_export_words() {
        let f = files(&[
            ("main.mjs", "import { a } from \"./a.mjs\";\nimport {\n  b,\n} from \"./b.mjs\";\nimport { join } from \"node:path\";\nconsole.log(a(), b, join);\n"),
            ("a.mjs", "import { b } from \"./b.mjs\";\nexport function a() { return b; }\n"),
            ("b.mjs", "export var b = 1;\n"),
        ]);
        let out = assemble("main.mjs", &f).unwrap();
        let code: Vec<&str> = out.lines().filter(|l| !l.starts_with("// ----")).collect();
        assert_eq!(
            code,
            [
                "var b = 1;",
                "function a() { return b; }",
                "import { join } from \"node:path\";",
                "console.log(a(), b, join);",
            ]
        );
    }

    #[test]
    fn what_cannot_be_assembled_is_refused_naming_the_module() {
        let cases: [Case; 6] = [
            (
                &[
                    ("m.mjs", "import { x as y } from \"./x.mjs\";\n"),
                    ("x.mjs", "export var x = 1;\n"),
                ],
                "m.mjs",
                "renamed",
            ),
            (
                &[
                    ("m.mjs", "import { x } from \"./x.mjs\";\n"),
                    ("x.mjs", "var x = 1;\nexport { x };\n"),
                ],
                "x.mjs",
                "only declarations",
            ),
            (
                &[
                    ("m.mjs", "import { x } from \"./x.mjs\";\nvar x = 2;\n"),
                    ("x.mjs", "export var x = 1;\n"),
                ],
                "m.mjs",
                "declared in x.mjs too",
            ),
            (
                &[
                    ("m.mjs", "import { x } from \"./x.mjs\";\n"),
                    (
                        "x.mjs",
                        "import { m } from \"./m.mjs\";\nexport var x = 1;\n",
                    ),
                ],
                "m.mjs",
                "cycle",
            ),
            (
                &[
                    ("m.mjs", "import { y } from \"./x.mjs\";\n"),
                    ("x.mjs", "export var x = 1;\n"),
                ],
                "m.mjs",
                "does not declare",
            ),
            (
                &[("m.mjs", "import { x } from \"./gone.mjs\";\n")],
                "gone.mjs",
                "no such runner file",
            ),
        ];
        for (list, module, problem) in cases {
            let err = assemble("m.mjs", &files(list)).unwrap_err();
            assert_eq!(err.module, module, "{err}");
            assert!(err.problem.contains(problem), "{err}");
        }
    }
}
