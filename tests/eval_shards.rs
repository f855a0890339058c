//! `eval --shard auto` under the batch engines: deploy/'s Kubernetes Indexed Job and Slurm
//! array script, read from the repository, and the real binary run with the environment each
//! engine sets, for every index, on the local backend with the scripted model. Every task
//! must land in exactly one shard's `DIR/shard-I-of-N/`, and the shards together must be the
//! whole tasks file.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use wmo_e2b::eval::run_lock;
use wmo_e2b::eval::shard::ENGINE_VARS;
use wmo_e2b::task::shard_of;

mod support;

use support::{results_in, task, text, Env, SUBMIT};

const REPO: &str = env!("CARGO_MANIFEST_DIR");
const MANIFEST: &str = "deploy/kubernetes/eval-indexed-job.yaml";
const SLURM_SCRIPT: &str = "deploy/slurm/eval-array.sbatch";

/// Twelve tasks that submit at once; every shard of 2, 3 or 4 gets some (checked).
fn write_tasks(env: &Env) -> (PathBuf, Vec<String>) {
    let ids: Vec<String> = (0..12).map(|i| format!("t{i}")).collect();
    for n in 2..=4 {
        for s in 0..n {
            assert!(
                ids.iter().any(|id| shard_of(id, n) == s),
                "shard {s}/{n} of the test's ids is empty: pick other ids"
            );
        }
    }
    let lines: Vec<String> = ids
        .iter()
        .map(|id| task(id, &format!(r#""model_script": [{SUBMIT}]"#)))
        .collect();
    (env.write_tasks(&lines), ids)
}

/// The CLI with no batch engine's variable but `vars`, whatever the machine running the
/// tests is under.
fn engine_cmd(env: &Env, args: &[String], vars: &[(&str, String)]) -> Command {
    let mut c = env.cmd(&[]);
    c.args(args);
    for v in ENGINE_VARS {
        c.env_remove(v);
    }
    c.envs(vars.iter().map(|(k, v)| (*k, v)));
    c
}

/// Checks the shared directory `out` holds exactly `shard-0-of-N` .. `shard-(N-1)-of-N`,
/// each a whole eval output directory with only its own tasks, and that together they hold
/// every id once.
fn check_split(out: &Path, n: u32, ids: &[String]) {
    let dirs: BTreeSet<String> = std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let expected: BTreeSet<String> = (0..n).map(|i| format!("shard-{i}-of-{n}")).collect();
    assert_eq!(dirs, expected, "in {}", out.display());
    let mut seen = Vec::new();
    for i in 0..n {
        let dir = out.join(format!("shard-{i}-of-{n}"));
        for name in ["results.jsonl", "summary.json", "transcripts", "eval.lock"] {
            assert!(dir.join(name).exists(), "{} has no {name}", dir.display());
        }
        let results = results_in(&dir);
        for r in &results {
            let id = r["id"].as_str().unwrap();
            assert_eq!(shard_of(id, n), i, "{id} ran in shard {i} of {n}");
            assert_eq!(r["status"], "passed", "{r}");
            assert!(dir.join(format!("transcripts/{id}.jsonl")).exists(), "{id}");
            seen.push(id.to_string());
        }
        let summary: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap())
                .unwrap();
        assert_eq!(summary["total"], results.len(), "{summary}");
    }
    seen.sort();
    let mut all = ids.to_vec();
    all.sort();
    assert_eq!(
        seen, all,
        "the shards together must run every task exactly once"
    );
}

/// The `--json` events of a run.
fn events(o: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn event<'a>(events: &'a [Value], kind: &str) -> &'a Value {
    events
        .iter()
        .find(|e| e["type"] == kind)
        .unwrap_or_else(|| panic!("no {kind} event in {events:?}"))
}

/// The value of `key: value` the first time `key` starts a line (after its indentation).
fn scalar<'a>(yaml: &'a str, key: &str) -> Option<&'a str> {
    yaml.lines().find_map(|l| {
        let v = l.trim_start().strip_prefix(key)?.strip_prefix(':')?;
        Some(v.trim().trim_matches('"'))
    })
}

