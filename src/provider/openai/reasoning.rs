//! What OpenAI's reasoning models want of a chat-completions body that the runner writes for
//! every model: the output cap under another name, no sampling temperature, and optionally a
//! reasoning effort.

use serde_json::{Map, Value};

/// Which name the output-token cap is sent under.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TokenParam {
    /// `max_completion_tokens` for reasoning models (see [`is_reasoning_model`]), the
    /// runner's own choice (`max_tokens`) for the rest.
    #[default]
    Auto,
    MaxTokens,
    MaxCompletionTokens,
}

/// How hard a reasoning model thinks before it answers (`reasoning_effort`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningEffort {
    Low,
    Medium,
    High,
}

impl ReasoningEffort {
    pub fn as_str(self) -> &'static str {
        match self {
            ReasoningEffort::Low => "low",
            ReasoningEffort::Medium => "medium",
            ReasoningEffort::High => "high",
        }
    }
}

/// Whether `model` names one of OpenAI's reasoning models, which refuse `max_tokens` (they
/// want `max_completion_tokens`) and any `temperature` but the default, and accept
/// `reasoning_effort`. The rule, on the name as given (case-insensitive):
///
/// - the o-series: `o` and a digit (`o1`, `o1-mini`, `o3`, `o3-pro`, `o4-mini`, ...);
/// - the GPT-5 family: `gpt-5` alone or followed by `-` or `.` (`gpt-5`, `gpt-5-mini`,
///   `gpt-5.1`, `gpt-5-2025-08-07`, ...), except its chat variants (`gpt-5-chat-latest`),
///   which are not reasoning models.
///
/// Names the rule cannot see through (a deployment alias, a router's `vendor/model`) are
/// sent as for any other model; `--token-param` overrides the token parameter for them.
pub fn is_reasoning_model(model: &str) -> bool {
    let name = model.to_ascii_lowercase();
    let bytes = name.as_bytes();
    if bytes.first() == Some(&b'o') && bytes.get(1).is_some_and(u8::is_ascii_digit) {
        return true;
    }
    match name.strip_prefix("gpt-5") {
        Some(rest) => {
            (rest.is_empty() || rest.starts_with('-') || rest.starts_with('.'))
                && !rest.contains("-chat")
        }
        None => false,
    }
}

/// Rewrites a chat-completions body for `model`: the output cap under the name `token_param`
/// picks (a body carrying both keeps the wanted one's value), and for a reasoning model no
/// `temperature` (only the default is accepted, and leaving it out asks for the default) and
/// `reasoning_effort` when `effort` is given.
pub fn fit_body(
    body: &mut Map<String, Value>,
    model: &str,
    token_param: TokenParam,
    effort: Option<ReasoningEffort>,
) {
    let reasoning = is_reasoning_model(model);
    let wanted = match token_param {
        TokenParam::Auto if reasoning => Some(TokenParam::MaxCompletionTokens),
        TokenParam::Auto => None,
        other => Some(other),
    };
    let rename = match wanted {
        Some(TokenParam::MaxCompletionTokens) => Some(("max_tokens", "max_completion_tokens")),
        Some(TokenParam::MaxTokens) => Some(("max_completion_tokens", "max_tokens")),
        _ => None,
    };
    if let Some((from, to)) = rename {
        if let Some(cap) = body.remove(from) {
            body.entry(to).or_insert(cap);
        }
    }
    if reasoning {
        body.remove("temperature");
        if let Some(effort) = effort {
            body.insert("reasoning_effort".into(), effort.as_str().into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_rule_names_the_families() {
        for yes in [
            "o1",
            "o1-mini",
            "o1-preview",
            "o3",
            "o3-mini",
            "o3-pro",
            "o4-mini",
            "O3",
            "gpt-5",
            "gpt-5-mini",
            "gpt-5-nano",
            "gpt-5.1",
            "gpt-5-2025-08-07",
            "gpt-5-codex",
        ] {
            assert!(is_reasoning_model(yes), "{yes}");
        }
        for no in [
            "gpt-4o",
            "gpt-4o-mini",
            "gpt-4.1",
            "gpt-50",
            "gpt-5-chat-latest",
            "omni",
            "o",
            "openai/o3",
            "claude-sonnet-4-5",
            "",
        ] {
            assert!(!is_reasoning_model(no), "{no}");
        }
    }

    fn fit(body: Value, model: &str, p: TokenParam, e: Option<ReasoningEffort>) -> Value {
        let Value::Object(mut map) = body else {
            unreachable!()
        };
        fit_body(&mut map, model, p, e);
        Value::Object(map)
    }

    #[test]
    fn reasoning_models_get_their_parameters() {
        let body = json!({"messages": [], "max_tokens": 64, "temperature": 0.2});
        assert_eq!(
            fit(
                body.clone(),
                "o3",
                TokenParam::Auto,
                Some(ReasoningEffort::High)
            ),
            json!({"messages": [], "max_completion_tokens": 64, "reasoning_effort": "high"})
        );
        // Other models keep the runner's body, and never get an effort.
        assert_eq!(
            fit(
                body.clone(),
                "gpt-4o",
                TokenParam::Auto,
                Some(ReasoningEffort::Low)
            ),
            body
        );
        // The flag overrides the rule either way; temperature follows the name alone.
        assert_eq!(
            fit(
                body.clone(),
                "my-deployment",
                TokenParam::MaxCompletionTokens,
                None
            ),
            json!({"messages": [], "max_completion_tokens": 64, "temperature": 0.2})
        );
        assert_eq!(
            fit(body, "gpt-5", TokenParam::MaxTokens, None),
            json!({"messages": [], "max_tokens": 64})
        );
        assert_eq!(
            fit(
                json!({"max_completion_tokens": 8}),
                "gpt-4o",
                TokenParam::MaxTokens,
                None
            ),
            json!({"max_tokens": 8})
        );
        // A body naming both keeps the wanted name's value.
        assert_eq!(
            fit(
                json!({"max_tokens": 8, "max_completion_tokens": 9}),
                "o1",
                TokenParam::Auto,
                None
            ),
            json!({"max_completion_tokens": 9})
        );
    }
}
