//! The HTML report's plots, as inline SVG: tasks by stop reason split by status, and
//! histograms (time, tokens). Every label is escaped; sizes are fixed, so the page lays out
//! before any script runs.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::escape::html;
use super::load::Record;

const WIDTH: f64 = 460.0;
const BAR_H: f64 = 18.0;
const LABEL_W: f64 = 150.0;
/// Most stop reasons drawn; the rest are summed into one bar.
const MAX_BARS: usize = 12;
const BINS: usize = 20;

/// The fill of a status (the page's legend uses the same).
pub fn color(status: &str) -> &'static str {
    match status {
        "passed" => "#2e7d32",
        "failed" => "#c62828",
        "error" => "#ef6c00",
        _ => "#78909c",
    }
}

/// Horizontal bars, one per stop reason, split by status.
pub fn status_by_stop(records: &[Record]) -> String {
    let mut by: BTreeMap<&str, BTreeMap<&str, usize>> = BTreeMap::new();
    for r in records {
        *by.entry(r.stop_reason.as_str())
            .or_default()
            .entry(r.status.as_str())
            .or_default() += 1;
    }
    let mut rows: Vec<(String, BTreeMap<&str, usize>)> =
        by.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    rows.sort_by_key(|(_, v)| std::cmp::Reverse(v.values().sum::<usize>()));
    if rows.len() > MAX_BARS {
        let mut other: BTreeMap<&str, usize> = BTreeMap::new();
        for (_, v) in rows.drain(MAX_BARS - 1..) {
            for (s, n) in v {
                *other.entry(s).or_default() += n;
            }
        }
        rows.push(("(others)".to_string(), other));
    }
    let most = rows
        .iter()
        .map(|(_, v)| v.values().sum::<usize>())
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let height = rows.len() as f64 * (BAR_H + 6.0) + 10.0;
    let mut o = String::new();
    let _ = write!(
        o,
        r#"<svg class="plot" id="plot-stop" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" role="img"><title>tasks by stop reason and status</title>"#
    );
    for (i, (reason, statuses)) in rows.iter().enumerate() {
        let y = 5.0 + i as f64 * (BAR_H + 6.0);
        let label = if reason.is_empty() { "(none)" } else { reason };
        let _ = write!(
            o,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            LABEL_W - 6.0,
            y + BAR_H - 5.0,
            html(label)
        );
        let mut x = LABEL_W;
        let total: usize = statuses.values().sum();
        for (status, n) in statuses {
            let w = *n as f64 / most * (WIDTH - LABEL_W - 50.0);
            let _ = write!(
                o,
                r#"<rect x="{x:.1}" y="{y}" width="{w:.1}" height="{BAR_H}" fill="{}"><title>{} / {}: {n}</title></rect>"#,
                color(status),
                html(label),
                html(status)
            );
            x += w;
        }
        let _ = write!(
            o,
            r#"<text x="{:.1}" y="{}">{total}</text>"#,
            x + 4.0,
            y + BAR_H - 5.0
        );
    }
    o.push_str("</svg>");
    o
}

/// A histogram of `values` in `BINS` equal bins from 0 to the largest; `unit` labels the axis.
pub fn histogram(id: &str, title: &str, values: &[f64], unit: &str) -> String {
    let values: Vec<f64> = values
        .iter()
        .copied()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .collect();
    let max = values.iter().copied().fold(0.0, f64::max);
    let mut bins = [0usize; BINS];
    for v in &values {
        let b = if max > 0.0 {
            ((v / max) * BINS as f64) as usize
        } else {
            0
        };
        bins[b.min(BINS - 1)] += 1;
    }
    let top = bins.iter().copied().max().unwrap_or(0).max(1) as f64;
    let (h, base) = (140.0, 120.0);
    let bw = (WIDTH - 20.0) / BINS as f64;
    let mut o = String::new();
    let _ = write!(
        o,
        r#"<svg class="plot" id="{}" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{h}" role="img"><title>{}</title>"#,
        html(id),
        html(title)
    );
    for (i, n) in bins.iter().enumerate() {
        let bh = *n as f64 / top * (base - 10.0);
        let lo = max * i as f64 / BINS as f64;
        let hi = max * (i + 1) as f64 / BINS as f64;
        let _ = write!(
            o,
            r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{bh:.1}" fill="#1565c0"><title>{lo:.3}–{hi:.3} {}: {n}</title></rect>"##,
            10.0 + i as f64 * bw,
            base - bh,
            bw - 1.0,
            html(unit)
        );
    }
    let _ = write!(
        o,
        r#"<text x="10" y="{}">0</text><text x="{}" y="{}" text-anchor="end">{} {}</text></svg>"#,
        base + 14.0,
        WIDTH - 10.0,
        base + 14.0,
        fmt_num(max),
        html(unit)
    );
    o
}

fn fmt_num(v: f64) -> String {
    if v >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}