/// The lines of every sequence item that opens with `head` (e.g. `- name: results`): its
/// first line and those indented deeper than its dash.
fn items<'a>(yaml: &'a str, head: &str) -> Vec<Vec<&'a str>> {
    let lines: Vec<&str> = yaml.lines().collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let mut found = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if l.trim() != head {
            continue;
        }
        let dash = indent(l);
        let rest = lines[i + 1..]
            .iter()
            .take_while(|m| m.trim().is_empty() || indent(m) > dash)
            .copied();
        found.push(std::iter::once(*l).chain(rest).collect());
    }
    found
}

/// The container's `args`, written as a flow sequence of quoted strings (which JSON reads).
fn container_args(yaml: &str) -> Vec<String> {
    let start = yaml.find("args: [").expect("the container's args: [...]") + "args: ".len();
    let end = start + yaml[start..].find(']').expect("the end of args") + 1;
    serde_json::from_str(&yaml[start..end]).expect("args as quoted strings")
}

/// The value after `flag` in `args`.
fn flag<'a>(args: &'a [String], flag: &str) -> &'a str {
    let i = args.iter().position(|a| a == flag);
    i.and_then(|i| args.get(i + 1))
        .unwrap_or_else(|| panic!("no {flag} in {args:?}"))
}

#[test]
fn the_kubernetes_indexed_job_runs_every_task_in_exactly_one_pod() {
    let yaml = std::fs::read_to_string(Path::new(REPO).join(MANIFEST)).unwrap();
    assert_eq!(scalar(&yaml, "apiVersion"), Some("batch/v1"));
    assert_eq!(scalar(&yaml, "kind"), Some("Job"));
    assert_eq!(scalar(&yaml, "completionMode"), Some("Indexed"));
    assert_eq!(scalar(&yaml, "restartPolicy"), Some("Never"));
    let completions: u32 = scalar(&yaml, "completions").unwrap().parse().unwrap();
    let parallelism: u32 = scalar(&yaml, "parallelism").unwrap().parse().unwrap();
    assert!((1..=completions).contains(&parallelism), "{parallelism}");
    let args = container_args(&yaml);
    assert_eq!(args[0], "eval");
    // The Job does not tell a pod its completions: N is written twice and must agree.
    assert_eq!(flag(&args, "--shard"), format!("auto/{completions}"));
    assert_eq!(flag(&args, "--backend"), "e2b");
    assert!(args.iter().any(|a| a == "--resume"), "{args:?}");
    // The key comes from a Secret, never the manifest.
    let key = items(&yaml, "- name: E2B_API_KEY");
    assert_eq!(key.len(), 1, "{key:?}");
    assert!(
        key[0].iter().any(|l| l.trim() == "secretKeyRef:"),
        "{key:?}"
    );
    assert!(
        !key[0].iter().any(|l| l.trim().starts_with("value:")),
        "{key:?}"
    );
    // --out is the mount point of a volume every pod shares.
    let out = flag(&args, "--out");
    let mounted = format!("mountPath: {out}");
    let named = items(&yaml, "- name: results");
    assert!(
        named.iter().any(|i| i.iter().any(|l| l.trim() == mounted)),
        "the results volume is not mounted at {out}: {named:?}"
    );
    assert!(
        named
            .iter()
            .any(|i| i.iter().any(|l| l.trim() == "persistentVolumeClaim:")),
        "the volume at {out} is no PersistentVolumeClaim: {named:?}"
    );

    // Every pod, as the Job starts it: its args, on this machine's backend and model.
    let env = Env::new();
    let (tasks, ids) = write_tasks(&env);
    let shared = env.out();
    let local: Vec<String> = args
        .iter()
        .enumerate()
        .map(|(i, a)| match i.checked_sub(1).map(|p| args[p].as_str()) {
            Some("--tasks") => tasks.display().to_string(),
            Some("--out") => shared.display().to_string(),
            Some("--backend") => "local".into(),
            Some("--model") => "scripted".into(),
            Some("-j") => "2".into(),
            _ => a.clone(),
        })
        .collect();
    let pod = |i: u32| engine_cmd(&env, &local, &[("JOB_COMPLETION_INDEX", i.to_string())]);
    for i in 0..completions {
        let o = pod(i).output().unwrap();
        assert_eq!(o.status.code(), Some(0), "pod {i}: {}", text(&o));
        let ev = events(&o);
        let own = shared.join(format!("shard-{i}-of-{completions}"));
        assert_eq!(
            event(&ev, "run_started")["out_dir"],
            own.display().to_string()
        );
        assert_eq!(event(&ev, "summary")["out_dir"], own.display().to_string());
    }
    check_split(&shared, completions, &ids);

    // A replacement pod of index 0 (--resume) finds its shard done and touches no other.
    let before: Vec<String> = (0..completions)
        .map(|i| read(&shared.join(format!("shard-{i}-of-{completions}/results.jsonl"))))
        .collect();
    let o = pod(0).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let started = event(&events(&o), "run_started").clone();
    assert_eq!(started["total"], 0, "{started}");
    let in_0 = ids
        .iter()
        .filter(|id| shard_of(id, completions) == 0)
        .count();
    assert_eq!(started["already_finished"], in_0, "{started}");
    for (i, was) in before.iter().enumerate() {
        let path = shared.join(format!("shard-{i}-of-{completions}/results.jsonl"));
        assert_eq!(&read(&path), was, "shard {i}");
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn the_slurm_array_script_runs_every_task_in_exactly_one_array_task() {
    let script = Path::new(REPO).join(SLURM_SCRIPT);
    let text_of = read(&script);
    let array = text_of
        .lines()
        .find_map(|l| l.strip_prefix("#SBATCH --array="))
        .expect("an #SBATCH --array= line");
    // 0-(N-1), optionally %K (how many at once): the array is the split.
    let range = array.split('%').next().unwrap();
    let (first, last) = range.split_once('-').expect("--array=0-(N-1)");
    assert_eq!(first, "0", "{array}");
    let n: u32 = last.parse::<u32>().expect("--array=0-(N-1) with no step") + 1;
    assert!(text_of.contains("--shard auto "), "{text_of}");

    let env = Env::new();
    let (tasks, ids) = write_tasks(&env);
    for i in 0..n {
        // What sbatch sets in array task i, and what a user exports to the script.
        let vars = [
            ("SLURM_ARRAY_JOB_ID", "4242".to_string()),
            ("SLURM_ARRAY_TASK_ID", i.to_string()),
            ("SLURM_ARRAY_TASK_MIN", "0".to_string()),
            ("SLURM_ARRAY_TASK_MAX", (n - 1).to_string()),
            ("SLURM_ARRAY_TASK_COUNT", n.to_string()),
            ("SLURM_ARRAY_TASK_STEP", "1".to_string()),
            ("WMO_E2B", env!("CARGO_BIN_EXE_wmo-e2b").to_string()),
            ("TASKS", tasks.display().to_string()),
            ("BACKEND", "local".to_string()),
            ("MODEL", "scripted".to_string()),
            ("JOBS", "2".to_string()),
        ];
        let mut bash = Command::new("bash");
        bash.arg(&script).current_dir(env.dir.path());
        bash.env("WMO_E2B_HOME", env.home()).env_remove("OUT");
        for v in ENGINE_VARS {
            bash.env_remove(v);
        }
        bash.envs(vars.iter().map(|(k, v)| (*k, v)));
        let o = bash.output().unwrap();
        assert_eq!(o.status.code(), Some(0), "array task {i}: {}", text(&o));
        // The script's default --out is shared by the array's tasks (its job id).
        let results = format!("runs/slurm-4242/shard-{i}-of-{n}/results.jsonl");
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(stdout.contains(&results), "{stdout}");
    }
    check_split(&env.path("runs/slurm-4242"), n, &ids);
}

#[test]
fn an_aws_batch_array_splits_by_its_index_and_size_and_one_index_runs_once_at_a_time() {
    let env = Env::new();
    let (tasks, ids) = write_tasks(&env);
    let out = env.out();
    let args: Vec<String> = ["eval", "--tasks", &tasks.display().to_string()]
        .iter()
        .map(|s| s.to_string())
        .chain(["--out".into(), out.display().to_string()])
        .chain(["--shard", "auto", "-j", "2"].map(String::from))
        .collect();
    let child = |i: u32| {
        engine_cmd(
            &env,
            &args,
            &[
                ("AWS_BATCH_JOB_ARRAY_INDEX", i.to_string()),
                ("AWS_BATCH_JOB_ARRAY_SIZE", "3".to_string()),
            ],
        )
        .output()
        .unwrap()
    };
    // Another process already writes shard 1 (a retried child, a duplicate pod): refused,
    // before it touches the directory, while the other indexes run.
    let busy = out.join("shard-1-of-3");
    std::fs::create_dir_all(&busy).unwrap();
    let held = run_lock::lock_out_dir(&busy).unwrap();
    let o = child(1);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains(&busy.display().to_string()),
        "{}",
        text(&o)
    );
    assert!(!busy.join("results.jsonl").exists());
    drop(held);
    for i in 0..3 {
        let o = child(i);
        assert_eq!(o.status.code(), Some(0), "child {i}: {}", text(&o));
    }
    check_split(&out, 3, &ids);
    // The same directory split another way would put a task in two shards: refused.
    let mut again = args.clone();
    let at = again.iter().position(|a| a == "auto").unwrap();
    again[at] = "0/2".into();
    let o = engine_cmd(&env, &again, &[]).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("split into 3 shards"), "{}", text(&o));
    assert!(!out.join("shard-0-of-2").exists());
}

