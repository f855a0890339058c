//! `wmo-e2b report --html` on a real run, opened in a real browser (Debian's headless
//! chromium): the summary figures, the table after filters set in the URL fragment, a task's
//! conversation with its tool calls, the baseline side by side for a flipped task, a
//! screenshot, and a task whose answer, tool output and verify output hold markup that must
//! stay text.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

mod support;

use support::{task, text, wait_bounded, Env, SUBMIT};

const INJECT: &str = r#"</script><script>alert(1)</script><b id="pwned">x</b>"#;
/// What the injection looks like when it stayed text, as the DOM dump writes it.
const INJECT_AS_TEXT: &str = "&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;";

fn call(name: &str, arguments: Value) -> Value {
    json!({"tool_calls": [{"name": name, "arguments": arguments}]})
}

/// A real run of three tasks (with metadata: suite arith, arith, web; level 2 but on plain): `add` passes after two bash calls, `plain` submits at once,
/// and `inject` fails its verify; its tool output, answer and verify output carry markup,
/// and its tool call's arguments are over the page's 64 KiB bound.
fn real_run(env: &Env) -> PathBuf {
    let add = json!([
        call("bash", json!({"command": "cat in.txt"})),
        call("bash", json!({"command": "echo 7 > out.txt"})),
        serde_json::from_str::<Value>(SUBMIT).unwrap(),
    ]);
    let inject = json!([
        call(
            "bash",
            json!({"command": format!("printf '%s\\n' '{INJECT}'; : '{}'", "y".repeat(70_000))})
        ),
        call("submit", json!({"answer": INJECT})),
    ]);
    let tasks = env.write_tasks(&[
        task(
            "add",
            &format!(
                r#""metadata": {{"suite": "arith", "level": 2}}, "files": {{"in.txt": "3 4"}}, "verify": "test \"$(cat out.txt)\" = 7", "model_script": {add}"#
            ),
        ),
        task(
            "plain",
            &format!(r#""metadata": {{"suite": "arith"}}, "model_script": [{SUBMIT}]"#),
        ),
        task(
            "inject",
            &format!(
                r#""metadata": {{"suite": "web", "level": 2}}, "verify": "echo '<i id=\"pwned2\">v</i>'; exit 1", "model_script": {inject}"#
            ),
        ),
    ]);
    let o = env.eval(&tasks, &["-j", "2"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    tasks
}

/// The chromium binary; when missing, `scripts/system-deps.sh` installs it (as root), and
/// the test fails naming what to install rather than passing without a browser.
fn chromium() -> PathBuf {
    let find = || {
        ["chromium", "chromium-browser"].iter().find_map(|b| {
            let o = Command::new("sh")
                .args(["-c", &format!("command -v {b}")])
                .output()
                .ok()?;
            let p = String::from_utf8_lossy(&o.stdout).trim().to_string();
            (o.status.success() && !p.is_empty()).then(|| PathBuf::from(p))
        })
    };
    if let Some(p) = find() {
        return p;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let _ = Command::new("bash")
        .arg(root.join("scripts/system-deps.sh"))
        .status();
    find().unwrap_or_else(|| {
        panic!(
            "the HTML report test needs a headless browser: install Debian's chromium \
             (apt-get install chromium; scripts/system-deps.sh does it when run as root)"
        )
    })
}

struct Browser {
    bin: PathBuf,
    profile: tempfile::TempDir,
}

impl Browser {
    fn new() -> Browser {
        Browser {
            bin: chromium(),
            profile: tempfile::tempdir().unwrap(),
        }
    }

    /// Runs the browser headless on `url` with `args`; its stdout goes to `out`.
    fn run(&self, url: &str, args: &[&str], out: &Path) {
        let mut child = Command::new(&self.bin)
            .args(["--headless", "--no-sandbox", "--disable-gpu"])
            .arg(format!("--user-data-dir={}", self.profile.path().display()))
            .args(["--no-first-run", "--disable-extensions"])
            .args(args)
            .arg(url)
            .stdout(File::create(out).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let status = wait_bounded(&mut child, Duration::from_secs(120));
        assert!(status.success(), "chromium on {url}: {status}");
    }

    /// The DOM of `page#fragment` after its scripts ran.
    fn dom(&self, page: &Path, fragment: &str) -> String {
        let out = page.with_extension(format!("dom-{}.html", fragment.len()));
        self.run(&url(page, fragment), &["--dump-dom"], &out);
        let dom = std::fs::read_to_string(&out).unwrap();
        assert!(dom.contains("<table"), "no page in the dump: {dom}");
        dom
    }
}

fn url(page: &Path, fragment: &str) -> String {
    format!("file://{}#{fragment}", page.display())
}

/// The ids of the table's rows, in order.
fn row_ids(dom: &str) -> Vec<String> {
    dom.split("<tr class=\"s-")
        .skip(1)
        .filter_map(|r| {
            let rest = r.split("data-id=\"").nth(1)?;
            Some(rest.split('"').next()?.to_string())
        })
        .collect()
}

fn figure(dom: &str, key: &str) -> String {
    let start = format!("id=\"fig-{key}\">");
    let rest = dom
        .split(&start)
        .nth(1)
        .unwrap_or_else(|| panic!("no {key}"));
    rest.split("</dd>").next().unwrap().to_string()
}

/// The transcript section of the DOM.
fn transcript(dom: &str) -> &str {
    let at = dom
        .find("<section id=\"transcript\"")
        .expect("no transcript section");
    let s = &dom[at..];
    &s[..s.find("</section>").unwrap()]
}

/// The start of a DOM, for a failure message.
fn head(dom: &str) -> String {
    dom.chars().take(3000).collect()
}

fn no_injected_elements(dom: &str) {
    for bad in ["<script>alert", "<b id=\"pwned\"", "<i id=\"pwned2\""] {
        assert!(!dom.contains(bad), "{bad} became markup");
    }
}

#[test]
fn the_html_report_renders_in_a_browser_and_keeps_run_data_as_text() {
    let env = Env::new();
    let tasks = real_run(&env);
    let page = env.path("report.html");
    let out = env.out();
    let o = env.run(&[
        "report",
        out.to_str().unwrap(),
        "--tasks",
        tasks.to_str().unwrap(),
        "--html",
        page.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let html = std::fs::read_to_string(&page).unwrap();
    // Self-contained: nothing fetched from anywhere.
    for fetch in ["<link", " src=", "<iframe", "@import", "url("] {
        assert!(!html.contains(fetch), "the page fetches something: {fetch}");
    }
    no_injected_elements(&html);
    // Only the page's own scripts: the data blob, three transcripts, the code.
    assert_eq!(html.matches("<script").count(), 5);
    assert!(html.contains("<svg class=\"plot\" id=\"plot-stop\""));
    let leftovers: Vec<_> = std::fs::read_dir(env.dir.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    let b = Browser::new();
    let dom = b.dom(&page, "");
    assert_eq!(figure(&dom, "tasks"), "3");
    assert_eq!(figure(&dom, "passed"), "2");
    assert!(
        figure(&dom, "pass-rate").starts_with("66.7%"),
        "{}",
        head(&dom)
    );
    assert!(dom.contains("<span id=\"shown\">3 of 3 tasks</span>"));
    assert_eq!(row_ids(&dom), ["add", "inject", "plain"]);
    no_injected_elements(&dom);

    let failed = b.dom(&page, "status=failed");
    assert_eq!(row_ids(&failed), ["inject"]);
    assert!(failed.contains("1 of 3 tasks"));
    let searched = b.dom(&page, "q=pla&sort=id&desc=1");
    assert_eq!(row_ids(&searched), ["plain"]);
    // Metadata from the tasks file: a filter per key, set in the fragment as m.KEY.
    assert_eq!(row_ids(&b.dom(&page, "m.suite=arith")), ["add", "plain"]);
    assert_eq!(row_ids(&b.dom(&page, "m.suite=arith&m.level=2")), ["add"]);
    let sorted = b.dom(&page, "sort=tools&desc=1");
    assert_eq!(row_ids(&sorted)[0], "add", "three tool calls sort first");

    let add = b.dom(&page, "task=add");
    let t = transcript(&add);
    assert!(t.contains("Task add"));
    assert!(t.contains("do add"), "the instruction: {}", head(t));
    assert_eq!(t.matches("tool call: bash").count(), 2, "{}", head(t));
    assert_eq!(t.matches("tool call: submit").count(), 1, "{}", head(t));
    assert!(
        t.contains("cat in.txt") && t.contains("3 4"),
        "arguments and output: {}",
        head(t)
    );
    assert!(t.contains("passed / submit"), "{}", head(t));

    let shot = env.path("inject.png");
    let inject_url = url(&page, "task=inject");
    let shot_arg = format!("--screenshot={}", shot.display());
    b.run(
        &inject_url,
        &[&shot_arg, "--window-size=1280,2000", "--hide-scrollbars"],
        &env.path("shot.log"),
    );
    let png = std::fs::read(&shot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000,
        "{}",
        png.len()
    );
    let keep = Path::new(env!("CARGO_TARGET_TMPDIR")).join("report_html-inject.png");
    let _ = std::fs::write(keep, &png);

    let inject = b.dom(&page, "task=inject");
    let t = transcript(&inject);
    assert!(t.contains("failed / submit"), "{}", head(t));
    assert!(t.contains("tool call: bash") && t.contains("tool call: submit"));
    // The markup shows as text: in the tool output, the answer, the arguments, and verify.
    assert!(t.matches(INJECT_AS_TEXT).count() >= 3, "{}", head(t));
    assert!(
        t.contains("&lt;i id=\"pwned2\"&gt;v&lt;/i&gt;"),
        "{}",
        head(t)
    );
    assert!(
        t.contains("more bytes not shown"),
        "the 64 KiB bound: {}",
        head(t)
    );
    no_injected_elements(&inject);
}

#[test]
fn compare_mode_marks_flips_and_shows_the_baseline_beside() {
    let env = Env::new();
    real_run(&env);
    // The baseline: the same run with `add` failed and `inject` passed.
    let base = env.path("base");
    let out = env.out();
    assert!(Command::new("cp")
        .arg("-r")
        .arg(&out)
        .arg(&base)
        .status()
        .unwrap()
        .success());
    let results = std::fs::read_to_string(base.join("results.jsonl")).unwrap();
    let flipped: Vec<String> = results
        .lines()
        .map(|l| {
            let mut r: Value = serde_json::from_str(l).unwrap();
            match r["id"].as_str().unwrap() {
                "add" => r["status"] = json!("failed"),
                "inject" => r["status"] = json!("passed"),
                _ => {}
            }
            r.to_string()
        })
        .collect();
    std::fs::write(base.join("results.jsonl"), flipped.join("\n") + "\n").unwrap();
    let page = env.path("cmp.html");
    let o = env.run(&[
        "report",
        out.to_str().unwrap(),
        "--compare",
        base.to_str().unwrap(),
        "--html",
        page.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let b = Browser::new();
    let dom = b.dom(&page, "task=add");
    assert!(
        dom.contains("id=\"cmp-now-passing\">now passing (1):"),
        "{}",
        head(&dom)
    );
    assert!(
        dom.contains("id=\"cmp-now-failing\">now failing (1):"),
        "{}",
        head(&dom)
    );
    // Against itself nothing flipped, and the page says so rather than "(0):".
    let same = env.path("same.html");
    let (o_dir, s_page) = (out.to_str().unwrap(), same.to_str().unwrap());
    let o = env.run(&["report", o_dir, "--compare", o_dir, "--html", s_page]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let page_text = std::fs::read_to_string(&same).unwrap();
    assert!(page_text.contains("id=\"cmp-now-passing\">now passing: none"));
    assert!(!page_text.contains("(0):"));
    let flipped: Vec<&str> = dom
        .split("<tr class=\"")
        .skip(1)
        .filter(|r| r.split('"').next().unwrap().split(' ').any(|c| c == "flip"))
        .collect();
    assert_eq!(flipped.len(), 2, "two rows marked flipped");
    let t = transcript(&dom);
    assert!(t.contains("verdict flipped: now passing"), "{}", head(t));
    assert!(
        t.contains("<h3>this run</h3>") && t.contains("<h3>baseline</h3>"),
        "{}",
        head(t)
    );
    // Both columns hold the conversation, and the baseline's verdict is its own.
    assert_eq!(t.matches("tool call: bash").count(), 4, "{}", head(t));
    assert!(
        t.contains("failed / submit") && t.contains("passed / submit"),
        "{}",
        head(t)
    );
    no_injected_elements(&dom);
}
