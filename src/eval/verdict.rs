//! What an attempt comes to: its status and its record.

use super::outcome::Progress;
use super::results::{Retries, SandboxRecord, Status, TaskRecord, Timings, VerifyRecord};
use crate::episode::{EpisodeOutcome, StopReason};
use crate::sandbox::LimitHit;
use crate::task::Task;

/// The record of a task that ended without a verdict: `status` is `error` (or `cancelled`)
/// and `reason` says why.
pub(super) fn error_record(
    task: &Task,
    status: Status,
    p: &Progress,
    attempts: u32,
    reason: String,
) -> TaskRecord {
    let stop_reason = if status == Status::Cancelled {
        StopReason::Cancelled
    } else {
        StopReason::Error
    };
    record(
        task,
        status,
        stop_reason,
        String::new(),
        None,
        p,
        attempts,
        0.0,
        Some(reason),
    )
}

/// The record of an attempt whose sandbox ran into a limit: the agent's failure, unverified
/// (the episode may have ended in an error, its runner killed for want of memory, say).
pub(super) fn limit_record(
    task: &Task,
    hit: LimitHit,
    outcome: Option<&EpisodeOutcome>,
    p: &Progress,
    attempts: u32,
) -> TaskRecord {
    let note = format!(
        "the sandbox ran into its {} limit",
        match hit {
            LimitHit::Memory => "memory",
            LimitHit::Pids => "process",
            LimitHit::Disk => "disk",
        }
    );
    let mut all = p.clone();
    if let Some(o) = outcome {
        all.counters += o.counters;
    }
    let answer = outcome.map(|o| o.answer.clone()).unwrap_or_default();
    record(
        task,
        Status::Failed,
        hit.into(),
        answer,
        None,
        &all,
        attempts,
        0.0,
        Some(note),
    )
}

/// The record of an episode that ran to an outcome, verified or not.
pub(super) fn outcome_record(
    task: &Task,
    o: &EpisodeOutcome,
    verify: Option<VerifyRecord>,
    p: &Progress,
    attempts: u32,
    verify_secs: f64,
    pass_threshold: f64,
) -> TaskRecord {
    // A provider that could not serve the episode is an infrastructure error, not a verdict:
    // `provider_error` with status `error` is what `--resume` runs again.
    let (stop_reason, error) = match (&o.provider_failure, o.stop_reason) {
        (Some(f), stop) if stop != StopReason::Cancelled => {
            (StopReason::ProviderError, Some(f.message.clone()))
        }
        _ => (o.stop_reason, o.note.clone()),
    };
    let mut verify = verify;
    let reward = verify.as_mut().and_then(|v| v.reward.take());
    let status = match (stop_reason, &verify) {
        (StopReason::Cancelled, _) => Status::Cancelled,
        // The agent's doing, whatever the workspace says.
        (StopReason::Oom | StopReason::Pids | StopReason::Disk, _) => Status::Failed,
        _ if o.provider_failure.is_some() => Status::Error,
        (StopReason::Error, _) => Status::Error,
        (_, Some(v)) if v.timed_out => Status::Failed,
        // A reward, when the verifier left one, is the verdict; a malformed one fails.
        (_, Some(_)) if reward.is_some() => match &reward {
            Some(Ok(r)) if r.passes(pass_threshold) => Status::Passed,
            _ => Status::Failed,
        },
        (_, Some(v)) if v.exit_code == Some(0) => Status::Passed,
        (_, Some(_)) => Status::Failed,
        (StopReason::Submit, None) => Status::Passed,
        (_, None) => Status::Failed,
    };
    let mut all = p.clone();
    all.counters += o.counters;
    let (reward, error) = match reward {
        Some(Ok(r)) => (Some(r), error),
        Some(Err(e)) => (None, Some(format!("malformed reward: {e}"))),
        None => (None, error),
    };
    let mut r = record(
        task,
        status,
        stop_reason,
        o.answer.clone(),
        verify,
        &all,
        attempts,
        verify_secs,
        error,
    );
    r.reward = reward;
    r
}

/// Bytes of a record's answer kept: one `results.jsonl` line stays a size every reader can
/// hold, whatever a harness submits.
const MAX_ANSWER_BYTES: usize = 1 << 20;
/// Bytes of a record's error kept (a runner's note can be as long as a frame).
const MAX_ERROR_BYTES: usize = 64 << 10;

/// `text` cut to `max` bytes on a character boundary, ending with a note of what was cut.
fn bounded(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let total = text.len();
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(&format!(
        "… [cut at {max} bytes: {} of {total} bytes dropped]",
        total - end
    ));
    text
}

#[allow(clippy::too_many_arguments)]
fn record(
    task: &Task,
    status: Status,
    stop_reason: StopReason,
    answer: String,
    verify: Option<VerifyRecord>,
    p: &Progress,
    attempts: u32,
    verify_secs: f64,
    error: Option<String>,
) -> TaskRecord {
    TaskRecord {
        id: task.id.clone(),
        // The run's scheduler says which attempt this is.
        attempt: super::schedule::FIRST_ATTEMPT,
        status,
        stop_reason,
        answer: bounded(answer, MAX_ANSWER_BYTES),
        verify,
        turns: p.counters.turns,
        tool_calls: p.counters.tool_calls,
        tokens: p.counters.tokens,
        // The sandbox and the transport retries are the attempt loop's to fill in.
        sandbox: SandboxRecord {
            id: None,
            reused: false,
            seconds: 0.0,
        },
        timings: Timings {
            acquire: p.acquire,
            episode: p.episode,
            verify: verify_secs,
        },
        attempts,
        retries: Retries {
            transport: 0,
            provider: p.counters.provider_retries,
        },
        error: error.map(|e| bounded(e, MAX_ERROR_BYTES)),
        reward: None,
        cost: None,
        provenance: None,
    }
}

/// The record of a task a spend cap kept from starting: `why` says which and how far.
pub(super) fn skipped_record(task: &Task, why: String) -> TaskRecord {
    record(
        task,
        Status::Skipped,
        StopReason::Budget,
        String::new(),
        None,
        &Progress::default(),
        0,
        0.0,
        Some(why),
    )
}
