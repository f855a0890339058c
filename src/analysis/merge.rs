//! One run from the directories given: each is a run directory (`results.jsonl` in it), a
//! directory of `shard-I-of-N/` run directories, or both. Shards merge into one set of
//! records; duplicate ids, absent shards, tasks of the tasks file no shard has, and shards
//! made by different provenance are named in notes, not hidden.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::load::{load_shard, Record, Shard};
use super::notes::ShardValue;
use super::{AnalysisError, Note};
use crate::eval::schedule::FIRST_ATTEMPT;

/// The merged run.
#[derive(Debug, Clone)]
pub struct Run {
    pub shards: Vec<Shard>,
    /// One record per id and attempt: the first shard's where several have it.
    pub records: Vec<Record>,
    /// For each record, the index of its shard.
    pub shard_of: Vec<usize>,
    pub notes: Vec<Note>,
}

/// Most ids a missing-tasks note names.
const NAMED_MISSING: usize = 50;

/// Provenance fields compared across shards (`tasks_file.sha256` too). `wmo_e2b` is there:
/// another build may score differently.
const PROVENANCE_FIELDS: [&str; 10] = [
    "wmo_e2b",
    "runner",
    "harness",
    "harness_digest",
    "environment",
    "backend",
    "template",
    "model",
    "provider_host",
    "skills",
];

/// Reads and merges `dirs`; `tasks`, when given, is the tasks file the run was made from.
pub fn open_run(dirs: &[PathBuf], tasks: Option<&Path>) -> Result<Run, AnalysisError> {
    let mut notes = Vec::new();
    let mut shards = Vec::new();
    for dir in dirs {
        let found = shard_dirs(dir, &mut notes)?;
        if found.is_empty() {
            return Err(AnalysisError::NoResults { path: dir.clone() });
        }
        for (path, label) in found {
            shards.push(load_shard(&path, label, &mut notes)?);
        }
    }
    let mut first: BTreeSet<(String, u32)> = BTreeSet::new();
    let mut seen_in: BTreeMap<(String, u32), Vec<String>> = BTreeMap::new();
    let mut records = Vec::new();
    let mut shard_of = Vec::new();
    for (s, shard) in shards.iter().enumerate() {
        for r in &shard.records {
            let key = (r.id.clone(), r.attempt);
            seen_in
                .entry(key.clone())
                .or_default()
                .push(shard.label.clone());
            if !first.insert(key) {
                continue;
            }
            records.push(r.clone());
            shard_of.push(s);
        }
    }
    for ((id, _), in_shards) in seen_in {
        if in_shards.len() > 1 {
            notes.push(Note::DuplicateId {
                id,
                shards: in_shards,
            });
        }
    }
    provenance_notes(&shards, &mut notes);
    if let Some(path) = tasks {
        let file = crate::task::load_tasks(path)?;
        let missing: Vec<String> = file
            .iter()
            .filter(|t| {
                let any_attempt = (t.id.clone(), FIRST_ATTEMPT)..=(t.id.clone(), u32::MAX);
                first.range(any_attempt).next().is_none()
            })
            .map(|t| t.id.clone())
            .collect();
        if !missing.is_empty() {
            notes.push(Note::MissingTasks {
                count: missing.len(),
                ids: missing.into_iter().take(NAMED_MISSING).collect(),
                tasks_file: path.display().to_string(),
            });
        }
    }
    Ok(Run {
        shards,
        records,
        shard_of,
        notes,
    })
}

/// The run directories in `dir`: itself when it holds `results.jsonl`, then its
/// `shard-I-of-N/` subdirectories in index order. Shards the others imply (same N) but that
/// are absent are noted.
fn shard_dirs(dir: &Path, notes: &mut Vec<Note>) -> Result<Vec<(PathBuf, String)>, AnalysisError> {
    let mut out = Vec::new();
    if dir.join("results.jsonl").is_file() {
        out.push((dir.to_path_buf(), dir.display().to_string()));
    }
    let mut shards: BTreeMap<(u32, u32), PathBuf> = BTreeMap::new();
    super::each_entry(dir, |entry| {
        // An entry that cannot be read is no shard to merge.
        let Ok(entry) = entry else { return Ok(()) };
        let name = entry.file_name();
        let shard = name.to_str().and_then(parse_shard_name);
        if let Some((i, count)) = shard {
            if entry.path().join("results.jsonl").is_file() {
                shards.insert((count, i), entry.path());
            }
        }
        Ok(())
    })?;
    let counts: BTreeSet<u32> = shards.keys().map(|&(count, _)| count).collect();
    for count in counts {
        let present: BTreeSet<u32> = shards
            .keys()
            .filter(|k| k.0 == count)
            .map(|k| k.1)
            .collect();
        // Indices are those of `--shard I/N` (from 0); a set that reaches N counts from 1.
        let base = u32::from(present.contains(&count));
        for i in base..count.saturating_add(base) {
            if !present.contains(&i) {
                notes.push(Note::MissingShard {
                    dir: dir
                        .join(crate::task::shard_dir_name(i, count))
                        .display()
                        .to_string(),
                });
            }
        }
    }
    for path in shards.into_values() {
        let label = path.display().to_string();
        out.push((path, label));
    }
    Ok(out)
}

/// `shard-I-of-N` as (I, N), for a shard this reader can place: I up to N (a set may count
/// from 1), and N bounded, so an odd name cannot make the absent-shard check walk billions
/// of indices.
fn parse_shard_name(name: &str) -> Option<(u32, u32)> {
    crate::task::parse_shard_dir_name(name).filter(|&(i, n)| n <= 100_000 && i <= n)
}

fn provenance_notes(shards: &[Shard], notes: &mut Vec<Note>) {
    if shards.len() < 2 {
        return;
    }
    let field_of = |p: Option<&Value>, field: &str| -> String {
        let v = match field {
            "tasks_file" => p
                .and_then(|p| p.get("tasks_file"))
                .and_then(|t| t.get("sha256")),
            f => p.and_then(|p| p.get(f)),
        };
        match v {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None => "(none)".into(),
            Some(other) => other.to_string(),
        }
    };
    for field in PROVENANCE_FIELDS.iter().copied().chain(["tasks_file"]) {
        let values: Vec<ShardValue> = shards
            .iter()
            .map(|s| ShardValue {
                shard: s.label.clone(),
                value: field_of(s.provenance(), field),
            })
            .collect();
        if values.iter().any(|v| v.value != values[0].value) {
            notes.push(Note::ProvenanceMismatch {
                field: field.to_string(),
                values,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_names_parse_strictly() {
        assert_eq!(parse_shard_name("shard-0-of-4"), Some((0, 4)));
        assert_eq!(parse_shard_name("shard-4-of-4"), Some((4, 4)));
        assert_eq!(parse_shard_name("shard-5-of-4"), None);
        assert_eq!(parse_shard_name("shard-+1-of-4"), None);
        assert_eq!(parse_shard_name("shard-1-of-0"), None);
        assert_eq!(parse_shard_name("shard-1-of-4x"), None);
    }
}
