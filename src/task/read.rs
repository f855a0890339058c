//! Reading a tasks file: a line at a time, every line checked before any sandbox starts, and
//! only what a run needs held: for a run, each selected task's place in the file, read again
//! when it is scheduled.

use std::collections::HashSet;
use std::io::{BufRead, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::environment::resolve_environment;
use super::{parse_line, validate, BadLine, Task, TaskError, MAX_BAD_LINES};

/// Longest tasks-file line read: a longer one is a bad line, not a reason to hold it.
pub const MAX_LINE_BYTES: usize = 64 << 20;

/// Reads and validates every line; the error lists every bad line.
pub fn load_tasks(path: &Path) -> Result<Vec<Task>, TaskError> {
    load_tasks_where(path, |_| true)
}

/// Every line checked (the error lists every bad one); the tasks `keep` selects, parsed.
pub fn load_tasks_where(
    path: &Path,
    mut keep: impl FnMut(&Task) -> bool,
) -> Result<Vec<Task>, TaskError> {
    let mut kept = Vec::new();
    scan(path, MAX_LINE_BYTES, |task, _| {
        if keep(&task) {
            kept.push(task);
        }
    })?;
    Ok(kept)
}

pub fn parse_tasks(path: &Path, text: &str) -> Result<Vec<Task>, TaskError> {
    let mut check = Checker::new(path);
    let mut kept = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if let Some(task) = check.line(i + 1, line) {
            kept.push(task);
        }
    }
    check.finish(path)?;
    Ok(kept)
}

/// Where a task's line lies in its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskEntry {
    pub id: String,
    /// 1-based line number.
    pub line: usize,
    /// The task has a `max_cost_usd`, which needs prices to be counted.
    pub cost_limited: bool,
    offset: u64,
    len: usize,
}

/// The tasks a run selected, as places in the checked file: ids and offsets are all that
/// is held, so a file of any size costs memory for its ids, not its tasks. Tasks read from
/// task directories (see `harbor`) are held whole instead: their reading is bounded.
#[derive(Debug, Clone)]
pub struct TaskList {
    path: PathBuf,
    entries: Vec<TaskEntry>,
    /// The longest `timeout_s` among the selected tasks (sandbox leases are sized by it).
    max_timeout_s: Option<f64>,
    /// Tasks held whole, with the digest of everything they were read from.
    held: Option<(Vec<Task>, String)>,
}

impl TaskList {
    /// Every line checked (the error lists every bad one); the places of the tasks `keep`
    /// selects.
    pub fn index_where(
        path: &Path,
        mut keep: impl FnMut(&Task) -> bool,
    ) -> Result<TaskList, TaskError> {
        let mut list = TaskList {
            path: path.to_path_buf(),
            entries: Vec::new(),
            max_timeout_s: None,
            held: None,
        };
        scan(path, MAX_LINE_BYTES, |task, (offset, len)| {
            if keep(&task) {
                if let Some(t) = task.timeout_s {
                    list.max_timeout_s = Some(list.max_timeout_s.map_or(t, |m| m.max(t)));
                }
                list.entries.push(TaskEntry {
                    cost_limited: task.max_cost_usd.is_some(),
                    id: task.id,
                    line: task.line,
                    offset,
                    len,
                });
            }
        })?;
        Ok(list)
    }

    /// Tasks already read and checked (from task directories under `path`), the ones `keep`
    /// selects; `digest` names everything they were read from.
    pub fn held(
        path: &Path,
        tasks: Vec<Task>,
        digest: String,
        mut keep: impl FnMut(&Task) -> bool,
    ) -> TaskList {
        let tasks: Vec<Task> = tasks.into_iter().filter(|t| keep(t)).collect();
        let entries = tasks
            .iter()
            .enumerate()
            .map(|(i, t)| TaskEntry {
                cost_limited: t.max_cost_usd.is_some(),
                id: t.id.clone(),
                line: t.line,
                offset: i as u64,
                len: 0,
            })
            .collect();
        let max_timeout_s = tasks.iter().filter_map(|t| t.timeout_s).reduce(f64::max);
        TaskList {
            path: path.to_path_buf(),
            entries,
            max_timeout_s,
            held: Some((tasks, digest)),
        }
    }

    /// The digest of the task directories held tasks were read from (`None` for a tasks
    /// file, whose own digest says it).
    pub fn held_digest(&self) -> Option<&str> {
        self.held.as_ref().map(|(_, digest)| digest.as_str())
    }

