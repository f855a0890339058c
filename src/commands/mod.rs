//! One module per subcommand: parse options, wire library components, print.

pub mod bounds;
pub mod emulator;
pub mod eval;
mod eval_agent;
mod eval_spend;
pub mod image;
pub mod project;
pub mod reap;
pub mod report;
pub mod sandbox;

/// Documented exit codes (`wmo-e2b --help` lists them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Success = 0,
    TasksFailed = 1,
    Usage = 2,
    Infrastructure = 3,
    /// A spend cap kept tasks from starting (`--resume` with a higher cap runs them).
    BudgetStopped = 4,
    Interrupted = 130,
}

impl From<Exit> for std::process::ExitCode {
    fn from(e: Exit) -> Self {
        std::process::ExitCode::from(e as u8)
    }
}

/// The backend a command works on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// Process sandboxes on this machine (no account needed).
    Local,
    /// E2B cloud microVMs (E2B_API_KEY; E2B_API_URL and E2B_SANDBOX_URL point it elsewhere,
    /// e.g. at `wmo-e2b emulator`).
    E2b,
}

/// Says on stderr which backend a listing read: the local one is the default even where an
/// E2B key is set, which a reader could not tell from an empty table.
pub fn say_backend(kind: BackendKind) {
    match kind {
        BackendKind::E2b => eprintln!("backend: e2b"),
        BackendKind::Local if std::env::var_os("E2B_API_KEY").is_some() => {
            eprintln!("backend: local (the default; E2B_API_KEY is set: --backend e2b reads E2B's)")
        }
        BackendKind::Local => eprintln!("backend: local (the default)"),
    }
}

/// How local sandboxes are confined: the `--isolation` option of every command that creates
/// sandboxes.
#[derive(Debug, Clone, clap::Args)]
pub struct LocalArgs {
    /// How local sandboxes are confined: `bwrap` (bubblewrap namespaces: a sandbox sees the
    /// system directories read-only and only its own files; needs the `bubblewrap` package),
    /// `none` (plain host processes: no boundary, and never reused between tasks), or `auto`
    /// (bwrap when it works here, else none with a warning).
    #[arg(long, value_enum, default_value = "auto", global = true)]
    pub isolation: IsolationArg,
    /// Local sandboxes starting at once (default: the CPUs this process may use); more
    /// wait their turn instead of slowing every start past its deadline.
    #[arg(long, value_name = "N", global = true, value_parser = clap::value_parser!(u16).range(1..))]
    pub create_concurrency: Option<u16>,
}

