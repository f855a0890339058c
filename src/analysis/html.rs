//! The report as one self-contained HTML page (`report --html FILE`): no server, network or
//! CDN, so it opens from a `file://` URL and travels as a CI artifact. The summary and plots
//! are static HTML and SVG; the task table is drawn by a small script from an embedded JSON
//! list; each task's conversation sits in its own inert `<script type="application/json">`
//! element, parsed only when the task is opened, so a 10,000-task page stays fast.
//!
//! Everything a run wrote goes through [`escape`](super::escape): HTML text is escaped here,
//! embedded JSON cannot close its element, and the script builds the page with
//! `textContent` only. The file is written beside its final path and renamed into place.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufWriter, Write};
use std::path::Path;

use serde_json::{json, Map, Value};

use super::compare::Comparison;
use super::conversation::{clip, conversation};
use super::escape::{html, script_json};
use super::load::Record;
use super::merge::Run;
use super::plots;
use super::stats::Percentiles;
use super::{AnalysisError, Report};
use crate::eval::schedule::FIRST_ATTEMPT;

const SCRIPT: &str = include_str!("html.js");
const STYLE: &str = include_str!("html.css");
/// Notes listed in full on the page; the rest are counted.
const SHOWN_NOTES: usize = 200;
/// Characters of an answer or error kept in the table's data (for search and the row).
const ROW_TEXT: usize = 200;

/// Most metadata keys of a task the table carries.
const MAX_META_KEYS: usize = 20;

/// Task metadata by id (from the tasks file), for the table's filters.
pub type Metadata = BTreeMap<String, Map<String, Value>>;

/// Writes the page for `report` (with the transcripts of `run`, and of `baseline` for the
/// tasks whose verdict flipped) to `path`.
pub fn write(
    path: &Path,
    report: &Report,
    run: &Run,
    baseline: Option<&Run>,
    metadata: &Metadata,
) -> Result<(), AnalysisError> {
    let name = path.file_name().map_or_else(
        || "report.html".into(),
        |n| n.to_string_lossy().into_owned(),
    );
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let write_err = |source| AnalysisError::Write {
        path: path.to_path_buf(),
        source,
    };
    let result = std::fs::File::create(&tmp).and_then(|f| {
        let mut w = BufWriter::with_capacity(1 << 20, f);
        page(&mut w, report, run, baseline, metadata)?;
        w.flush()?;
        w.into_inner().map_err(|e| e.into_error())?.sync_all()
    });
    if let Err(e) = result.and_then(|()| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(write_err(e));
    }
    Ok(())
}

fn page(
    w: &mut impl Write,
    report: &Report,
    run: &Run,
    baseline: Option<&Run>,
    metadata: &Metadata,
) -> std::io::Result<()> {
    let title = format!("wmo-e2b report: {}", report.runs.join(", "));
    write!(
        w,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width\"><title>{}</title><style>{STYLE}</style>\
</head><body>\n<h1>{}</h1>\n",
        html(&title),
        html(&title)
    )?;
    w.write_all(summary(report).as_bytes())?;
    w.write_all(plots_section(run).as_bytes())?;
    if let Some(c) = &report.compare {
        w.write_all(compare_section(c).as_bytes())?;
    }
    w.write_all(notes_section(report).as_bytes())?;
    w.write_all(TABLE.as_bytes())?;
    let flips = flips(report.compare.as_ref());
    let base_transcripts = baseline.map(transcripts_by_id).unwrap_or_default();
    // Runs are compared on first attempts (pass@k compares them all).
    let base_records: BTreeMap<&str, &Record> = baseline
        .map(|b| {
            b.records
                .iter()
                .filter(|r| r.attempt == FIRST_ATTEMPT)
                .map(|r| (r.id.as_str(), r))
                .collect()
        })
        .unwrap_or_default();
    let mut rows = Vec::with_capacity(run.records.len());
    let mut with_base = Vec::new();
    for (r, &s) in run.records.iter().zip(&run.shard_of) {
        let flip = flips
            .get(r.id.as_str())
            .copied()
            .filter(|_| r.attempt == FIRST_ATTEMPT);
        let base = flip.and_then(|_| base_transcripts.get(r.id.as_str()).copied());
        with_base.push(base);
        let mut v = row(r, &run.shards[s].label, flip, base.is_some());
        if let Some(m) = metadata.get(&r.id) {
            v["meta"] = meta(m);
        }
        rows.push(v);
    }
    writeln!(
        w,
        "<script type=\"application/json\" id=\"tasks-data\">{}</script>",
        script_json(&Value::Array(rows).to_string())
    )?;
    for (i, (r, &s)) in run.records.iter().zip(&run.shard_of).enumerate() {
        let conv = match run.shards[s].transcript(&r.id, r.attempt) {
            Some(p) => conversation(&r.id, p, Some(r)).unwrap_or_else(|e| {
                json!({"error": crate::errors::error_chain(&e), "verdict": super::conversation::verdict(r)})
            }),
            None => json!({"error": "no transcript", "verdict": super::conversation::verdict(r)}),
        };
        embed(w, &format!("tr-{i}"), &conv)?;
        if let Some(p) = with_base[i] {
            let b = base_records.get(r.id.as_str()).copied();
            let conv = conversation(&r.id, p, b)
                .unwrap_or_else(|e| json!({"error": crate::errors::error_chain(&e)}));
            embed(w, &format!("bt-{i}"), &conv)?;
        }
    }
    writeln!(w, "<script>{SCRIPT}</script>\n</body></html>")
}

