//! What a run spends and the caps it may not pass: model tokens, sandbox-seconds and, when
//! prices are known, dollars.
//!
//! Prices come from a table (`--prices FILE`, JSON or TOML) or from flags, per million tokens
//! for the model and per second for a sandbox. A cap is checked before each task starts:
//! when what the run has spent (finished tasks, and what running tasks have spent so far)
//! plus what a task has cost on average would pass a cap, no further task starts.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::episode::TokenMeter;

/// E2B's published per-second rates, as of 2026-12-01: $0.000014 per vCPU and $0.0000045 per
/// GiB of RAM (their billing page's example, 8 vCPU and 4 GB at $0.468 an hour, agrees).
/// For the default sandbox (2 vCPU, 512 MiB): $0.00003025 a second.
pub const E2B_DEFAULT_SANDBOX_PER_SECOND: f64 = 2.0 * 0.000_014 + 0.5 * 0.000_004_5;

pub use crate::episode::ModelPrice;

/// The prices a run's costs are computed with (recorded next to every cost).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Prices {
    pub model: String,
    #[serde(flatten)]
    pub per_mtok: ModelPrice,
    pub sandbox_per_second: f64,
}

/// A `--prices` file: `{"models": {"NAME": {"input": 2.5, "output": 10, "cached_input":
/// 1.25}}, "sandbox_per_second": 0.00003}`, or the same in TOML.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct PriceFile {
    #[serde(default)]
    models: std::collections::BTreeMap<String, ModelPrice>,
    sandbox_per_second: Option<f64>,
}

#[derive(Debug, thiserror::Error)]
pub enum PriceError {
    #[error("cannot read the price file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {detail} (expected {{\"models\": {{\"NAME\": {{\"input\": USD_PER_MTOK, \"output\": USD_PER_MTOK}}}}, \"sandbox_per_second\": USD}}, as JSON or TOML)")]
    Parse { path: PathBuf, detail: String },
    #[error("{path} has no price for model {model:?}: add it under \"models\", or give --price-in and --price-out")]
    NoModel { path: PathBuf, model: String },
    #[error("{what} must be a finite number of dollars, 0 or more (got {value})")]
    Invalid { what: String, value: f64 },
    #[error("a model price needs both --price-in and --price-out (dollars per million input and output tokens), or a --prices file naming the model")]
    HalfPrice,
}

/// Where the prices come from: the command's options.
#[derive(Debug, Clone, Default)]
pub struct PriceOptions {
    pub file: Option<PathBuf>,
    /// Dollars per million input and output tokens; they win over the file.
    pub input: Option<f64>,
    pub output: Option<f64>,
    pub sandbox_per_second: Option<f64>,
}

/// The run's prices, or `None` when no model price was given. `default_sandbox` is the
/// backend's own rate when neither the file nor a flag names one.
pub fn resolve_prices(
    opts: &PriceOptions,
    model: &str,
    default_sandbox: f64,
) -> Result<Option<Prices>, PriceError> {
    let file = opts.file.as_deref().map(read_price_file).transpose()?;
    let from_file = match (&file, &opts.file) {
        (Some(f), Some(path)) if opts.input.is_none() || opts.output.is_none() => Some(
            f.models
                .get(model)
                .copied()
                .ok_or_else(|| PriceError::NoModel {
                    path: path.clone(),
                    model: model.to_string(),
                })?,
        ),
        _ => None,
    };
    let per_mtok = match (opts.input, opts.output, from_file) {
        (Some(input), Some(output), _) => ModelPrice {
            input,
            output,
            cached_input: from_file.and_then(|p| p.cached_input),
        },
        (input, output, Some(p)) => ModelPrice {
            input: input.unwrap_or(p.input),
            output: output.unwrap_or(p.output),
            cached_input: p.cached_input,
        },
        (None, None, None) => return Ok(None),
        (Some(_), None, None) | (None, Some(_), None) => return Err(PriceError::HalfPrice),
    };
    let sandbox_per_second = opts
        .sandbox_per_second
        .or(file.as_ref().and_then(|f| f.sandbox_per_second))
        .unwrap_or(default_sandbox);
    let prices = Prices {
        model: model.to_string(),
        per_mtok,
        sandbox_per_second,
    };
    for (what, value) in [
        ("the input price", per_mtok.input),
        ("the output price", per_mtok.output),
        (
            "the cached input price",
            per_mtok.cached_input.unwrap_or(0.0),
        ),
        ("the sandbox price", sandbox_per_second),
    ] {
        if !value.is_finite() || value < 0.0 {
            return Err(PriceError::Invalid {
                what: what.into(),
                value,
            });
        }
    }
    Ok(Some(prices))
}

