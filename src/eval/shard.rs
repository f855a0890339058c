//! `--shard`: which slice of the tasks file this host runs. `I/N` is given outright; `auto`
//! and `auto/N` take I (and N, where the engine exports it) from the batch engine that
//! started the process: a Kubernetes Indexed Job, a Slurm job array, an AWS Batch array job.
//!
//! Resolution is a pure function of the engine's variables ([`resolve`]), so every variable
//! set and every bad value is testable without touching the process environment. A wrong
//! index is worse than no run: it silently runs some tasks twice and others never, so
//! anything missing, malformed or contradictory is refused, naming the variable.

use std::collections::HashMap;

use crate::task;

/// Kubernetes Indexed Jobs: the pod's completion index, 0 to `spec.completions` - 1. The Job
/// does not export its completions, so the count comes from `--shard auto/N`.
pub const K8S_INDEX: &str = "JOB_COMPLETION_INDEX";
/// Slurm job arrays: the array task's own index, and the array's smallest index and number
/// of tasks (`SLURM_ARRAY_TASK_MAX` checks that the indexes are one contiguous range).
pub const SLURM_ID: &str = "SLURM_ARRAY_TASK_ID";
pub const SLURM_MIN: &str = "SLURM_ARRAY_TASK_MIN";
pub const SLURM_MAX: &str = "SLURM_ARRAY_TASK_MAX";
pub const SLURM_COUNT: &str = "SLURM_ARRAY_TASK_COUNT";
/// AWS Batch array jobs: the child's index from 0, and the parent array's size.
pub const AWS_INDEX: &str = "AWS_BATCH_JOB_ARRAY_INDEX";
pub const AWS_SIZE: &str = "AWS_BATCH_JOB_ARRAY_SIZE";

/// Every variable `--shard auto` reads: all [`engine_env`] collects.
pub const ENGINE_VARS: &[&str] = &[
    K8S_INDEX,
    SLURM_ID,
    SLURM_MIN,
    SLURM_MAX,
    SLURM_COUNT,
    AWS_INDEX,
    AWS_SIZE,
];

/// Shard `index` of `count` (0-based): the tasks whose `shard_of(id, count)` is `index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl Shard {
    /// The shard's own directory under a shared `--out`: `shard-I-of-N`.
    pub fn dir_name(&self) -> String {
        task::shard_dir_name(self.index, self.count)
    }

    pub fn holds(&self, task_id: &str) -> bool {
        task::shard_of(task_id, self.count) == self.index
    }
}

/// What `--shard` said, before the engine is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardSpec {
    Fixed(Shard),
    /// `auto` (`count: None`) or `auto/N`.
    Auto {
        count: Option<u32>,
    },
}

/// The batch engines `--shard auto` knows, by the variable that says a process is one of
/// theirs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Kubernetes,
    Slurm,
    AwsBatch,
}

impl Engine {
    /// The variable carrying the index: its presence is how the engine is recognised.
    pub fn index_var(self) -> &'static str {
        match self {
            Engine::Kubernetes => K8S_INDEX,
            Engine::Slurm => SLURM_ID,
            Engine::AwsBatch => AWS_INDEX,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Engine::Kubernetes => "a Kubernetes Indexed Job",
            Engine::Slurm => "a Slurm job array",
            Engine::AwsBatch => "an AWS Batch array job",
        }
    }

    /// How the user gives the count where the engine does not.
    fn count_hint(self) -> &'static str {
        match self {
            Engine::Kubernetes => {
                "the Job does not export its completions: give --shard auto/N with N its spec.completions"
            }
            Engine::Slurm => {
                "give --shard auto/N with N the array's size (--array=0-(N-1)), or run a Slurm that sets SLURM_ARRAY_TASK_COUNT"
            }
            Engine::AwsBatch => {
                "give --shard auto/N with N the array job's arrayProperties.size"
            }
        }
    }
}