fn embed(w: &mut impl Write, id: &str, v: &Value) -> std::io::Result<()> {
    writeln!(
        w,
        "<script type=\"application/json\" id=\"{id}\">{}</script>",
        script_json(&v.to_string())
    )
}

const TABLE: &str = r#"<section id="tasks"><h2>Tasks</h2>
<form id="filters" onsubmit="return false">
<label>status <select id="f-status"><option value="">all</option></select></label>
<label>stop reason <select id="f-stop"><option value="">all</option></select></label>
<label>search <input id="f-q" type="search" placeholder="id, answer, error"></label>
<span id="shown"></span></form>
<table id="task-table"><thead><tr>
<th data-k="id">id</th><th data-k="status">status</th><th data-k="stop">stop reason</th>
<th data-k="turns">turns</th><th data-k="tools">tool calls</th><th data-k="tokens">tokens</th>
<th data-k="secs">seconds</th><th data-k="attempts">attempts</th><th data-k="cost">cost</th>
<th data-k="flip">change</th></tr></thead><tbody></tbody></table></section>
<section id="transcript" hidden></section>
<noscript><p>The task table and transcripts need JavaScript.</p></noscript>
"#;

fn transcripts_by_id(run: &Run) -> BTreeMap<&str, &Path> {
    run.records
        .iter()
        .zip(&run.shard_of)
        .filter(|(r, _)| r.attempt == FIRST_ATTEMPT)
        .filter_map(|(r, &s)| {
            let p = run.shards[s].transcripts.get(&r.id)?;
            Some((r.id.as_str(), p.as_path()))
        })
        .collect()
}

fn flips(c: Option<&Comparison>) -> BTreeMap<&str, &'static str> {
    let mut m = BTreeMap::new();
    if let Some(c) = c {
        m.extend(c.now_failing.iter().map(|f| (f.id.as_str(), "now failing")));
        m.extend(c.now_passing.iter().map(|f| (f.id.as_str(), "now passing")));
    }
    m
}

fn short(s: &str) -> String {
    let mut t: String = s.chars().take(ROW_TEXT).collect();
    if t.len() < s.len() {
        t.push('…');
    }
    t
}

fn row(r: &Record, shard: &str, flip: Option<&str>, base: bool) -> Value {
    json!({
        "id": r.id,
        "attempt": r.attempt,
        "status": r.status,
        "stop": r.stop_reason,
        "turns": r.turns,
        "tools": r.tool_calls,
        "tokens": r.tokens.input + r.tokens.output,
        "secs": (r.task_seconds() * 1000.0).round() / 1000.0,
        "attempts": r.attempts,
        "cost": r.cost.as_ref().map(|c| c.usd),
        "shard": shard,
        "flip": flip.unwrap_or(""),
        "base": base,
        "answer": short(&r.answer),
        "error": r.error.as_deref().map(short).unwrap_or_default(),
    })
}

/// A task's scalar metadata as text (objects and arrays are left out: they make no filter).
fn meta(m: &Map<String, Value>) -> Value {
    let mut o = Map::new();
    for (k, v) in m.iter().take(MAX_META_KEYS) {
        let text = match v {
            Value::String(s) => s.clone(),
            Value::Number(_) | Value::Bool(_) => v.to_string(),
            _ => continue,
        };
        o.insert(short(k), Value::String(short(&text)));
    }
    Value::Object(o)
}

fn figure(o: &mut String, key: &str, label: &str, value: &str) {
    let _ = write!(
        o,
        "<div><dt>{}</dt><dd id=\"fig-{key}\">{}</dd></div>",
        html(label),
        html(value)
    );
}

fn pct(p: &Option<Percentiles>) -> String {
    p.map_or_else(
        || "-".into(),
        |p| {
            format!(
                "p50 {:.2} · p90 {:.2} · p99 {:.2} · max {:.2}",
                p.p50, p.p90, p.p99, p.max
            )
        },
    )
}