fn read_price_file(path: &Path) -> Result<PriceFile, PriceError> {
    // A price table is a few lines; anything huge is not one.
    const MAX_BYTES: u64 = 1 << 20;
    let parse_err = |detail: String| PriceError::Parse {
        path: path.to_path_buf(),
        detail,
    };
    let read_err = |source| PriceError::Read {
        path: path.to_path_buf(),
        source,
    };
    let len = std::fs::metadata(path).map_err(read_err)?.len();
    if len > MAX_BYTES {
        return Err(parse_err(format!("{len} bytes is not a price table")));
    }
    let text = std::fs::read_to_string(path).map_err(read_err)?;
    let toml = path.extension().is_some_and(|e| e == "toml");
    if toml {
        toml::from_str(&text).map_err(|e| parse_err(e.message().to_string()))
    } else {
        serde_json::from_str(&text).map_err(|e| parse_err(e.to_string()))
    }
}

impl Prices {
    /// Dollars for `tokens` and `sandbox_seconds`. Cached input tokens (a part of `input`)
    /// are priced at `cached_input` where the table has it.
    pub fn cost(&self, tokens: &TokenMeter, sandbox_seconds: f64) -> f64 {
        self.per_mtok.dollars(tokens) + sandbox_seconds * self.sandbox_per_second
    }
}

/// A task's cost in its record, with the prices it was computed with.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CostRecord {
    pub usd: f64,
    pub prices: Prices,
}

/// The caps a run may not pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Caps {
    pub cost_usd: Option<f64>,
    pub tokens: Option<u64>,
    pub sandbox_seconds: Option<f64>,
    /// Running tasks are cancelled when a cap is reached, instead of finishing.
    pub hard: bool,
}

/// Which cap stopped a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cap {
    Cost,
    Tokens,
    SandboxSeconds,
}

impl Cap {
    pub fn flag(self) -> &'static str {
        match self {
            Cap::Cost => "--max-cost",
            Cap::Tokens => "--max-tokens",
            Cap::SandboxSeconds => "--max-sandbox-seconds",
        }
    }
}

/// What a run has spent, per dimension (`cost_usd` only with prices).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Spend {
    pub tokens: u64,
    pub sandbox_seconds: f64,
    pub cost_usd: Option<f64>,
}

impl Spend {
    pub fn of(tokens: &TokenMeter, sandbox_seconds: f64, prices: Option<&Prices>) -> Spend {
        Spend {
            tokens: tokens.input + tokens.output,
            sandbox_seconds,
            cost_usd: prices.map(|p| p.cost(tokens, sandbox_seconds)),
        }
    }

    fn plus(self, other: Spend) -> Spend {
        Spend {
            tokens: self.tokens + other.tokens,
            sandbox_seconds: self.sandbox_seconds + other.sandbox_seconds,
            cost_usd: self.cost_usd.zip(other.cost_usd).map(|(a, b)| a + b),
        }
    }

    /// The mean of `total` over `n` tasks (nothing when none finished yet).
    pub fn per_task(total: Spend, n: usize) -> Spend {
        if n == 0 {
            return Spend {
                cost_usd: total.cost_usd.map(|_| 0.0),
                ..Spend::default()
            };
        }
        let k = n as f64;
        Spend {
            tokens: total.tokens.div_ceil(n as u64),
            sandbox_seconds: total.sandbox_seconds / k,
            cost_usd: total.cost_usd.map(|c| c / k),
        }
    }
}

impl Caps {
    pub fn any(&self) -> bool {
        self.cost_usd.is_some() || self.tokens.is_some() || self.sandbox_seconds.is_some()
    }

    /// The first cap `spend` has reached.
    pub fn reached(&self, spend: Spend) -> Option<Cap> {
        if let (Some(cap), Some(cost)) = (self.cost_usd, spend.cost_usd) {
            if cost >= cap {
                return Some(Cap::Cost);
            }
        }
        if self.tokens.is_some_and(|cap| spend.tokens >= cap) {
            return Some(Cap::Tokens);
        }
        if self
            .sandbox_seconds
            .is_some_and(|cap| spend.sandbox_seconds >= cap)
        {
            return Some(Cap::SandboxSeconds);
        }
        None
    }

    /// The cap the next task could pass: what is spent so far plus one more task's mean
    /// would reach it.
    pub fn next_task_would_pass(&self, spent: Spend, per_task: Spend) -> Option<Cap> {
        self.reached(spent.plus(per_task))
    }

