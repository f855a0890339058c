//! The report as terminal text. Everything a run wrote (ids, statuses, errors, verify
//! output, notes, run names) goes through the terminal escaper: a results file is data, and
//! the screen must not act on it.

use std::fmt::Write;

use crate::terminal::{escape, plural};

use super::compare::{Comparison, Delta, Flip};
use super::health::DatasetHealth;
use super::pass_at_k::PassAtK;
use super::stats::{Percentiles, Summary};
use super::Report;

/// Failing tasks listed in full; the rest are counted.
const SHOWN_FAILURES: usize = 50;
/// Notes listed in full; the rest are counted.
const SHOWN_NOTES: usize = 50;

pub fn render(r: &Report) -> String {
    let mut out = String::new();
    let _ = write_report(&mut out, r);
    out
}

fn write_report(o: &mut String, r: &Report) -> std::fmt::Result {
    writeln!(o, "run: {}", escape(&r.runs.join(", ")))?;
    if r.shards.len() > 1 || r.shards != r.runs {
        let shards = r.shards.join(", ");
        writeln!(o, "shards: {} ({})", r.shards.len(), escape(&shards))?;
    }
    write_summary(o, &r.summary)?;
    if !r.failures.is_empty() {
        writeln!(o, "\nnot passed ({}):", r.failures.len())?;
        for f in r.failures.iter().take(SHOWN_FAILURES) {
            write!(
                o,
                "  {}  {} / {}",
                attempt_name(&f.id, f.attempt),
                escape(&f.status),
                escape(&f.stop_reason)
            )?;
            match (f.verify_exit_code, f.verify_timed_out) {
                (_, true) => write!(o, "  verify timed out")?,
                (Some(code), false) => write!(o, "  verify exit {code}")?,
                (None, false) => {}
            }
            writeln!(o)?;
            if let Some(e) = &f.error {
                writeln!(o, "      error: {}", one_line(e))?;
            }
            for line in &f.verify_tail {
                writeln!(o, "      | {}", escape(line))?;
            }
        }
        if r.failures.len() > SHOWN_FAILURES {
            writeln!(o, "  ... and {} more", r.failures.len() - SHOWN_FAILURES)?;
        }
    }
    if let Some(c) = &r.compare {
        write_compare(o, c)?;
    }
    if let Some(h) = &r.dataset {
        write_health(o, h)?;
    }
    write_notes(o, "notes", &r.notes)?;
    write_notes(o, "baseline notes", &r.baseline_notes)
}

fn write_summary(o: &mut String, s: &Summary) -> std::fmt::Result {
    let counted = match &s.pass_at_k {
        Some(p) => format!(
            "{} of {}",
            plural(s.tasks as u64, "attempt"),
            plural(p.tasks.len() as u64, "task")
        ),
        None => plural(s.tasks as u64, "task"),
    };
    match (s.pass_rate, s.pass_rate_ci95) {
        (Some(p), Some([lo, hi])) => writeln!(
            o,
            "pass rate: {:.1}% ({} of {} judged; 95% CI {:.1}%-{:.1}%), {counted}",
            p * 100.0,
            s.passed,
            s.judged,
            lo * 100.0,
            hi * 100.0,
        )?,
        _ => writeln!(o, "pass rate: n/a (no judged task), {counted}")?,
    }
    if let Some(p) = &s.pass_at_k {
        write_pass_at_k(o, p)?;
    }
    writeln!(o, "status: {}", counts(&s.by_status))?;
    writeln!(o, "stop reason: {}", counts(&s.by_stop_reason))?;
    let t = &s.tokens;
    writeln!(
        o,
        "tokens: {} in ({} cached), {} out ({} reasoning), {} model calls",
        t.input, t.cached_input, t.output, t.reasoning, t.calls
    )?;
    write!(o, "sandbox-seconds: {:.1} in tasks", s.sandbox_seconds)?;
    if let Some(pool) = s.run_sandbox_seconds {
        write!(o, ", {pool:.1} in all")?;
    }
    writeln!(o)?;
    if let Some(usd) = s.cost_usd {
        writeln!(
            o,
            "cost: ${usd:.4} ({} of {} tasks priced)",
            s.costed_tasks, s.tasks
        )?;
    }
    if let Some(w) = s.wall_seconds {
        writeln!(o, "wall: {w:.1}s")?;
    }
    if let Some(p) = &s.task_seconds {
        writeln!(o, "per task: {}", pct(p))?;
    }
    if let Some(p) = &s.episode_seconds {
        writeln!(o, "per episode: {}", pct(p))?;
    }
    if s.retried_tasks > 0 {
        writeln!(
            o,
            "retried: {} task(s) took more than one attempt",
            s.retried_tasks
        )?;
    }
    Ok(())
}

/// pass@1 … pass@K over all tasks, then per task (the first [`SHOWN_FAILURES`] of them).
fn write_pass_at_k(o: &mut String, p: &PassAtK) -> std::fmt::Result {
    let overall: Vec<String> = p
        .overall
        .iter()
        .map(|a| format!("pass@{} {}", a.k, percent(a.value)))
        .collect();
    writeln!(o, "{}", overall.join(", "))?;
    writeln!(o, "per task (passed/judged, pass@1..pass@{}):", p.k)?;
    for t in p.tasks.iter().take(SHOWN_FAILURES) {
        let values: Vec<String> = t.pass_at.iter().map(|v| percent(*v)).collect();
        writeln!(
            o,
            "  {}  {}/{}  {}",
            escape(&t.id),
            t.c,
            t.n,
            values.join(" ")
        )?;
    }
    if p.tasks.len() > SHOWN_FAILURES {
        writeln!(
            o,
            "  ... and {} more (all of them with --json)",
            p.tasks.len() - SHOWN_FAILURES
        )?;
    }
    Ok(())
}

