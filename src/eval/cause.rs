//! Why a task did not pass, said in its record: whatever the verdict, a record that is not
//! `passed` names its cause in `error`, so nobody has to open a transcript to learn it.

use super::results::{Status, TaskRecord};
use super::spend::Cap;

/// What the run knew when the record was finished.
pub(super) struct RunState {
    /// The cap a hard spend cap stopped the run at.
    pub stopped_by: Option<Cap>,
    pub interrupted: bool,
    /// Why the run stopped, when something stopped it.
    pub fatal: Option<String>,
}

/// Fills `record.error` when it is not `passed` and says nothing of why.
pub(super) fn explain(record: &mut TaskRecord, run: &RunState) {
    if record.status == Status::Passed || record.error.is_some() {
        return;
    }
    record.error = Some(cause(record, run));
}

fn cause(r: &TaskRecord, run: &RunState) -> String {
    match r.status {
        Status::Cancelled => match (run.stopped_by, run.interrupted, &run.fatal) {
            (Some(cap), _, _) => format!(
                "cancelled: the run reached its {} cap, a hard one (--max-cost-hard)",
                cap.flag()
            ),
            (None, true, _) => "cancelled: the run was interrupted".into(),
            (None, false, Some(why)) => format!("cancelled: the run stopped: {why}"),
            (None, false, None) => "cancelled".into(),
        },
        Status::Failed => match &r.verify {
            Some(v) if v.timed_out => "verify timed out".into(),
            Some(_) if r.reward.is_some() => {
                "the verifier's reward is below the pass threshold (--pass-threshold)".into()
            }
            Some(v) => match v.exit_code {
                Some(code) => format!("verify exited {code}"),
                None => "verify was killed by a signal".into(),
            },
            // Without a verify, only a submit passes.
            None => format!(
                "the episode ended without a submit ({})",
                r.stop_reason.as_str()
            ),
        },
        Status::Error | Status::Skipped => {
            format!("{} ({})", r.status.as_str(), r.stop_reason.as_str())
        }
        Status::Passed => String::new(),
    }
}