    /// How far `spend` is along `cap`, for the message of a task not started.
    pub fn describe(&self, cap: Cap, spend: Spend) -> String {
        match cap {
            Cap::Cost => format!(
                "spent ${:.4} of --max-cost ${}",
                spend.cost_usd.unwrap_or(0.0),
                self.cost_usd.unwrap_or(0.0)
            ),
            Cap::Tokens => format!(
                "spent {} tokens of --max-tokens {}",
                spend.tokens,
                self.tokens.unwrap_or(0)
            ),
            Cap::SandboxSeconds => format!(
                "spent {:.1} sandbox-seconds of --max-sandbox-seconds {}",
                spend.sandbox_seconds,
                self.sandbox_seconds.unwrap_or(0.0)
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(name: &str, text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    fn opts(file: Option<PathBuf>) -> PriceOptions {
        PriceOptions {
            file,
            ..PriceOptions::default()
        }
    }

    #[test]
    fn json_and_toml_tables_give_the_same_prices() {
        let (_a, json) = write(
            "p.json",
            r#"{"models": {"m": {"input": 2.5, "output": 10, "cached_input": 1.25}}, "sandbox_per_second": 0.001}"#,
        );
        let (_b, toml) = write(
            "p.toml",
            "sandbox_per_second = 0.001\n[models.m]\ninput = 2.5\noutput = 10.0\ncached_input = 1.25\n",
        );
        let a = resolve_prices(&opts(Some(json)), "m", 0.0)
            .unwrap()
            .unwrap();
        let b = resolve_prices(&opts(Some(toml)), "m", 0.0)
            .unwrap()
            .unwrap();
        assert_eq!(a, b);
        assert_eq!(a.per_mtok.cached_input, Some(1.25));
        let tokens = TokenMeter {
            input: 1_000_000,
            output: 100_000,
            cached_input: 400_000,
            reasoning: 50_000,
            calls: 3,
        };
        // 600k fresh at 2.5, 400k cached at 1.25, 100k out at 10, 10 s at 0.001.
        let expected = 1.5 + 0.5 + 1.0 + 0.01;
        assert!((a.cost(&tokens, 10.0) - expected).abs() < 1e-9);
    }

    #[test]
    fn flags_win_and_a_missing_model_or_bad_file_is_named() {
        let (_a, json) = write("p.json", r#"{"models": {"m": {"input": 1, "output": 2}}}"#);
        let mut o = opts(Some(json.clone()));
        o.input = Some(3.0);
        let p = resolve_prices(&o, "m", 0.5).unwrap().unwrap();
        assert_eq!((p.per_mtok.input, p.per_mtok.output), (3.0, 2.0));
        assert_eq!(p.sandbox_per_second, 0.5);
        let e = resolve_prices(&opts(Some(json)), "other", 0.0).unwrap_err();
        assert!(matches!(e, PriceError::NoModel { .. }), "{e}");
        let (_b, bad) = write("p.json", r#"{"models": {"m": {"input": 1}}}"#);
        let e = resolve_prices(&opts(Some(bad.clone())), "m", 0.0).unwrap_err();
        assert!(e.to_string().contains(&bad.display().to_string()), "{e}");
        let (_c, neg) = write("p.json", r#"{"models": {"m": {"input": -1, "output": 1}}}"#);
        assert!(matches!(
            resolve_prices(&opts(Some(neg)), "m", 0.0),
            Err(PriceError::Invalid { .. })
        ));
        assert_eq!(resolve_prices(&opts(None), "m", 0.1).unwrap(), None);
    }

    #[test]
    fn the_next_task_stops_at_the_first_cap_its_mean_would_reach() {
        let caps = Caps {
            tokens: Some(100),
            ..Caps::default()
        };
        let spent = Spend {
            tokens: 70,
            ..Spend::default()
        };
        let per_task = Spend::per_task(spent, 2);
        assert_eq!(per_task.tokens, 35);
        assert_eq!(
            caps.next_task_would_pass(spent, per_task),
            Some(Cap::Tokens)
        );
        let spent = Spend {
            tokens: 60,
            ..Spend::default()
        };
        assert_eq!(
            caps.next_task_would_pass(spent, Spend::per_task(spent, 2)),
            None
        );
        // No price, no cost cap reached: `--max-cost` needs prices (a usage error earlier).
        let cost = Caps {
            cost_usd: Some(1.0),
            ..Caps::default()
        };
        assert_eq!(cost.reached(Spend::default()), None);
    }
}