/// Why `--shard` names no usable shard. Every one is the user's to fix (exit 2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    #[error(
        "--shard {given:?}: expected I/N with 0 <= I < N (e.g. 0/4), auto, or auto/N with N >= 1"
    )]
    Syntax { given: String },
    #[error(
        "--shard auto: none of {K8S_INDEX}, {SLURM_ID}, {AWS_INDEX} is set: run it as a \
         Kubernetes Indexed Job, a Slurm job array or an AWS Batch array job, or give --shard I/N"
    )]
    NoEngine,
    #[error("{var}={value:?} is not a whole number: {engine} sets it to one; unset it or give --shard I/N", engine = engine.name())]
    NotANumber {
        var: &'static str,
        value: String,
        engine: Engine,
    },
    #[error("{var}={value} is negative: {engine} indexes and counts are 0 or more; unset it or give --shard I/N", engine = engine.name())]
    Negative {
        var: &'static str,
        value: String,
        engine: Engine,
    },
    #[error("{var} is not set, though {present} is: {engine} sets both; give --shard I/N if this is not one", engine = engine.name())]
    Missing {
        var: &'static str,
        present: &'static str,
        engine: Engine,
    },
    #[error("--shard auto: {var} gives the index but not the count: {hint}", hint = engine.count_hint())]
    NoCount { var: &'static str, engine: Engine },
    #[error("{var}={value} gives shard {index}, not below the {count} shards of {count_from}: the count must be the engine's number of tasks")]
    OutOfRange {
        var: &'static str,
        value: u64,
        index: u64,
        count: u32,
        count_from: String,
    },
    /// `detail` says what disagrees, naming `var` and the others involved.
    #[error("{detail}")]
    Inconsistent { var: &'static str, detail: String },
    #[error(
        "{a} and {b} are both set and disagree (shard {a_shard} vs {b_shard}): unset the one \
         that does not describe this process, or give --shard I/N"
    )]
    Disagree {
        a: &'static str,
        a_shard: String,
        b: &'static str,
        b_shard: String,
    },
}

/// Parses `I/N`, `auto` or `auto/N`.
pub fn parse(s: &str) -> Result<ShardSpec, ShardError> {
    let bad = || ShardError::Syntax {
        given: s.to_string(),
    };
    let count = |n: &str| -> Result<u32, ShardError> {
        match n.trim().parse::<u32>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(bad()),
        }
    };
    let s_trim = s.trim();
    if s_trim == "auto" {
        return Ok(ShardSpec::Auto { count: None });
    }
    let (i, n) = s_trim.split_once('/').ok_or_else(bad)?;
    let n = count(n)?;
    if i.trim() == "auto" {
        return Ok(ShardSpec::Auto { count: Some(n) });
    }
    let i: u32 = i.trim().parse().map_err(|_| bad())?;
    if i >= n {
        return Err(bad());
    }
    Ok(ShardSpec::Fixed(Shard { index: i, count: n }))
}

/// The shard `spec` names: itself, or for `auto` what the engine's variables in `env` say.
pub fn resolve(spec: ShardSpec, env: &HashMap<String, String>) -> Result<Shard, ShardError> {
    let given = match spec {
        ShardSpec::Fixed(shard) => return Ok(shard),
        ShardSpec::Auto { count } => count,
    };
    let found = [
        kubernetes(env, given)?,
        slurm(env, given)?,
        aws_batch(env, given)?,
    ];
    let mut found = found.into_iter().flatten();
    let (first_var, shard) = found.next().ok_or(ShardError::NoEngine)?;
    // Two engines at once is odd (a Slurm job in a pod, a variable left exported), and
    // harmless only while they agree.
    for (var, other) in found {
        if other != shard {
            return Err(ShardError::Disagree {
                a: first_var,
                a_shard: format!("{}/{}", shard.index, shard.count),
                b: var,
                b_shard: format!("{}/{}", other.index, other.count),
            });
        }
    }
    Ok(shard)
}

/// The engine variables of this process (values that are not UTF-8 come through mangled,
/// and so fail as not numbers).
pub fn engine_env() -> HashMap<String, String> {
    ENGINE_VARS
        .iter()
        .filter_map(|&name| {
            let v = std::env::var_os(name)?;
            Some((name.to_string(), v.to_string_lossy().into_owned()))
        })
        .collect()
}

