//! Seeded fault injection: which requests fail, decided by a reproducible random sequence.
//!
//! Each fault site (create, stream, kill, the other calls' 429s, a create's lost answer) draws from its own generator seeded from the run
//! seed, so the n-th create of a run gets the same outcome for the same seed however many
//! streams or kills happened in between. Concurrent requests draw in arrival order.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;

use super::http::Response;
use crate::sync::lock;

/// The seed used when none is given, so two runs without `--seed` inject the same faults.
pub const DEFAULT_SEED: u64 = 1;

/// A control-plane call other than create that a `CALL-429=RATE` fault can rate-limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    Kill,
    SetTimeout,
    Connect,
    List,
    Info,
    Network,
}

impl Call {
    pub const ALL: [Call; 6] = [
        Call::Kill,
        Call::SetTimeout,
        Call::Connect,
        Call::List,
        Call::Info,
        Call::Network,
    ];

    /// The name the fault spec uses (`settimeout` in `settimeout-429`).
    pub fn name(self) -> &'static str {
        match self {
            Call::Kill => "kill",
            Call::SetTimeout => "settimeout",
            Call::Connect => "connect",
            Call::List => "list",
            Call::Info => "info",
            Call::Network => "network",
        }
    }
}

/// Fault rates, parsed from `create-429=0.2,create-503=0.05,drop-stream=0.05,kill-fail=0.1,
/// create-delay-ms=200,settimeout-429=0.5,create-502-after=0.1,retry-after=1,should-retry=0`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultSpec {
    /// Share of creates answered 429 (rate limit) without creating anything.
    pub create_429: f64,
    /// Share of creates answered 503 (no capacity) without creating anything.
    pub create_503: f64,
    /// Share of Start/Connect streams cut mid-way without an end-of-stream message.
    pub drop_stream: f64,
    /// Share of kills answered 500 without killing.
    pub kill_fail: f64,
    /// Delay before every create answer.
    pub create_delay: Duration,
    /// Cut every stream of a process started with stdin (a runner) after this many events:
    /// a deterministic mid-session drop for tests of durable channels.
    pub drop_stdin_stream_after: Option<u32>,
    /// Share of each other call (in [`Call::ALL`] order) answered 429 without doing anything.
    pub call_429: [f64; 6],
    /// Share of creates answered 502 after the sandbox was made: the answer is lost, the
    /// sandbox runs. Only an idempotent repeat finds it again.
    pub create_502_after: f64,
    /// The `Retry-After` seconds of every injected 429/5xx; 1 when not given.
    pub retry_after: Option<u64>,
    /// The `Should-Retry` header of every injected 429/5xx (`should-retry=0|1`); none when
    /// not given.
    pub should_retry: Option<bool>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FaultSpecError {
    #[error("unknown fault {0:?} (known: create-429, create-503, drop-stream, kill-fail, create-delay-ms, drop-stdin-stream-after, create-502-after, retry-after, should-retry, and kill-429, settimeout-429, connect-429, list-429, info-429, network-429)")]
    Unknown(String),
    #[error("fault {name}: {value:?} is not a number")]
    NotANumber { name: String, value: String },
    #[error("fault {name}: {value} is not a probability between 0 and 1")]
    OutOfRange { name: String, value: f64 },
    #[error("create-429 and create-503 together exceed 1")]
    CreateOverOne,
    #[error("fault {0:?} has no value (expected NAME=VALUE)")]
    NoValue(String),
}

impl FromStr for FaultSpec {
    type Err = FaultSpecError;

    fn from_str(s: &str) -> Result<FaultSpec, FaultSpecError> {
        let mut spec = FaultSpec::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let Some((name, value)) = item.split_once('=') else {
                return Err(FaultSpecError::NoValue(item.to_string()));
            };
            let (name, value) = (name.trim(), value.trim());
            let number = |max: Option<f64>| -> Result<f64, FaultSpecError> {
                let v: f64 = value.parse().map_err(|_| FaultSpecError::NotANumber {
                    name: name.to_string(),
                    value: value.to_string(),
                })?;
                let limit = max.unwrap_or(f64::MAX);
                if !(0.0..=limit).contains(&v) {
                    return Err(FaultSpecError::OutOfRange {
                        name: name.to_string(),
                        value: v,
                    });
                }
                Ok(v)
            };
            match name {
                "create-429" => spec.create_429 = number(Some(1.0))?,
                "create-503" => spec.create_503 = number(Some(1.0))?,
                "drop-stream" => spec.drop_stream = number(Some(1.0))?,
                "kill-fail" => spec.kill_fail = number(Some(1.0))?,
                "create-delay-ms" => {
                    // At most an hour: a longer delay is a typo, not a test.
                    spec.create_delay = Duration::from_millis(number(Some(3_600_000.0))? as u64)
                }
                "drop-stdin-stream-after" => {
                    spec.drop_stdin_stream_after = Some(number(Some(1_000_000.0))? as u32)
                }
                "create-502-after" => spec.create_502_after = number(Some(1.0))?,
                // At most an hour, as for the create delay.
                "retry-after" => spec.retry_after = Some(number(Some(3600.0))? as u64),
                "should-retry" => spec.should_retry = Some(number(Some(1.0))? >= 0.5),
                other => {
                    let call = other
                        .strip_suffix("-429")
                        .and_then(|c| Call::ALL.iter().position(|k| k.name() == c));
                    match call {
                        Some(i) => spec.call_429[i] = number(Some(1.0))?,
                        None => return Err(FaultSpecError::Unknown(other.to_string())),
                    }
                }
            }
        }
        if spec.create_429 + spec.create_503 > 1.0 {
            return Err(FaultSpecError::CreateOverOne);
        }
        Ok(spec)
    }
}