    pub fn entries(&self) -> &[TaskEntry] {
        &self.entries
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn max_timeout_s(&self) -> Option<f64> {
        self.max_timeout_s
    }

    /// The file the tasks were read from (a tasks file, or the task directories' root).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Keeps the entries `keep` selects (`--resume` drops the finished ones).
    pub fn retain(&mut self, keep: impl FnMut(&TaskEntry) -> bool) {
        self.entries.retain(keep);
    }

    /// The task at `entry`, read again from the file. A file changed since it was checked
    /// (that line no longer holds that task, or is no longer valid) is an error, never
    /// another task run in its place.
    pub fn load(&self, entry: &TaskEntry) -> Result<Task, TaskError> {
        if let Some((tasks, _)) = &self.held {
            // Held whole: never read again, so never changed.
            return usize::try_from(entry.offset)
                .ok()
                .and_then(|i| tasks.get(i))
                .cloned()
                .ok_or_else(|| TaskError::Changed {
                    path: self.path.clone(),
                    line: entry.line,
                    id: entry.id.clone(),
                });
        }
        let read_err = |source| TaskError::Read {
            path: self.path.clone(),
            source,
        };
        let changed = || TaskError::Changed {
            path: self.path.clone(),
            line: entry.line,
            id: entry.id.clone(),
        };
        let mut file = std::fs::File::open(&self.path).map_err(read_err)?;
        file.seek(SeekFrom::Start(entry.offset)).map_err(read_err)?;
        let mut bytes = vec![0u8; entry.len];
        file.read_exact(&mut bytes).map_err(|_| changed())?;
        let text = std::str::from_utf8(&bytes).map_err(|_| changed())?;
        let mut task = parse_line(text.trim()).map_err(|_| changed())?;
        if task.id != entry.id
            || resolve_environment(&mut task, &self.path).is_err()
            || validate(&task).is_err()
        {
            return Err(changed());
        }
        Ok(Task {
            line: entry.line,
            ..task
        })
    }
}

/// Reads `path` a line at a time, checking every line; each valid task goes to `on_task`
/// with its line's byte offset and length. Fails, listing every bad line, when any is.
fn scan(
    path: &Path,
    max_line: usize,
    mut on_task: impl FnMut(Task, (u64, usize)),
) -> Result<(), TaskError> {
    let read_err = |source| TaskError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_err)?;
    let mut reader = std::io::BufReader::with_capacity(1 << 16, file);
    let mut check = Checker::new(path);
    let mut buf = Vec::new();
    let mut line_no = 0;
    let mut offset: u64 = 0;
    loop {
        buf.clear();
        let n = Read::by_ref(&mut reader)
            .take(max_line as u64 + 1)
            .read_until(b'\n', &mut buf)
            .map_err(read_err)?;
        if n == 0 {
            break;
        }
        let start = offset;
        offset += n as u64;
        line_no += 1;
        if buf.len() > max_line && !buf.ends_with(b"\n") {
            // The rest of an over-long line is skipped: reported, never held.
            loop {
                let mut rest = Vec::new();
                let m = Read::by_ref(&mut reader)
                    .take(1 << 20)
                    .read_until(b'\n', &mut rest)
                    .map_err(read_err)?;
                offset += m as u64;
                if m == 0 || rest.ends_with(b"\n") {
                    break;
                }
            }
            check.bad(line_no, format!("the line is longer than {max_line} bytes"));
            continue;
        }
        match std::str::from_utf8(&buf) {
            Ok(text) => {
                if let Some(task) = check.line(line_no, text) {
                    on_task(task, (start, n));
                }
            }
            Err(_) => check.bad(line_no, "the line is not UTF-8".into()),
        }
    }
    check.finish(path)
}

/// Validates lines one by one: what a tasks file must be, wherever its lines come from.
struct Checker {
    /// The tasks file, which paths in its tasks are relative to.
    file: PathBuf,
    bad: Vec<BadLine>,
    more: usize,
    /// Ids of every line that parsed, valid or not: a repeat is a bad line either way.
    seen: HashSet<String>,
    /// Tasks on valid lines.
    valid: usize,
}

impl Checker {
    fn new(file: &Path) -> Checker {
        Checker {
            file: file.to_path_buf(),
            bad: Vec::new(),
            more: 0,
            seen: HashSet::new(),
            valid: 0,
        }
    }

    /// The task on `line_no`, or `None` (a blank or comment line, or a bad one, recorded).
    fn line(&mut self, line_no: usize, line: &str) -> Option<Task> {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with("//") {
            return None;
        }
        let seen = &mut self.seen;
        let file = &self.file;
        let checked = parse_line(trimmed).and_then(|mut task| {
            if !seen.insert(task.id.clone()) {
                return Err(format!(
                    "field `id`: duplicate task id {:?} (ids must be unique)",
                    task.id
                ));
            }
            resolve_environment(&mut task, file)?;
            validate(&task).map(|()| task)
        });
        match checked {
            Ok(task) => {
                self.valid += 1;
                Some(Task {
                    line: line_no,
                    ..task
                })
            }
            Err(message) => {
                self.bad(line_no, message);
                None
            }
        }
    }