impl LocalArgs {
    /// The local backend's options these flags ask for.
    pub fn options(&self) -> wmo_e2b::sandbox::local::LocalOptions {
        wmo_e2b::sandbox::local::LocalOptions {
            isolation: self.isolation.into(),
            create_concurrency: self.create_concurrency.map(usize::from),
            ..Default::default()
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum IsolationArg {
    Auto,
    Bwrap,
    None,
}

impl From<IsolationArg> for wmo_e2b::sandbox::local::IsolationChoice {
    fn from(a: IsolationArg) -> Self {
        use wmo_e2b::sandbox::local::IsolationChoice;
        match a {
            IsolationArg::Auto => IsolationChoice::Auto,
            IsolationArg::Bwrap => IsolationChoice::Bwrap,
            IsolationArg::None => IsolationChoice::None,
        }
    }
}

/// `--network`: what sandboxes reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NetworkArg {
    None,
    Internet,
    Host,
}

impl From<NetworkArg> for wmo_e2b::sandbox::Network {
    fn from(a: NetworkArg) -> Self {
        use wmo_e2b::sandbox::Network;
        match a {
            NetworkArg::None => Network::None,
            NetworkArg::Internet => Network::Internet,
            NetworkArg::Host => Network::Host,
        }
    }
}

/// The network of local sandboxes: the one asked for when this host can give it, else by
/// default `internet` where it can and `none` (said once) where it cannot.
pub fn local_network(
    asked: Option<NetworkArg>,
    unavailable: Option<String>,
) -> Result<wmo_e2b::sandbox::Network, UsageError> {
    use wmo_e2b::sandbox::Network;
    match (asked, unavailable) {
        (Some(NetworkArg::Internet), Some(why)) => Err(UsageError(why)),
        (Some(a), _) => Ok(a.into()),
        (None, None) => Ok(Network::Internet),
        (None, Some(why)) => {
            eprintln!("note: sandboxes get no network (--network none): {why}");
            Ok(Network::None)
        }
    }
}

/// Opens a backend by kind, for commands that never create sandboxes.
pub fn open_backend(
    kind: BackendKind,
) -> anyhow::Result<std::sync::Arc<dyn wmo_e2b::sandbox::Backend>> {
    open_backend_with(
        kind,
        wmo_e2b::sandbox::e2b::E2bOptions::default(),
        wmo_e2b::sandbox::local::LocalOptions::default(),
    )
}

/// Opens a backend by kind; `e2b` options apply to the E2B backend, `local` to the local one.
pub fn open_backend_with(
    kind: BackendKind,
    e2b: wmo_e2b::sandbox::e2b::E2bOptions,
    local: wmo_e2b::sandbox::local::LocalOptions,
) -> anyhow::Result<std::sync::Arc<dyn wmo_e2b::sandbox::Backend>> {
    match kind {
        BackendKind::Local => Ok(open_local(local)?),
        BackendKind::E2b => {
            let backend = wmo_e2b::sandbox::e2b::E2bBackend::from_env(e2b)
                .map_err(|e| UsageError(format!("cannot use the e2b backend: {e}")))?;
            Ok(backend)
        }
    }
}

/// Opens the local backend and says, once, when its sandboxes are no boundary.
pub fn open_local(
    options: wmo_e2b::sandbox::local::LocalOptions,
) -> anyhow::Result<std::sync::Arc<wmo_e2b::sandbox::local::LocalBackend>> {
    use anyhow::Context;
    use wmo_e2b::sandbox::local::{IsolationChoice, LocalBackend};
    let asked = options.isolation;
    let backend = LocalBackend::open_with(&wmo_e2b::state::state_dir(), options)
        .context("cannot open the local sandbox backend")?;
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| match (asked, backend.isolation_fallback()) {
        (_, Some(why)) => eprintln!(
            "warning: {why}; local sandboxes run with --isolation none: plain host processes, \
             no security boundary, never reused between tasks"
        ),
        (IsolationChoice::None, None) => eprintln!(
            "note: --isolation none: local sandboxes are plain host processes (no security \
             boundary) and are never reused between tasks"
        ),
        _ => {}
    });
    Ok(backend)
}

/// Where model calls go when a model name is given: the options `eval` and `project run`
/// share.
#[derive(Debug, Clone, clap::Args)]
pub struct ModelApiArgs {
    /// The API model calls go to: `openai` (any OpenAI-compatible chat-completions API) or
    /// `anthropic` (Anthropic's Messages API).
    #[arg(long, value_enum, default_value = "openai")]
    pub provider: ProviderKind,
    /// Base URL of the API [default: https://api.openai.com/v1, or https://api.anthropic.com
    /// with --provider anthropic].
    #[arg(long)]
    pub base_url: Option<String>,
    /// Environment variable holding the API key, read on the host and never sent to a sandbox
    /// [default: OPENAI_API_KEY, or ANTHROPIC_API_KEY with --provider anthropic].
    #[arg(long)]
    pub api_key_env: Option<String>,
    /// The name the output-token cap is sent under (openai): `auto` sends
    /// `max_completion_tokens` to OpenAI's reasoning models (o1, o3, o4-mini, ...; gpt-5, ...)
    /// and `max_tokens` to the rest; the others force one name for any model.
    #[arg(long, value_enum, default_value = "auto")]
    pub token_param: TokenParamArg,
    /// `reasoning_effort` for OpenAI's reasoning models (the others refuse it).
    #[arg(long, value_enum)]
    pub reasoning_effort: Option<EffortArg>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProviderKind {
    Openai,
    Anthropic,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TokenParamArg {
    Auto,
    #[value(name = "max_tokens")]
    MaxTokens,
    #[value(name = "max_completion_tokens")]
    MaxCompletionTokens,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EffortArg {
    Low,
    Medium,
    High,
}

impl ModelApiArgs {
    /// The API's base URL: the one given, else the provider's own.
    pub fn effective_base_url(&self) -> String {
        self.base_url
            .clone()
            .unwrap_or_else(|| match self.provider {
                ProviderKind::Openai => wmo_e2b::provider::openai::OpenAiConfig::default().base_url,
                ProviderKind::Anthropic => {
                    wmo_e2b::provider::anthropic::AnthropicConfig::default().base_url
                }
            })
    }

    /// A model provider: `scripted` (each task's model_script), or `model` on the API. The
    /// API options are checked against the model here, before any sandbox starts.
    pub fn provider(
        &self,
        model: &str,
        timeout: std::time::Duration,
    ) -> anyhow::Result<std::sync::Arc<dyn wmo_e2b::provider::Provider>> {
        use wmo_e2b::provider::anthropic::{AnthropicConfig, AnthropicProvider};
        use wmo_e2b::provider::openai::{self, OpenAiConfig, OpenAiProvider};
        if model == "scripted" {
            if self.reasoning_effort.is_some() {
                return Err(UsageError(
                    "--reasoning-effort is for a model API, and the scripted model has none: \
                     leave it out, or name a --model"
                        .into(),
                )
                .into());
            }
            return Ok(std::sync::Arc::new(
                wmo_e2b::provider::scripted::ScriptedProvider::new(),
            ));
        }
        let usage = |e: wmo_e2b::provider::ProviderError| UsageError(e.to_string());
        match self.provider {
            ProviderKind::Openai => {
                if self.reasoning_effort.is_some() && !openai::is_reasoning_model(model) {
                    return Err(UsageError(format!(
                        "--reasoning-effort is for OpenAI's reasoning models (o1, o3, o4-mini, \
                         ...; gpt-5, gpt-5-mini, ...), and {model:?} is not one of them"
                    ))
                    .into());
                }
                let defaults = OpenAiConfig::default();
                let config = OpenAiConfig {
                    base_url: self.base_url.clone().unwrap_or(defaults.base_url),
                    model: model.to_string(),
                    api_key_env: self.api_key_env.clone().unwrap_or(defaults.api_key_env),
                    timeout,
                    token_param: match self.token_param {
                        TokenParamArg::Auto => openai::TokenParam::Auto,
                        TokenParamArg::MaxTokens => openai::TokenParam::MaxTokens,
                        TokenParamArg::MaxCompletionTokens => {
                            openai::TokenParam::MaxCompletionTokens
                        }
                    },
                    reasoning_effort: self.reasoning_effort.map(|e| match e {
                        EffortArg::Low => openai::ReasoningEffort::Low,
                        EffortArg::Medium => openai::ReasoningEffort::Medium,
                        EffortArg::High => openai::ReasoningEffort::High,
                    }),
                    ..defaults
                };
                Ok(std::sync::Arc::new(
                    OpenAiProvider::new(config).map_err(usage)?,
                ))
            }
            ProviderKind::Anthropic => {
                let openai_only = [
                    (self.reasoning_effort.is_some(), "--reasoning-effort"),
                    (self.token_param != TokenParamArg::Auto, "--token-param"),
                ];
                if let Some((_, flag)) = openai_only.iter().find(|(given, _)| *given) {
                    return Err(UsageError(format!(
                        "{flag} is an option of --provider openai; the Messages API always \
                         takes max_tokens and has no reasoning_effort"
                    ))
                    .into());
                }
                let defaults = AnthropicConfig::default();
                let config = AnthropicConfig {
                    base_url: self.base_url.clone().unwrap_or(defaults.base_url),
                    model: model.to_string(),
                    api_key_env: self.api_key_env.clone().unwrap_or(defaults.api_key_env),
                    timeout,
                    ..defaults
                };
                Ok(std::sync::Arc::new(
                    AnthropicProvider::new(config).map_err(usage)?,
                ))
            }
        }
    }
}

/// The skills of `--skills DIR`, read and checked whole; a bad directory is a usage error
/// naming the file.
pub fn load_skills(
    dir: Option<&std::path::Path>,
) -> anyhow::Result<Option<std::sync::Arc<wmo_e2b::skills::SkillSet>>> {
    use anyhow::Context;
    let Some(dir) = dir else { return Ok(None) };
    let skills = wmo_e2b::skills::SkillSet::load(dir)
        .with_context(|| format!("--skills {}", dir.display()))?;
    Ok(Some(std::sync::Arc::new(skills)))
}

/// An error whose exit code is usage (2): bad options or input files.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

pub fn exit_code_of(err: &anyhow::Error) -> Exit {
    let usage = err.chain().any(|c| {
        c.is::<UsageError>()
            || c.is::<wmo_e2b::task::TaskError>()
            || c.is::<wmo_e2b::skills::SkillError>()
            || c.downcast_ref::<wmo_e2b::image::ImageError>()
                .is_some_and(|e| e.is_bad_input())
            || c.is::<wmo_e2b::image::reference::ReferenceError>()
            || c.is::<wmo_e2b::image::build_key::KeyError>()
            || c.downcast_ref::<wmo_e2b::image::BuildError>()
                .is_some_and(|e| e.is_bad_input())
            || c.downcast_ref::<wmo_e2b::eval::environments::EnvironmentError>()
                .is_some_and(|e| e.is_bad_input())
            || c.downcast_ref::<wmo_e2b::analysis::AnalysisError>()
                .is_some_and(|e| e.is_bad_input())
    });
    if usage {
        Exit::Usage
    } else {
        Exit::Infrastructure
    }
}