fn summary(r: &Report) -> String {
    let s = &r.summary;
    let mut o = String::from("<section id=\"summary\"><h2>Summary</h2><dl class=\"figures\">");
    figure(&mut o, "tasks", "tasks", &s.tasks.to_string());
    figure(&mut o, "judged", "judged", &s.judged.to_string());
    figure(&mut o, "passed", "passed", &s.passed.to_string());
    let rate = match (s.pass_rate, s.pass_rate_ci95) {
        (Some(p), Some([lo, hi])) => format!(
            "{:.1}% (95% CI {:.1}–{:.1}%)",
            p * 100.0,
            lo * 100.0,
            hi * 100.0
        ),
        (Some(p), None) => format!("{:.1}%", p * 100.0),
        _ => "-".into(),
    };
    figure(&mut o, "pass-rate", "pass rate", &rate);
    let counts = |m: &BTreeMap<String, usize>| {
        m.iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    figure(&mut o, "status", "by status", &counts(&s.by_status));
    figure(&mut o, "stop", "by stop reason", &counts(&s.by_stop_reason));
    let t = &s.tokens;
    let tokens = format!(
        "{} in ({} cached) · {} out · {} calls",
        t.input, t.cached_input, t.output, t.calls
    );
    figure(&mut o, "tokens", "tokens", &tokens);
    figure(
        &mut o,
        "sandbox-seconds",
        "sandbox-seconds",
        &format!("{:.1}", s.sandbox_seconds),
    );
    if let Some(c) = s.cost_usd {
        let cost = format!("${c:.4} ({} tasks costed)", s.costed_tasks);
        figure(&mut o, "cost", "cost", &cost);
    }
    if let Some(wall) = s.wall_seconds {
        figure(&mut o, "wall", "wall seconds", &format!("{wall:.1}"));
    }
    figure(
        &mut o,
        "task-seconds",
        "task seconds",
        &pct(&s.task_seconds),
    );
    figure(
        &mut o,
        "retried",
        "retried tasks",
        &s.retried_tasks.to_string(),
    );
    o.push_str("</dl>");
    if r.shards.len() > 1 {
        let _ = write!(o, "<p>shards: {}</p>", html(&r.shards.join(", ")));
    }
    o.push_str("</section>\n");
    o
}

fn plots_section(run: &Run) -> String {
    let secs: Vec<f64> = run.records.iter().map(Record::task_seconds).collect();
    let tokens: Vec<f64> = run
        .records
        .iter()
        .map(|r| (r.tokens.input + r.tokens.output) as f64)
        .collect();
    let mut o = String::from("<section id=\"plots\"><h2>Plots</h2><div class=\"plots\">");
    let _ = write!(
        o,
        "<figure><figcaption>tasks by stop reason (<span style=\"color:{}\">passed</span>, \
<span style=\"color:{}\">failed</span>, <span style=\"color:{}\">error</span>, other)\
</figcaption>{}</figure>",
        plots::color("passed"),
        plots::color("failed"),
        plots::color("error"),
        plots::status_by_stop(&run.records)
    );
    let _ = writeln!(
        o,
        "<figure><figcaption>seconds per task</figcaption>{}</figure>\
<figure><figcaption>tokens per task (in + out)</figcaption>{}</figure></div></section>",
        plots::histogram("plot-seconds", "seconds per task", &secs, "s"),
        plots::histogram("plot-tokens", "tokens per task", &tokens, "tokens"),
    );
    o
}

fn compare_section(c: &Comparison) -> String {
    let mut o = String::from("<section id=\"compare\"><h2>Against the baseline</h2>");
    let _ = write!(o, "<p>baseline: {}</p><ul>", html(&c.baseline.join(", ")));
    let d = &c.pass_rate;
    if let (Some(b), Some(n)) = (d.baseline, d.current) {
        let _ = write!(
            o,
            "<li id=\"cmp-pass-rate\">pass rate {:.1}% → {:.1}%</li>",
            b * 100.0,
            n * 100.0
        );
    }
    for (key, title, list) in [
        ("now-failing", "now failing", &c.now_failing),
        ("now-passing", "now passing", &c.now_passing),
    ] {
        if list.is_empty() {
            let _ = write!(o, "<li id=\"cmp-{key}\">{title}: none</li>");
            continue;
        }
        let _ = write!(o, "<li id=\"cmp-{key}\">{title} ({}):", list.len());
        for f in list.iter().take(SHOWN_NOTES) {
            let _ = write!(
                o,
                " <a href=\"#task={}\">{}</a> ({} → {})",
                html(&urlencode(&f.id)),
                html(&f.id),
                html(&f.before),
                html(&f.after)
            );
        }
        o.push_str("</li>");
    }
    let _ = writeln!(
        o,
        "<li>new tasks: {} · missing tasks: {}</li></ul></section>",
        c.new.len(),
        c.missing.len()
    );
    o
}

fn notes_section(r: &Report) -> String {
    let all: Vec<String> = r
        .notes
        .iter()
        .map(ToString::to_string)
        .chain(r.baseline_notes.iter().map(|n| format!("baseline: {n}")))
        .collect();
    if all.is_empty() {
        return String::new();
    }
    let mut o = format!("<section id=\"notes\"><h2>Notes ({})</h2><ul>", all.len());
    for n in all.iter().take(SHOWN_NOTES) {
        let _ = write!(o, "<li>{}</li>", html(&clip(n).0));
    }
    if all.len() > SHOWN_NOTES {
        let _ = write!(o, "<li>… {} more</li>", all.len() - SHOWN_NOTES);
    }
    o.push_str("</ul></section>\n");
    o
}

/// `s` as a URL fragment value (what the page's `URLSearchParams` reads back).
fn urlencode(s: &str) -> String {
    let mut o = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            o.push(b as char);
        } else {
            let _ = write!(o, "%{b:02X}");
        }
    }
    o
}