    fn bad(&mut self, line: usize, message: String) {
        if self.bad.len() >= MAX_BAD_LINES {
            self.more += 1;
        } else {
            self.bad.push(BadLine { line, message });
        }
    }

    fn finish(self, path: &Path) -> Result<(), TaskError> {
        if !self.bad.is_empty() {
            return Err(TaskError::Invalid {
                path: path.to_path_buf(),
                lines: self.bad,
                more: self.more,
            });
        }
        if self.valid == 0 {
            return Err(TaskError::Empty {
                path: path.to_path_buf(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_checked(path: &Path, max_line: usize) -> Result<Vec<Task>, TaskError> {
        let mut all = Vec::new();
        scan(path, max_line, |t, _| all.push(t))?;
        Ok(all)
    }

    #[test]
    fn a_streamed_file_keeps_what_is_selected_and_still_checks_every_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let ok = |id: &str| format!(r#"{{"id": "{id}", "instruction": "x"}}"#);
        std::fs::write(&path, [ok("a"), ok("b"), ok("c")].join("\n") + "\n").unwrap();
        let kept = load_tasks_where(&path, |t| t.id != "b").unwrap();
        let ids: Vec<(&str, usize)> = kept.iter().map(|t| (t.id.as_str(), t.line)).collect();
        assert_eq!(ids, [("a", 1), ("c", 3)]);

        // A bad line the selection would not keep still fails the file, by its line.
        let mut bytes = [ok("a"), "{\"id\": 3}".into(), ok("a")]
            .join("\n")
            .into_bytes();
        bytes.extend_from_slice(b"\n\xff\xfe\n");
        std::fs::write(&path, &bytes).unwrap();
        let Err(TaskError::Invalid { lines, .. }) = load_tasks_where(&path, |_| false) else {
            panic!("a bad file loaded");
        };
        let at: Vec<usize> = lines.iter().map(|l| l.line).collect();
        assert_eq!(at, [2, 3, 4], "{lines:?}");
        assert!(lines[1].message.contains("duplicate"), "{lines:?}");
        assert!(lines[2].message.contains("UTF-8"), "{lines:?}");
    }

    #[test]
    fn an_over_long_line_is_a_bad_line_and_the_next_one_still_reads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let long = format!(r#"{{"id": "long", "instruction": "{}"}}"#, "x".repeat(300));
        let text = format!("{long}\n{{\"id\": \"b\", \"instruction\": \"y\"}}\n");
        std::fs::write(&path, text).unwrap();
        let Err(TaskError::Invalid { lines, .. }) = load_checked(&path, 100) else {
            panic!("an over-long line loaded");
        };
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert_eq!(lines[0].line, 1);
        assert!(
            lines[0].message.contains("longer than 100 bytes"),
            "{lines:?}"
        );
        assert_eq!(load_checked(&path, 1000).unwrap().len(), 2);
    }

    #[test]
    fn a_task_list_reads_each_task_from_its_place_and_notices_a_changed_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let text = concat!(
            "// tasks\r\n",
            "{\"id\": \"a\", \"instruction\": \"one\", \"timeout_s\": 5}\r\n",
            "\n",
            "{\"id\": \"b\", \"instruction\": \"two\", \"timeout_s\": 9}\n",
            "{\"id\": \"c\", \"instruction\": \"three\"}"
        );
        std::fs::write(&path, text).unwrap();
        let mut list = TaskList::index_where(&path, |t| t.id != "b").unwrap();
        assert_eq!(list.max_timeout_s(), Some(5.0));
        let loaded: Vec<(String, String, usize)> = list
            .entries()
            .iter()
            .map(|e| list.load(e).unwrap())
            .map(|t| (t.id, t.instruction, t.line))
            .collect();
        assert_eq!(
            loaded,
            [
                ("a".into(), "one".into(), 2),
                ("c".into(), "three".into(), 5)
            ]
        );
        list.retain(|e| e.id == "c");
        assert_eq!(list.len(), 1);

        // The file changed under the run: the place holds another task now.
        std::fs::write(&path, text.replace("\"c\"", "\"z\"")).unwrap();
        let e = list.load(&list.entries()[0]).unwrap_err();
        assert!(matches!(e, TaskError::Changed { line: 5, .. }), "{e}");
    }
}