impl fmt::Display for FaultSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "create-429={},create-503={},drop-stream={},kill-fail={},create-delay-ms={}",
            self.create_429,
            self.create_503,
            self.drop_stream,
            self.kill_fail,
            self.create_delay.as_millis()
        )?;
        if let Some(n) = self.drop_stdin_stream_after {
            write!(f, ",drop-stdin-stream-after={n}")?;
        }
        for (call, rate) in Call::ALL.iter().zip(self.call_429) {
            if rate > 0.0 {
                write!(f, ",{}-429={rate}", call.name())?;
            }
        }
        if self.create_502_after > 0.0 {
            write!(f, ",create-502-after={}", self.create_502_after)?;
        }
        if let Some(s) = self.retry_after {
            write!(f, ",retry-after={s}")?;
        }
        if let Some(b) = self.should_retry {
            write!(f, ",should-retry={}", u8::from(b))?;
        }
        Ok(())
    }
}

/// How many faults were injected, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FaultCounts {
    #[serde(rename = "create-429")]
    pub create_429: u64,
    #[serde(rename = "create-503")]
    pub create_503: u64,
    #[serde(rename = "drop-stream")]
    pub drop_stream: u64,
    #[serde(rename = "kill-fail")]
    pub kill_fail: u64,
    /// 429s injected into calls other than create.
    #[serde(rename = "call-429")]
    pub call_429: u64,
    #[serde(rename = "create-502-after")]
    pub create_502_after: u64,
}

/// What happens to one create request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CreateFault {
    None,
    RateLimited,
    NoCapacity,
}

/// SplitMix64: tiny, fast, and fully determined by its seed.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

pub(super) struct Faults {
    spec: FaultSpec,
    create: Mutex<Rng>,
    stream: Mutex<Rng>,
    kill: Mutex<Rng>,
    calls: Mutex<Rng>,
    after_create: Mutex<Rng>,
    call_429: AtomicU64,
    create_502_after: AtomicU64,
    create_429: AtomicU64,
    create_503: AtomicU64,
    drop_stream: AtomicU64,
    kill_fail: AtomicU64,
}

impl Faults {
    pub fn new(spec: FaultSpec, seed: u64) -> Faults {
        let site = |n: u64| Mutex::new(Rng(seed ^ n.wrapping_mul(0xa076_1d64_78bd_642f)));
        Faults {
            spec,
            create: site(1),
            stream: site(2),
            kill: site(3),
            calls: site(4),
            after_create: site(5),
            call_429: AtomicU64::new(0),
            create_502_after: AtomicU64::new(0),
            create_429: AtomicU64::new(0),
            create_503: AtomicU64::new(0),
            drop_stream: AtomicU64::new(0),
            kill_fail: AtomicU64::new(0),
        }
    }

    pub fn create_delay(&self) -> Duration {
        self.spec.create_delay
    }

    pub fn create(&self) -> CreateFault {
        let u = lock(&self.create).unit();
        if u < self.spec.create_429 {
            self.create_429.fetch_add(1, Ordering::SeqCst);
            CreateFault::RateLimited
        } else if u < self.spec.create_429 + self.spec.create_503 {
            self.create_503.fetch_add(1, Ordering::SeqCst);
            CreateFault::NoCapacity
        } else {
            CreateFault::None
        }
    }

    /// For a stream about to start: `Some(n)` cuts it after the start event and at most `n`
    /// further events (0..=2), before any end event.
    pub fn drop_stream(&self, stdin: bool) -> Option<u32> {
        let (u, after) = {
            let mut rng = lock(&self.stream);
            // Always two draws, so the sequence does not depend on the outcomes.
            (rng.unit(), (rng.next_u64() % 3) as u32)
        };
        if let (true, Some(n)) = (stdin, self.spec.drop_stdin_stream_after) {
            self.drop_stream.fetch_add(1, Ordering::SeqCst);
            return Some(n);
        }
        if u < self.spec.drop_stream {
            self.drop_stream.fetch_add(1, Ordering::SeqCst);
            Some(after)
        } else {
            None
        }
    }

    pub fn kill_fail(&self) -> bool {
        let u = lock(&self.kill).unit();
        if u < self.spec.kill_fail {
            self.kill_fail.fetch_add(1, Ordering::SeqCst);
            true
        } else {
            false
        }
    }

