//! A verifier's reward, as Harbor's tests write it: `/logs/verifier/reward.txt` (one float)
//! or `reward.json` (an object of named float metrics). Read from the sandbox after verify,
//! bounded, and parsed strictly: what the verifier wrote is the task's input, never trusted
//! to be well formed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::sandbox::{Role, RunOpts, Sandbox, SandboxError};

/// The verifier's directory, made fresh for each verify (after the agent is stopped).
pub const VERIFIER_LOGS: &str = "/logs/verifier";
/// Bytes of a reward file read; a larger one is malformed.
pub const MAX_REWARD_BYTES: usize = 64 << 10;
/// Bound on reading it.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Metrics a `reward.json` may name.
const MAX_METRICS: usize = 256;

/// What the verifier scored, recorded as given.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Reward {
    Score(f64),
    Metrics(BTreeMap<String, f64>),
}

/// A reward file that says nothing usable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RewardError {
    #[error("{file} is larger than {MAX_REWARD_BYTES} bytes")]
    TooLarge { file: &'static str },
    #[error("{file} is not UTF-8 text")]
    NotUtf8 { file: &'static str },
    #[error("reward.txt holds {text:?}, not one finite number")]
    NotANumber { text: String },
    #[error("reward.json is not an object of named finite numbers: {why}")]
    NotMetrics { why: String },
    #[error("reward.json names no metric")]
    NoMetrics,
}

impl Reward {
    /// Whether the reward reaches `threshold`: a score itself; metrics by their `reward`
    /// key when they have one, else every metric.
    pub fn passes(&self, threshold: f64) -> bool {
        match self {
            Reward::Score(s) => *s >= threshold,
            Reward::Metrics(m) => match m.get("reward") {
                Some(r) => *r >= threshold,
                None => m.values().all(|v| *v >= threshold),
            },
        }
    }
}

/// Which file the verifier left, and its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RewardFile {
    Text,
    Json,
}

/// Parses a reward file strictly.
pub fn parse(file: RewardFile, bytes: &[u8]) -> Result<Reward, RewardError> {
    let name = match file {
        RewardFile::Text => "reward.txt",
        RewardFile::Json => "reward.json",
    };
    if bytes.len() > MAX_REWARD_BYTES {
        return Err(RewardError::TooLarge { file: name });
    }
    let text = std::str::from_utf8(bytes).map_err(|_| RewardError::NotUtf8 { file: name })?;
    match file {
        RewardFile::Text => {
            let t = text.trim();
            // Rust's parser takes "inf" and "NaN" too: a reward is a finite number.
            match t.parse::<f64>() {
                Ok(v) if v.is_finite() => Ok(Reward::Score(v)),
                _ => Err(RewardError::NotANumber {
                    text: crate::terminal::escape(&t.chars().take(64).collect::<String>())
                        .into_owned(),
                }),
            }
        }
        RewardFile::Json => {
            let metrics: BTreeMap<String, f64> = serde_json::from_str(text)
                .map_err(|e| RewardError::NotMetrics { why: e.to_string() })?;
            if metrics.is_empty() {
                return Err(RewardError::NoMetrics);
            }
            if metrics.len() > MAX_METRICS {
                return Err(RewardError::NotMetrics {
                    why: format!("more than {MAX_METRICS} metrics"),
                });
            }
            Ok(Reward::Metrics(metrics))
        }
    }
}

/// The reward the verifier left in [`VERIFIER_LOGS`], read as the verifier (so nothing is
/// read that it could not read itself; a symlink is not followed): `Ok(None)` when it left
/// none.
pub fn read(
    sandbox: &Arc<dyn Sandbox>,
) -> Result<Option<Result<Reward, RewardError>>, SandboxError> {
    // `reward.txt` first, as Harbor reads them; one byte past the bound shows it was crossed.
    let script = format!(
        "cd {VERIFIER_LOGS} 2>/dev/null || exit 0; \
         for f in reward.txt reward.json; do \
           if [ -f \"$f\" ] && [ ! -L \"$f\" ]; then echo \"$f\"; exec head -c {} \"$f\"; fi; \
         done",
        MAX_REWARD_BYTES + 1
    );
    let opts = RunOpts {
        cwd: Some("/".into()),
        role: Role::Verify,
        timeout: READ_TIMEOUT,
        max_output: MAX_REWARD_BYTES + 64,
        ..RunOpts::default()
    };
    let out = sandbox.run(&script, &opts)?;
    let mut bytes = out.stdout.head;
    bytes.extend_from_slice(&out.stdout.tail);
    let Some(newline) = bytes.iter().position(|b| *b == b'\n') else {
        return Ok(None);
    };
    let file = match &bytes[..newline] {
        b"reward.txt" => RewardFile::Text,
        b"reward.json" => RewardFile::Json,
        _ => return Ok(None),
    };
    let content = &bytes[newline + 1..];
    if out.stdout.dropped > 0 {
        return Ok(Some(parse(file, &vec![0; MAX_REWARD_BYTES + 1])));
    }
    Ok(Some(parse(file, content)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewards_parse_strictly() {
        assert_eq!(parse(RewardFile::Text, b" 0.5\n"), Ok(Reward::Score(0.5)));
        for bad in [&b""[..], b"1 2", b"NaN", b"inf", b"yes", b"\xff"] {
            assert!(parse(RewardFile::Text, bad).is_err(), "{bad:?}");
        }
        let m = parse(RewardFile::Json, br#"{"acc": 1, "f1": 0.5}"#).unwrap();
        assert!(!m.passes(1.0) && m.passes(0.5));
        let with_reward = parse(RewardFile::Json, br#"{"reward": 1.0, "f1": 0}"#).unwrap();
        assert!(with_reward.passes(1.0));
        for bad in [
            &b"[1]"[..],
            b"{}",
            b"{\"a\": \"1\"}",
            b"1",
            b"{\"a\": 1e999}",
        ] {
            assert!(parse(RewardFile::Json, bad).is_err(), "{bad:?}");
        }
        let big = vec![b'1'; MAX_REWARD_BYTES + 1];
        assert!(matches!(
            parse(RewardFile::Text, &big),
            Err(RewardError::TooLarge { .. })
        ));
    }
}