type Found = Option<(&'static str, Shard)>;

fn kubernetes(env: &HashMap<String, String>, given: Option<u32>) -> Result<Found, ShardError> {
    let e = Engine::Kubernetes;
    let Some(index) = number(env, K8S_INDEX, e)? else {
        return Ok(None);
    };
    let count = given.ok_or(ShardError::NoCount {
        var: K8S_INDEX,
        engine: e,
    })?;
    let shard = in_range(K8S_INDEX, index, index, count, "--shard auto/N".into())?;
    Ok(Some((K8S_INDEX, shard)))
}

fn slurm(env: &HashMap<String, String>, given: Option<u32>) -> Result<Found, ShardError> {
    let e = Engine::Slurm;
    let Some(id) = number(env, SLURM_ID, e)? else {
        return Ok(None);
    };
    let min = number(env, SLURM_MIN, e)?.ok_or(ShardError::Missing {
        var: SLURM_MIN,
        present: SLURM_ID,
        engine: e,
    })?;
    let (count, count_from) = count_of(env, SLURM_COUNT, given, e)?;
    if id < min {
        return Err(ShardError::Inconsistent {
            var: SLURM_ID,
            detail: format!(
                "{SLURM_ID}={id} is below {SLURM_MIN}={min}: these are not one array's"
            ),
        });
    }
    // ID - MIN is a shard index only when the array's indexes are MIN..MIN+COUNT with no
    // gaps: a stepped or listed array (--array=0-6:2, --array=1,5) would leave shards out.
    if let Some(max) = number(env, SLURM_MAX, e)? {
        if max.checked_sub(min).map(|d| d + 1) != Some(u64::from(count)) {
            return Err(ShardError::Inconsistent {
                var: SLURM_MAX,
                detail: format!(
                    "{SLURM_MIN}={min} to {SLURM_MAX}={max} is not {count} contiguous indexes ({count_from}): submit the array as --array=0-{} with no step or list",
                    count - 1
                ),
            });
        }
    }
    let shard = in_range(SLURM_ID, id, id - min, count, count_from)?;
    Ok(Some((SLURM_ID, shard)))
}

fn aws_batch(env: &HashMap<String, String>, given: Option<u32>) -> Result<Found, ShardError> {
    let e = Engine::AwsBatch;
    let Some(index) = number(env, AWS_INDEX, e)? else {
        return Ok(None);
    };
    let (count, count_from) = count_of(env, AWS_SIZE, given, e)?;
    let shard = in_range(AWS_INDEX, index, index, count, count_from)?;
    Ok(Some((AWS_INDEX, shard)))
}

/// The shard count from `--shard auto/N` or the engine's own count variable; both must agree
/// when both are there. Also says where it came from, for errors.
fn count_of(
    env: &HashMap<String, String>,
    var: &'static str,
    given: Option<u32>,
    engine: Engine,
) -> Result<(u32, String), ShardError> {
    let from_env = number(env, var, engine)?;
    match (given, from_env) {
        (Some(n), Some(c)) if u64::from(n) != c => Err(ShardError::Inconsistent {
            var,
            detail: format!(
                "{var}={c} but --shard auto/{n}: make N the engine's count, or use --shard auto"
            ),
        }),
        (Some(n), _) => Ok((n, format!("--shard auto/{n}"))),
        (None, Some(c)) => match u32::try_from(c) {
            Ok(c) if c > 0 => Ok((c, format!("{var}={c}"))),
            _ => Err(ShardError::Inconsistent {
                var,
                detail: format!("{var}={c} is no shard count (1 to {})", u32::MAX),
            }),
        },
        (None, None) => Err(ShardError::NoCount {
            var: engine.index_var(),
            engine,
        }),
    }
}

fn in_range(
    var: &'static str,
    value: u64,
    index: u64,
    count: u32,
    count_from: String,
) -> Result<Shard, ShardError> {
    match u32::try_from(index) {
        Ok(i) if i < count => Ok(Shard { index: i, count }),
        _ => Err(ShardError::OutOfRange {
            var,
            value,
            index,
            count,
            count_from,
        }),
    }
}

/// A variable's value as a whole number; `None` when it is not set. Engines write plain
/// decimal digits, so nothing else (no sign, no spaces) is taken.
fn number(
    env: &HashMap<String, String>,
    var: &'static str,
    engine: Engine,
) -> Result<Option<u64>, ShardError> {
    let Some(value) = env.get(var) else {
        return Ok(None);
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if let Some(rest) = value.strip_prefix('-') {
        if digits(rest) {
            return Err(ShardError::Negative {
                var,
                value: value.clone(),
                engine,
            });
        }
    }
    match value.parse::<u64>() {
        Ok(n) if digits(value) => Ok(Some(n)),
        _ => Err(ShardError::NotANumber {
            var,
            value: value.clone(),
            engine,
        }),
    }
}

#[cfg(test)]
mod tests;
