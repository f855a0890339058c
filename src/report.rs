//! The one place eval output is drawn: progress on stderr, or JSON Lines on stdout.
//!
//! Workers send [`EvalEvent`]s; the reporter thread owns the terminal. With `--json`, every
//! event is one JSON object per line on stdout (a `type` tag on each), so nothing else may
//! write there. Every string a task, harness, model or sandbox gave goes through
//! [`escape`] before it reaches the terminal.

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};

use crate::eval::{EvalEvent, EvalSummary, Phase, RunningTask, Status, Tally, TaskRecord};
use crate::terminal::{escape, plural};

/// Progress redraws at most this often.
const TICK: Duration = Duration::from_millis(200);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportMode {
    /// A live progress line on stderr (a terminal).
    Progress,
    /// One line on stderr per finished task (logs, CI).
    Lines,
    /// JSON Lines on stdout.
    Json,
}

/// Consumes events until the channel closes: draws progress as tasks finish and, at the
/// summary, the table and totals (or, in JSON mode, one line per event).
/// Off a terminal (`Lines`, `Json`), a heartbeat is said every `heartbeat`.
pub fn run_reporter(mode: ReportMode, heartbeat: Duration, events: Receiver<EvalEvent>) {
    let started = Instant::now();
    let mut total = 0;
    let mut per_task = 1;
    let mut tally = Tally::default();
    // By task and attempt: two attempts of one task may run at once.
    let mut running: Running = HashMap::new();
    let mut records = Vec::new();
    let mut drawn = false;
    let mut next_beat = started + heartbeat;
    let stderr = std::io::stderr();
    let stdout = std::io::stdout();
    loop {
        if mode != ReportMode::Progress && Instant::now() >= next_beat {
            next_beat = Instant::now() + heartbeat;
            let beat = heartbeat_event(started, tally.done(), total, &running);
            match mode {
                ReportMode::Json => json_line(&stdout, &beat),
                _ => {
                    let _ = writeln!(stderr.lock(), "{}", heartbeat_line(&beat, per_task));
                }
            }
        }
        let event = match events.recv_timeout(TICK) {
            Ok(e) => e,
            Err(RecvTimeoutError::Timeout) => {
                if mode == ReportMode::Progress {
                    draw(
                        &mut stderr.lock(),
                        total,
                        &tally,
                        &running,
                        started,
                        per_task,
                    );
                    drawn = true;
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        if mode == ReportMode::Json {
            json_line(&stdout, &event);
        }
        match event {
            EvalEvent::RunStarted {
                total: n, attempts, ..
            } => {
                total = n;
                per_task = attempts;
            }
            EvalEvent::TaskStarted { id, attempt } => {
                running.insert((id, attempt), (Instant::now(), Phase::Sandbox));
            }
            EvalEvent::TaskPhase { id, attempt, phase } => {
                if let Some(entry) = running.get_mut(&(id, attempt)) {
                    entry.1 = phase;
                }
            }
            // Said by this thread, never sent to it.
            EvalEvent::Heartbeat { .. } => {}
            EvalEvent::TaskRetrying {
                id,
                attempt,
                reason,
            } => {
                if mode != ReportMode::Json {
                    let mut err = stderr.lock();
                    clear(&mut err, drawn);
                    let _ = writeln!(
                        err,
                        "retry   {} (attempt {attempt}): {}",
                        escape(&id),
                        escape(&reason)
                    );
                }
            }
            EvalEvent::TaskFinished { record } => {
                running.remove(&(record.id.clone(), record.attempt));
                tally.add(record.status);
                if mode == ReportMode::Lines {
                    let _ = writeln!(stderr.lock(), "{}", task_line(&record, per_task));
                }
                records.push(*record);
            }
            EvalEvent::ResultsFailed { message } => {
                if mode != ReportMode::Json {
                    let mut err = stderr.lock();
                    clear(&mut err, drawn);
                    let _ = writeln!(err, "error: {}", escape(&message));
                }
            }
            EvalEvent::Interrupted => {
                let mut err = stderr.lock();
                clear(&mut err, drawn);
                let _ = writeln!(
                    err,
                    "\ninterrupted: cancelling running tasks (Ctrl-C again to kill sandboxes and exit now)"
                );
            }
            EvalEvent::Summary { summary, out_dir } => {
                if mode == ReportMode::Progress && drawn {
                    clear(&mut stderr.lock(), true);
                    drawn = false;
                }
                if mode != ReportMode::Json {
                    let mut out = stdout.lock();
                    let _ = write!(out, "{}", summary_table(&records, &summary));
                    let _ = out.flush();
                    if let Some(fatal) = &summary.fatal {
                        let _ = writeln!(
                            stderr.lock(),
                            "error: the run stopped early: {}",
                            escape(fatal)
                        );
                    }
                    let results = out_dir.join("results.jsonl");
                    let _ = writeln!(out, "results: {}", escape(&results.display().to_string()));
                }
            }
        }
    }
    if mode == ReportMode::Progress && drawn {
        clear(&mut stderr.lock(), true);
    }
}

/// The running tasks: when each started, and where it is.
type Running = HashMap<(String, u32), (Instant, Phase)>;

fn json_line(stdout: &std::io::Stdout, event: &EvalEvent) {
    if let Ok(line) = serde_json::to_string(event) {
        let mut out = stdout.lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

/// Running tasks a heartbeat line names; the rest are counted.
const BEAT_NAMED: usize = 8;

fn heartbeat_event(started: Instant, done: usize, total: usize, running: &Running) -> EvalEvent {
    let mut tasks: Vec<RunningTask> = running
        .iter()
        .map(|((id, attempt), (since, phase))| RunningTask {
            id: id.clone(),
            attempt: *attempt,
            phase: *phase,
            seconds: since.elapsed().as_secs_f64(),
        })
        .collect();
    // Longest running first: the one a reader looks for.
    tasks.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    EvalEvent::Heartbeat {
        seconds: started.elapsed().as_secs_f64(),
        done,
        total,
        running: tasks,
    }
}

fn heartbeat_line(beat: &EvalEvent, per_task: u32) -> String {
    let EvalEvent::Heartbeat {
        seconds,
        done,
        total,
        running,
    } = beat
    else {
        return String::new();
    };
    let mut line = format!(
        "running {} · {done}/{total} done · {}",
        clock(*seconds),
        plural(running.len() as u64, "task")
    );
    let named: Vec<String> = running
        .iter()
        .take(BEAT_NAMED)
        .map(|t| {
            let name = task_name(&t.id, t.attempt, per_task);
            format!("{name} ({} {})", t.phase.as_str(), clock(t.seconds))
        })
        .collect();
    if !named.is_empty() {
        line.push_str(": ");
        line.push_str(&named.join(", "));
    }
    if running.len() > BEAT_NAMED {
        line.push_str(&format!(", and {} more", running.len() - BEAT_NAMED));
    }
    line
}

fn clear(out: &mut impl Write, drawn: bool) {
    if drawn {
        let _ = write!(out, "\r\x1b[2K");
    }
}

fn draw(
    out: &mut impl Write,
    total: usize,
    c: &Tally,
    running: &Running,
    started: Instant,
    per_task: u32,
) {
    let elapsed = started.elapsed().as_secs_f64();
    let done = c.done();
    let eta = if done > 0 && total > done {
        let per = elapsed / done as f64;
        format!(" · ETA {}", clock(per * (total - done) as f64))
    } else {
        String::new()
    };
    let longest = running
        .iter()
        .max_by_key(|(_, (t, _))| std::cmp::Reverse(*t))
        .map(|((id, attempt), (t, _))| {
            let secs = t.elapsed().as_secs_f64();
            let name = task_name(id, *attempt, per_task);
            format!(" · longest {name} {}", clock(secs))
        })
        .unwrap_or_default();
    // Several attempts per task: the counts are of attempts, and say so.
    let unit = if per_task > 1 { " attempts" } else { "" };
    let _ = write!(
        out,
        "\r\x1b[2K[{}/{}{unit}] passed {} · failed {} · errors {} · running {}{eta}{longest}",
        done,
        total,
        c.passed,
        c.failed,
        c.errors,
        running.len()
    );
    let _ = out.flush();
}

fn clock(secs: f64) -> String {
    let s = secs.round() as u64;
    format!("{}:{:02}", s / 60, s % 60)
}

/// A task as a line names it: with its attempt when there are several.
fn task_name(id: &str, attempt: u32, per_task: u32) -> String {
    if per_task > 1 {
        format!("{} #{attempt}", escape(id))
    } else {
        escape(id).into_owned()
    }
}

fn task_line(r: &TaskRecord, per_task: u32) -> String {
    let mut line = format!(
        "{:<9} {} ({}, {} turns, {:.1}s)",
        r.status.as_str(),
        task_name(&r.id, r.attempt, per_task),
        r.stop_reason,
        r.turns,
        r.timings.acquire + r.timings.episode + r.timings.verify
    );
    if let Some(e) = &r.error {
        line.push_str(": ");
        line.push_str(&one_line(e, 160));
    }
    line
}

/// `s` flattened to one escaped line, cut at `max` characters.
fn one_line(s: &str, max: usize) -> String {
    let flat: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    let flat = escape(&flat).into_owned();
    if flat.chars().count() > max {
        format!("{}…", flat.chars().take(max).collect::<String>())
    } else {
        flat
    }
}

/// The human summary: a table of tasks (all of them when few, else the ones that did not
/// pass) and the totals.
pub fn summary_table(records: &[TaskRecord], summary: &EvalSummary) -> String {
    const FULL_TABLE: usize = 50;
    let mut rows: Vec<&TaskRecord> = records
        .iter()
        .filter(|r| records.len() <= FULL_TABLE || r.status != Status::Passed)
        .collect();
    rows.sort_by(|a, b| (&a.id, a.attempt).cmp(&(&b.id, b.attempt)));
    let name = |r: &TaskRecord| task_name(&r.id, r.attempt, summary.attempts);
    let width = rows
        .iter()
        .map(|r| name(r).chars().count())
        .max()
        .unwrap_or(4)
        .clamp(4, 40);
    let mut out = String::new();
    if !rows.is_empty() {
        out.push_str(&format!(
            "{:<width$}  {:<9}  {:<16}  {:>5}  {:>7}  {}\n",
            "task", "status", "stop reason", "turns", "seconds", "note"
        ));
        for r in rows {
            let secs = r.timings.acquire + r.timings.episode + r.timings.verify;
            out.push_str(&format!(
                "{:<width$}  {:<9}  {:<16}  {:>5}  {:>7.1}  {}\n",
                name(r),
                r.status.as_str(),
                r.stop_reason,
                r.turns,
                secs,
                r.error
                    .as_deref()
                    .map(|e| one_line(e, 80))
                    .unwrap_or_default()
            ));
        }
        out.push('\n');
    }
    let counted = if summary.attempts > 1 {
        format!(
            "{} × {}",
            plural(summary.tasks as u64, "task"),
            plural(u64::from(summary.attempts), "attempt")
        )
    } else {
        plural(summary.total as u64, "task")
    };
    out.push_str(&format!(
        "{counted}: {} passed, {} failed, {} errors, {} cancelled",
        summary.tally.passed, summary.tally.failed, summary.tally.errors, summary.tally.cancelled
    ));
    if summary.tally.over_budget > 0 {
        out.push_str(&format!(
            ", {} skipped at a spend cap",
            summary.tally.over_budget
        ));
    }
    if summary.not_run > 0 {
        out.push_str(&format!(", {} not run", summary.not_run));
    }
    if summary.already_finished > 0 {
        let what = if summary.attempts > 1 {
            "attempt"
        } else {
            "task"
        };
        let n = plural(summary.already_finished as u64, what);
        out.push_str(&format!(" ({n} already finished, not run again)"));
    }
    out.push_str(&format!(
        "\n{:.1}s wall · {}, {:.1} sandbox-seconds · {} model calls, {} input + {} output tokens · retries: {} transport, {} provider\n",
        summary.wall_seconds,
        plural(summary.sandboxes.count, "sandbox"),
        summary.sandboxes.seconds,
        summary.tokens.calls,
        summary.tokens.input,
        summary.tokens.output,
        summary.transport_retries,
        summary.provider_retries,
    ));
    if let Some(cost) = summary.spend.cost_usd {
        out.push_str(&format!("cost: ${cost:.4}\n"));
    }
    if let Some(cap) = summary.stopped_by {
        out.push_str(&format!(
            "stopped at {}: {}; --resume with a higher cap runs the rest\n",
            cap.flag(),
            summary.caps.describe(cap, summary.spend)
        ));
    }
    if let Some(e) = &summary.cleanup_error {
        out.push_str(&format!("cleanup: {}\n", escape(e)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOSTILE: &str = "t\x1b[2J\x1b]0;pwned\x07\u{202e}";

    #[test]
    fn the_progress_line_counts_attempts_when_there_are_several() {
        let running = HashMap::from([(("t".to_string(), 2), (Instant::now(), Phase::Episode))]);
        let line = |per_task| {
            let mut out = Vec::new();
            draw(
                &mut out,
                36,
                &Tally::default(),
                &running,
                Instant::now(),
                per_task,
            );
            String::from_utf8(out).unwrap()
        };
        let several = line(3);
        assert!(
            several.contains("[0/36 attempts]") && several.contains("longest t #2 "),
            "{several}"
        );
        let one = line(1);
        assert!(
            one.contains("[0/36]") && one.contains("longest t "),
            "{one}"
        );
    }

    #[test]
    fn the_progress_line_writes_no_escape_but_its_own() {
        let running = HashMap::from([((HOSTILE.to_string(), 1), (Instant::now(), Phase::Verify))]);
        let beat = heartbeat_line(&heartbeat_event(Instant::now(), 0, 3, &running), 1);
        assert!(
            !beat.contains('\x1b') && beat.contains("(verify 0:00)"),
            "{beat}"
        );
        let mut out = Vec::new();
        draw(&mut out, 3, &Tally::default(), &running, Instant::now(), 1);
        let line = String::from_utf8(out).unwrap();
        let own = line.strip_prefix("\r\x1b[2K").unwrap();
        assert!(!own.chars().any(crate::terminal::is_unsafe), "{own:?}");
        assert!(
            own.contains("t\\x1b[2J\\x1b]0;pwned\\x07\\u{202e}"),
            "{own}"
        );
    }
}
