//! pass@k of a run of several attempts per task: the chance that at least one of k attempts,
//! drawn without replacement from a task's n judged attempts of which c passed, passes. The
//! unbiased estimator 1 − C(n−c, k) / C(n, k), per task and as the mean over tasks.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::load::Record;

/// pass@1 … pass@K of a run whose tasks have up to K attempts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PassAtK {
    /// K: the most attempts any task has (its highest attempt number).
    pub k: u32,
    /// pass@1 … pass@K, each the mean over the tasks with at least k judged attempts.
    pub overall: Vec<PassAt>,
    /// Per task, in id order.
    pub tasks: Vec<TaskPassAtK>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PassAt {
    pub k: u32,
    /// None when no task has k judged attempts.
    pub value: Option<f64>,
    /// Tasks the mean is over.
    pub tasks: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskPassAtK {
    pub id: String,
    /// Judged attempts (an attempt cancelled, skipped or unserved by the model API is not).
    pub n: u32,
    /// Of them, passed.
    pub c: u32,
    /// pass@1 … pass@K; None past n.
    pub pass_at: Vec<Option<f64>>,
}

/// 1 − C(n−c, k) / C(n, k), the ratio as a running product so no binomial is ever formed
/// (they overflow long before n does): ∏ (1 − k/i) for i in n−c+1 ..= n, or equally
/// ∏ (n−c−j)/(n−j) for j in 0..k, whichever has fewer factors. None when k is 0 or past n.
pub fn estimate(n: u32, c: u32, k: u32) -> Option<f64> {
    if k == 0 || k > n || c > n {
        return None;
    }
    if n - c < k {
        // Every draw of k holds a pass.
        return Some(1.0);
    }
    let none_pass: f64 = if c <= k {
        (n - c + 1..=n)
            .map(|i| 1.0 - f64::from(k) / f64::from(i))
            .product()
    } else {
        (0..k)
            .map(|j| f64::from(n - c - j) / f64::from(n - j))
            .product()
    };
    Some(1.0 - none_pass)
}

/// pass@k of `records`, or None when no task has more than one attempt (a run of one attempt
/// reads as it did before attempts existed).
pub fn pass_at_k(records: &[Record]) -> Option<PassAtK> {
    let k = records.iter().map(|r| r.attempt).max()?;
    if k <= 1 {
        return None;
    }
    let mut by_task: BTreeMap<&str, (u32, u32)> = BTreeMap::new();
    for r in records {
        let (n, c) = by_task.entry(&r.id).or_default();
        if r.judged() {
            *n += 1;
            *c += u32::from(r.passed());
        }
    }
    let tasks: Vec<TaskPassAtK> = by_task
        .into_iter()
        .map(|(id, (n, c))| TaskPassAtK {
            id: id.to_string(),
            n,
            c,
            pass_at: (1..=k).map(|k| estimate(n, c, k)).collect(),
        })
        .collect();
    let overall = (1..=k)
        .map(|kk| {
            let values: Vec<f64> = tasks
                .iter()
                .filter_map(|t| t.pass_at[kk as usize - 1])
                .collect();
            PassAt {
                k: kk,
                value: (!values.is_empty())
                    .then(|| values.iter().sum::<f64>() / values.len() as f64),
                tasks: values.len(),
            }
        })
        .collect();
    Some(PassAtK { k, overall, tasks })
}

impl PassAtK {
    /// pass@`k` over all tasks, when there is one.
    pub fn at(&self, k: u32) -> Option<f64> {
        self.overall.iter().find(|p| p.k == k).and_then(|p| p.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-12)
    }

    #[test]
    fn all_passed_is_certain() {
        for k in 1..=5 {
            assert_eq!(estimate(5, 5, k), Some(1.0));
        }
    }

    #[test]
    fn none_passed_is_zero() {
        for k in 1..=5 {
            assert_eq!(estimate(5, 0, k), Some(0.0));
        }
    }

    #[test]
    fn k_equal_to_n_passes_when_any_attempt_did() {
        assert_eq!(estimate(4, 1, 4), Some(1.0));
        assert_eq!(estimate(4, 0, 4), Some(0.0));
    }

    #[test]
    fn matches_the_binomial_form() {
        // n = 5, c = 2: 1 − C(3, k) / C(5, k).
        assert!(close(estimate(5, 2, 1), 1.0 - 3.0 / 5.0));
        assert!(close(estimate(5, 2, 2), 1.0 - 3.0 / 10.0));
        assert!(close(estimate(5, 2, 3), 1.0 - 1.0 / 10.0));
        assert_eq!(estimate(5, 2, 4), Some(1.0));
        // More passes than draws: the product over the k draws.
        assert!(close(estimate(10, 5, 2), 1.0 - 10.0 / 45.0));
        assert!(close(estimate(10, 7, 2), 1.0 - 3.0 / 45.0));
        // One pass in three.
        assert!(close(estimate(3, 1, 1), 1.0 / 3.0));
        assert!(close(estimate(3, 1, 2), 2.0 / 3.0));
    }

    #[test]
    fn large_n_neither_overflows_nor_loses_the_answer() {
        // C(10000, 5000) is some 3000 digits; the product never forms it.
        let p = estimate(10_000, 5_000, 1).unwrap();
        assert!((p - 0.5).abs() < 1e-9, "{p}");
        let p = estimate(10_000, 1, 1).unwrap();
        assert!((p - 1e-4).abs() < 1e-12, "{p}");
        let p = estimate(u32::MAX, 1, 1).unwrap();
        assert!(p > 0.0 && p < 1e-9, "{p}");
        let p = estimate(10_000, 5_000, 100).unwrap();
        assert!(p.is_finite() && p > 1.0 - 1e-12, "{p}");
        // Both forms of the product agree where they meet (c = k and c = k + 1).
        assert!(close(
            estimate(1_000, 3, 3),
            1.0 - (997.0 * 996.0 * 995.0) / (1000.0 * 999.0 * 998.0)
        ));
        let p = estimate(u32::MAX, u32::MAX / 2, 2).unwrap();
        assert!((p - 0.75).abs() < 1e-6, "{p}");
    }

    fn records(lines: &[(&str, u32, &str)]) -> Vec<Record> {
        lines
            .iter()
            .map(|(id, attempt, status)| {
                serde_json::from_value(serde_json::json!({
                    "id": id, "attempt": attempt, "status": status, "stop_reason": "submit",
                }))
                .unwrap()
            })
            .collect()
    }

    #[test]
    fn a_task_short_of_k_judged_attempts_leaves_the_mean_at_k() {
        let p = pass_at_k(&records(&[
            ("full", 1, "passed"),
            ("full", 2, "failed"),
            ("short", 1, "failed"),
            ("short", 2, "cancelled"),
        ]))
        .unwrap();
        let short = p.tasks.iter().find(|t| t.id == "short").unwrap();
        assert_eq!(
            (short.n, short.c, &short.pass_at[..]),
            (1, 0, &[Some(0.0), None][..])
        );
        assert_eq!((p.overall[0].value, p.overall[0].tasks), (Some(0.25), 2));
        assert_eq!((p.overall[1].value, p.overall[1].tasks), (Some(1.0), 1));
    }

    #[test]
    fn one_attempt_has_no_pass_at_k() {
        assert_eq!(pass_at_k(&records(&[("a", 1, "passed")])), None);
        assert_eq!(pass_at_k(&[]), None);
    }

    #[test]
    fn undefined_past_n() {
        assert_eq!(estimate(3, 1, 4), None);
        assert_eq!(estimate(3, 1, 0), None);
        assert_eq!(estimate(3, 4, 1), None);
    }
}