    /// An injected 429 for `call`, or `None` to let it through.
    pub fn rate_limit(&self, call: Call) -> Option<Response> {
        let rate = Call::ALL
            .iter()
            .position(|c| *c == call)
            .map_or(0.0, |i| self.spec.call_429[i]);
        if lock(&self.calls).unit() >= rate {
            return None;
        }
        self.call_429.fetch_add(1, Ordering::SeqCst);
        Some(self.rate_limited())
    }

    /// The 429 of the rate-limit middleware, with its hints.
    pub fn rate_limited(&self) -> Response {
        self.hinted(Response::error(429, "Rate limit exceeded"))
            .with_header("RateLimit-Limit", "20")
            .with_header("RateLimit-Remaining", "0")
            .with_header("RateLimit-Reset", "1")
    }

    /// Whether the answer of a create that made its sandbox is lost behind a 502.
    pub fn create_502_after(&self) -> bool {
        let hit = lock(&self.after_create).unit() < self.spec.create_502_after;
        if hit {
            self.create_502_after.fetch_add(1, Ordering::SeqCst);
        }
        hit
    }

    /// `resp` with the retry hints every injected 429/5xx carries.
    pub fn hinted(&self, resp: Response) -> Response {
        let resp = resp.with_header(
            "Retry-After",
            self.spec.retry_after.unwrap_or(1).to_string(),
        );
        match self.spec.should_retry {
            Some(b) => resp.with_header("Should-Retry", if b { "true" } else { "false" }),
            None => resp,
        }
    }

    pub fn counts(&self) -> FaultCounts {
        FaultCounts {
            create_429: self.create_429.load(Ordering::SeqCst),
            create_503: self.create_503.load(Ordering::SeqCst),
            drop_stream: self.drop_stream.load(Ordering::SeqCst),
            kill_fail: self.kill_fail.load(Ordering::SeqCst),
            call_429: self.call_429.load(Ordering::SeqCst),
            create_502_after: self.create_502_after.load(Ordering::SeqCst),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_spec() {
        let spec: FaultSpec =
            "create-429=0.2,create-503=0.05,drop-stream=0.05,kill-fail=0.1,create-delay-ms=200"
                .parse()
                .unwrap();
        assert_eq!(spec.create_429, 0.2);
        assert_eq!(spec.create_503, 0.05);
        assert_eq!(spec.drop_stream, 0.05);
        assert_eq!(spec.kill_fail, 0.1);
        assert_eq!(spec.create_delay, Duration::from_millis(200));
        assert_eq!("".parse::<FaultSpec>().unwrap(), FaultSpec::default());
        let spec: FaultSpec =
            "settimeout-429=0.5,kill-429=1,create-502-after=0.25,retry-after=2,should-retry=0"
                .parse()
                .unwrap();
        assert_eq!(spec.call_429, [1.0, 0.5, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(spec.create_502_after, 0.25);
        assert_eq!(
            (spec.retry_after, spec.should_retry),
            (Some(2), Some(false))
        );
        assert_eq!(spec.to_string().parse::<FaultSpec>().unwrap(), spec);
        assert!(matches!(
            "create-429x=1".parse::<FaultSpec>(),
            Err(FaultSpecError::Unknown(_))
        ));
    }

    #[test]
    fn rejects_bad_specs() {
        assert!(matches!(
            "nope=1".parse::<FaultSpec>(),
            Err(FaultSpecError::Unknown(_))
        ));
        assert!(matches!(
            "kill-fail=2".parse::<FaultSpec>(),
            Err(FaultSpecError::OutOfRange { .. })
        ));
        assert!(matches!(
            "kill-fail=x".parse::<FaultSpec>(),
            Err(FaultSpecError::NotANumber { .. })
        ));
        assert!(matches!(
            "kill-fail".parse::<FaultSpec>(),
            Err(FaultSpecError::NoValue(_))
        ));
        assert_eq!(
            "create-429=0.6,create-503=0.6".parse::<FaultSpec>(),
            Err(FaultSpecError::CreateOverOne)
        );
    }

    #[test]
    fn same_seed_same_sequence() {
        let spec: FaultSpec = "create-429=0.3,create-503=0.3,kill-fail=0.5,drop-stream=0.5"
            .parse()
            .unwrap();
        let run = |seed| {
            let f = Faults::new(spec.clone(), seed);
            let creates: Vec<_> = (0..64).map(|_| f.create()).collect();
            let kills: Vec<_> = (0..64).map(|_| f.kill_fail()).collect();
            let drops: Vec<_> = (0..64).map(|_| f.drop_stream(false)).collect();
            (creates, kills, drops)
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        let (creates, ..) = run(7);
        assert!(creates.contains(&CreateFault::RateLimited));
        assert!(creates.contains(&CreateFault::NoCapacity));
        assert!(creates.contains(&CreateFault::None));
    }
}