#[test]
fn a_bad_engine_variable_exits_2_naming_it_before_anything_is_written() {
    let env = Env::new();
    let (tasks, _) = write_tasks(&env);
    let args = |shard: &str| -> Vec<String> {
        let t = tasks.display().to_string();
        let o = env.out().display().to_string();
        ["eval", "--tasks", &t, "--out", &o, "--shard", shard]
            .map(String::from)
            .to_vec()
    };
    // Each: --shard, the engine's variables, and what the message must name.
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a [&'a str]);
    let cases: &[Case] = &[
        (
            "auto/4",
            &[("JOB_COMPLETION_INDEX", "two")],
            &["JOB_COMPLETION_INDEX=\"two\"", "not a whole number"],
        ),
        (
            "auto",
            &[("JOB_COMPLETION_INDEX", "0")],
            &["JOB_COMPLETION_INDEX", "--shard auto/N"],
        ),
        (
            "auto",
            &[
                ("SLURM_ARRAY_TASK_ID", "3"),
                ("SLURM_ARRAY_TASK_MIN", "0"),
                ("SLURM_ARRAY_TASK_COUNT", "3"),
            ],
            &["SLURM_ARRAY_TASK_ID=3", "SLURM_ARRAY_TASK_COUNT=3"],
        ),
        (
            "auto/2",
            &[("AWS_BATCH_JOB_ARRAY_INDEX", "-1")],
            &["AWS_BATCH_JOB_ARRAY_INDEX=-1", "negative"],
        ),
        (
            "auto/2",
            &[],
            &[
                "JOB_COMPLETION_INDEX",
                "SLURM_ARRAY_TASK_ID",
                "AWS_BATCH_JOB_ARRAY_INDEX",
            ],
        ),
    ];
    for (shard, vars, named) in cases {
        let vars: Vec<(&str, String)> = vars.iter().map(|(k, v)| (*k, v.to_string())).collect();
        let o = engine_cmd(&env, &args(shard), &vars).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{vars:?}: {}", text(&o));
        let stderr = String::from_utf8_lossy(&o.stderr);
        for n in *named {
            assert!(stderr.contains(n), "{vars:?}: {stderr} does not say {n}");
        }
        assert!(
            !env.out().exists(),
            "{vars:?} created {}",
            env.out().display()
        );
    }
}
