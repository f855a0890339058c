//! The `read_skill` tool: offered with the skills' listing in the system prompt, answered by
//! the broker itself from the skills loaded on the host. A read never reaches the
//! environment and spends no tool action: it only brings instructions into the context.

use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::EpisodeConfig;
use crate::environment::ToolOutput;
use crate::skills::SkillSet;

/// The tool's name, as the agent calls it.
pub const READ_SKILL: &str = "read_skill";

impl EpisodeConfig {
    /// Offers `skills` to the agent: their names and descriptions join the system prompt and
    /// `read_skill` joins the tools, and the broker answers it. The one place both happen,
    /// so a listed skill can always be read.
    pub fn offer_skills(&mut self, skills: Arc<SkillSet>) {
        self.system.push_str(&prompt_section(&skills));
        self.tools.push(tool_spec());
        self.skills = Some(skills);
    }
}

/// The tool's spec, in OpenAI's function-tool form like the others.
fn tool_spec() -> Value {
    json!({"type": "function", "function": {
        "name": READ_SKILL,
        "description": "Read a skill: the full instructions behind one of the skills listed in the system prompt.",
        "parameters": {
            "type": "object",
            "properties": {"name": {"type": "string", "description": "the skill's name, as listed"}},
            "required": ["name"],
        },
    }})
}

/// The system prompt's section listing the skills, bodies left out.
fn prompt_section(skills: &SkillSet) -> String {
    let mut s = format!(
        "\n## Skills\nInstructions for particular kinds of work. When one applies, call \
         `{READ_SKILL}` with its name to read it in full before you start.\n"
    );
    for skill in skills.iter() {
        s.push_str(&format!("- {}: {}\n", skill.name, skill.description));
    }
    s
}

/// The answer to a `read_skill` call: the skill's body, or a tool error the agent can act
/// on.
pub(super) fn answer(skills: &SkillSet, args: &Map<String, Value>) -> ToolOutput {
    let Some(name) = args.get("name").and_then(Value::as_str) else {
        return ToolOutput::error(format!("{READ_SKILL} needs `name`, a string"));
    };
    match skills.get(name) {
        Some(skill) => ToolOutput::ok(skill.body.clone()),
        None => {
            // The name is the agent's: only a bounded piece of it is echoed.
            let shown: String = name.chars().take(crate::skills::MAX_NAME + 1).collect();
            let known: Vec<&str> = skills.iter().map(|s| s.name.as_str()).collect();
            ToolOutput::error(format!(
                "no skill named '{shown}'; the skills are: {}",
                known.join(", ")
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skills() -> SkillSet {
        let d = tempfile::tempdir().unwrap();
        for (name, body) in [("deploy", "BODY-deploy"), ("review", "BODY-review")] {
            let text = format!("---\nname: {name}\ndescription: how to {name}\n---\n{body}");
            std::fs::write(d.path().join(format!("{name}.md")), text).unwrap();
        }
        SkillSet::load(d.path()).unwrap()
    }

    fn config() -> EpisodeConfig {
        EpisodeConfig {
            episode_id: "e".into(),
            harness: "builtin".into(),
            system: "base prompt\n".into(),
            tools: Vec::new(),
            files: Map::new(),
            files_digest: None,
            max_turns: 1,
            max_tool_actions: 1,
            max_output_tokens: 1,
            budget: Default::default(),
            temperature: None,
            wall: std::time::Duration::from_secs(1),
            skills: None,
            agent: None,
        }
    }

    #[test]
    fn offering_lists_every_skill_without_its_body_and_adds_the_tool() {
        let mut c = config();
        c.offer_skills(Arc::new(skills()));
        assert!(c.system.starts_with("base prompt\n"), "{}", c.system);
        assert!(c
            .system
            .contains("- deploy: how to deploy\n- review: how to review\n"));
        assert!(c.system.contains("`read_skill`"));
        assert!(!c.system.contains("BODY-"), "{}", c.system);
        assert_eq!(c.tools.len(), 1);
        assert_eq!(c.tools[0]["function"]["name"], READ_SKILL);
        assert!(c.skills.is_some());
    }

    #[test]
    fn answers_a_body_or_an_error_naming_the_skills() {
        let s = skills();
        let args = |v: Value| v.as_object().unwrap().clone();
        assert_eq!(
            answer(&s, &args(json!({"name": "review"}))),
            ToolOutput::ok("BODY-review")
        );
        let miss = answer(&s, &args(json!({"name": "nope"})));
        assert!(miss.is_error);
        assert_eq!(
            miss.content,
            "no skill named 'nope'; the skills are: deploy, review"
        );
        let bad = answer(&s, &args(json!({"name": 3})));
        assert!(bad.is_error && bad.content.contains("`name`"), "{bad:?}");
        let long = answer(&s, &args(json!({"name": "x".repeat(10_000)})));
        assert!(long.content.len() < 200, "{}", long.content.len());
    }
}
