//! Whether a dataset is sound, from a run under `--harness oracle` and one under `--harness
//! nop` compared with each other: every task's reference solution passes and no task passes
//! when the agent does nothing. Anything else is a broken task (its tests or its solution)
//! or tests an agent passes by not trying.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::load::Record;
use super::merge::Run;

/// Most ids each list names.
const NAMED: usize = 50;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetHealth {
    /// Every task both runs have passed under oracle and failed under nop.
    pub healthy: bool,
    /// Tasks both runs have.
    pub tasks: usize,
    /// Tasks whose every oracle attempt passed.
    pub oracle_passed: usize,
    /// Tasks some nop attempt passed.
    pub nop_passed: usize,
    /// Tasks oracle did not pass (first ones, by id).
    pub oracle_failing: Vec<String>,
    /// Tasks nop passed (first ones, by id).
    pub nop_passing: Vec<String>,
    /// Ids only one of the runs has (first ones).
    pub unpaired: Vec<String>,
}

/// The dataset's health when one of `a` and `b` ran under oracle and the other under nop
/// (as their records' provenance says); `None` otherwise.
pub fn health(a: &Run, b: &Run) -> Option<DatasetHealth> {
    let (oracle, nop) = match (harness(a)?, harness(b)?) {
        ("oracle", "nop") => (a, b),
        ("nop", "oracle") => (b, a),
        _ => return None,
    };
    let (oracle, nop) = (verdicts(oracle), verdicts(nop));
    let mut h = DatasetHealth {
        healthy: false,
        tasks: 0,
        oracle_passed: 0,
        nop_passed: 0,
        oracle_failing: Vec::new(),
        nop_passing: Vec::new(),
        unpaired: Vec::new(),
    };
    let ids: BTreeSet<&str> = oracle.keys().chain(nop.keys()).copied().collect();
    let mut unpaired = 0;
    for id in ids {
        let (Some(o), Some(n)) = (oracle.get(id), nop.get(id)) else {
            unpaired += 1;
            push_bounded(&mut h.unpaired, id);
            continue;
        };
        h.tasks += 1;
        if o.all {
            h.oracle_passed += 1;
        } else {
            push_bounded(&mut h.oracle_failing, id);
        }
        if n.any {
            h.nop_passed += 1;
            push_bounded(&mut h.nop_passing, id);
        }
    }
    h.healthy = unpaired == 0 && h.tasks > 0 && h.oracle_passed == h.tasks && h.nop_passed == 0;
    Some(h)
}

/// The run's harness, when every record that says agrees.
fn harness(run: &Run) -> Option<&str> {
    let mut named = run
        .records
        .iter()
        .filter_map(|r| r.provenance.as_ref()?.get("harness")?.as_str());
    let first = named.next()?;
    named.all(|h| h == first).then_some(first)
}

/// Whether all, and whether any, of each task's attempts passed.
struct Passes {
    all: bool,
    any: bool,
}

fn verdicts(run: &Run) -> BTreeMap<&str, Passes> {
    let mut by_id: BTreeMap<&str, Passes> = BTreeMap::new();
    for r in &run.records {
        let p = by_id.entry(r.id.as_str()).or_insert(Passes {
            all: true,
            any: false,
        });
        let passed = Record::passed(r);
        p.all &= passed;
        p.any |= passed;
    }
    by_id
}

fn push_bounded(list: &mut Vec<String>, id: &str) {
    if list.len() < NAMED {
        list.push(id.to_string());
    }
}