fn percent(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".into(), |v| format!("{:.1}%", v * 100.0))
}

/// A task as a line names it: with its attempt past the first.
fn attempt_name(id: &str, attempt: u32) -> String {
    if attempt > 1 {
        format!("{} #{attempt}", escape(id))
    } else {
        escape(id).into_owned()
    }
}

fn write_compare(o: &mut String, c: &Comparison) -> std::fmt::Result {
    writeln!(o, "\ncompared with {}:", escape(&c.baseline.join(", ")))?;
    writeln!(o, "  pass rate: {}", delta(&c.pass_rate, 100.0, "%"))?;
    for p in &c.pass_at_k {
        writeln!(o, "  pass@{}: {}", p.k, delta(&p.delta, 100.0, "%"))?;
    }
    writeln!(o, "  tokens: {}", delta(&c.tokens, 1.0, ""))?;
    writeln!(
        o,
        "  sandbox-seconds: {}",
        delta(&c.sandbox_seconds, 1.0, "s")
    )?;
    writeln!(
        o,
        "  per-task p50: {}",
        delta(&c.task_seconds_p50, 1.0, "s")
    )?;
    writeln!(o, "  wall: {}", delta(&c.wall_seconds, 1.0, "s"))?;
    flips(o, "passed -> not passed", &c.now_failing)?;
    flips(o, "not passed -> passed", &c.now_passing)?;
    ids(o, "new (not in the baseline)", &c.new)?;
    ids(o, "missing (only in the baseline)", &c.missing)
}

fn flips(o: &mut String, title: &str, list: &[Flip]) -> std::fmt::Result {
    if list.is_empty() {
        return Ok(());
    }
    writeln!(o, "  {title} ({}):", list.len())?;
    for f in list.iter().take(SHOWN_FAILURES) {
        writeln!(
            o,
            "    {}  {} -> {}",
            escape(&f.id),
            escape(&f.before),
            escape(&f.after)
        )?;
    }
    Ok(())
}

fn write_health(o: &mut String, h: &DatasetHealth) -> std::fmt::Result {
    let verdict = if h.healthy { "healthy" } else { "NOT healthy" };
    writeln!(
        o,
        "\ndataset: {verdict}: oracle passed {}/{} tasks, nop passed {}",
        h.oracle_passed, h.tasks, h.nop_passed
    )?;
    ids(o, "oracle did not pass", &h.oracle_failing)?;
    ids(o, "nop passed", &h.nop_passing)?;
    ids(o, "in one run only", &h.unpaired)
}

fn ids(o: &mut String, title: &str, list: &[String]) -> std::fmt::Result {
    if list.is_empty() {
        return Ok(());
    }
    let shown: Vec<_> = list
        .iter()
        .take(SHOWN_FAILURES)
        .map(|id| escape(id))
        .collect();
    let more = if list.len() > shown.len() {
        ", ..."
    } else {
        ""
    };
    writeln!(o, "  {title} ({}): {}{more}", list.len(), shown.join(", "))
}

fn write_notes(o: &mut String, title: &str, notes: &[super::Note]) -> std::fmt::Result {
    if notes.is_empty() {
        return Ok(());
    }
    writeln!(o, "\n{title} ({}):", notes.len())?;
    for n in notes.iter().take(SHOWN_NOTES) {
        writeln!(o, "  {}", escape(&n.to_string()))?;
    }
    if notes.len() > SHOWN_NOTES {
        writeln!(
            o,
            "  ... and {} more (all of them with --json)",
            notes.len() - SHOWN_NOTES
        )?;
    }
    Ok(())
}

fn counts(m: &std::collections::BTreeMap<String, usize>) -> String {
    let parts: Vec<String> = m
        .iter()
        .map(|(k, v)| format!("{} {v}", escape(k)))
        .collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

fn pct(p: &Percentiles) -> String {
    format!(
        "p50 {:.2}s, p90 {:.2}s, p99 {:.2}s, max {:.2}s",
        p.p50, p.p90, p.p99, p.max
    )
}

/// A change as `before -> after (+change)`; counts (`unit` "" at scale 1: tokens) print whole.
fn delta(d: &Delta, scale: f64, unit: &str) -> String {
    let decimals = if unit.is_empty() && scale == 1.0 {
        0
    } else {
        1
    };
    let num = |v: f64| format!("{:.*}{unit}", decimals, v * scale);
    let f = |v: Option<f64>| v.map_or("n/a".to_string(), num);
    match d.change {
        Some(c) => format!(
            "{} -> {} ({}{})",
            f(d.baseline),
            f(d.current),
            if c >= 0.0 { "+" } else { "" },
            num(c)
        ),
        None => format!("{} -> {}", f(d.baseline), f(d.current)),
    }
}

/// The first line of `s`, escaped and cut at 200 characters.
fn one_line(s: &str) -> String {
    let line = escape(s.lines().next().unwrap_or("")).into_owned();
    if line.chars().count() > 200 {
        line.chars().take(200).collect::<String>() + "..."
    } else {
        line
    }
}
