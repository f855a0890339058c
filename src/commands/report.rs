//! `wmo-e2b report`: read finished runs, print the report (text or JSON), write trajectories
//! and the HTML page.

use std::path::PathBuf;

use anyhow::Context;
use wmo_e2b::analysis::{atif, document, html, merge, text};

use super::Exit;

/// Reads finished eval runs and says how they went.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Each DIR is an eval's --out directory, or a directory of shard-I-of-N/ \
ones; all are merged (duplicate ids, absent shards, and shards of different provenance are \
noted). A torn last line, a result without a transcript and a transcript without a result \
are notes too.\n\nExit codes:\n  0  the runs were read, whatever their verdicts\n  2  a \
directory with no results, a tasks file that does not parse, bad options"
)]
pub struct ReportArgs {
    /// Run directories (or directories of shard-I-of-N/ run directories), merged into one.
    #[arg(required = true, value_name = "DIR")]
    pub dirs: Vec<PathBuf>,
    /// Print the report as one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
    /// Compare with a baseline run (its directories, merged like DIR's).
    #[arg(long, value_name = "BASELINE_DIR", num_args = 1..)]
    pub compare: Vec<PathBuf>,
    /// The tasks file of the run: its tasks that no directory has a result for are named.
    #[arg(long, value_name = "FILE")]
    pub tasks: Option<PathBuf>,
    /// Write each task's trajectory to OUTDIR/<id>.json in ATIF (ATIF-v1.8).
    #[arg(long, value_name = "OUTDIR")]
    pub atif: Option<PathBuf>,
    /// Also write the report as one self-contained HTML page (summary, plots, a task table
    /// that sorts and filters, each task's transcript).
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
}

pub fn run(args: ReportArgs) -> anyhow::Result<Exit> {
    let input = document::ReportInput {
        dirs: &args.dirs,
        baseline: &args.compare,
        tasks: args.tasks.as_deref(),
    };
    let (mut report, run) = document::build(&input)?;
    if let Some(out) = &args.atif {
        let written = atif::write_all(&run, out, &mut report.notes)
            .with_context(|| format!("--atif {}", out.display()))?;
        eprintln!("wrote {written} trajectories to {}", out.display());
    }
    if let Some(page) = &args.html {
        // The baseline is read again for the transcripts of flipped tasks (`build` keeps
        // only its figures), and the tasks file for its metadata (the table's filters).
        let baseline = if args.compare.is_empty() {
            None
        } else {
            Some(merge::open_run(&args.compare, args.tasks.as_deref())?)
        };
        let metadata: html::Metadata = match &args.tasks {
            Some(t) => wmo_e2b::task::load_tasks(t)
                .map_err(wmo_e2b::analysis::AnalysisError::from)?
                .into_iter()
                .filter(|t| !t.metadata.is_empty())
                .map(|t| (t.id, t.metadata))
                .collect(),
            None => Default::default(),
        };
        html::write(page, &report, &run, baseline.as_ref(), &metadata)
            .with_context(|| format!("--html {}", page.display()))?;
        eprintln!("wrote {}", page.display());
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", text::render(&report));
    }
    Ok(Exit::Success)
}
