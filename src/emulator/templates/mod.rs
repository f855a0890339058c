//! E2B's template builds, served on the host's image builder and image store: a client asks
//! for a build (`POST /v3/templates`), uploads the files of its `COPY` steps, starts the build
//! with its steps, polls its status and logs, then creates sandboxes from the template's name.
//! Each build becomes a Dockerfile (`recipe`), built as any task's Dockerfile is, keyed by
//! its content (`build`); a sandbox of the template runs on the built image as its root.
//!
//! Layout: this module keeps the table of templates and builds; `routes` answers the API;
//! `recipe` turns steps into a Dockerfile; `build` runs one build on its own thread.

mod build;
mod recipe;
mod routes;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use recipe::Recipe;
pub(super) use routes::{handle, is_upload};

use crate::image::store::StoreLock;
use crate::sandbox::ImageRoot;
use crate::sync::lock;

/// Log entries kept per build; past it one entry says how many were left out.
const MAX_LOG_ENTRIES: usize = 5000;
/// Templates one emulator keeps, and builds per template.
const MAX_TEMPLATES: usize = 1024;
const MAX_BUILDS_PER_TEMPLATE: usize = 16;
/// The image E2B's `base` template is made from, which a build `fromTemplate: "base"` starts
/// with (pulled through the mirrors in `registries.toml`, like any image).
const BASE_IMAGE: &str = "e2bdev/base";
/// The tag a build gets when it is given none, and a name without a tag names.
const DEFAULT_TAG: &str = "default";

/// Every template this emulator built or is building.
pub(in crate::emulator) struct Templates {
    table: Mutex<Table>,
    /// Uploaded files by their `filesHash`.
    files: PathBuf,
    /// Build contexts and logs.
    work: PathBuf,
    /// Signs upload URLs: the upload itself carries no API key, as a presigned URL does not.
    secret: String,
    /// Held once a template is ready: no prune removes a root this emulator serves.
    store_lock: Mutex<Option<StoreLock>>,
    /// Builds running now, and the most at once.
    running: Arc<AtomicUsize>,
    max_running: usize,
}

/// A place among the running builds, given back when the build ends.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Default)]
struct Table {
    by_id: HashMap<String, Template>,
    /// A template's name (without a tag) to its id.
    by_name: HashMap<String, String>,
}

struct Template {
    id: String,
    name: String,
    /// Newest last.
    builds: Vec<Arc<Build>>,
    /// Tag to build id, and when it was assigned.
    tags: BTreeMap<String, (String, SystemTime)>,
}

/// One build of a template: its state, shared with the thread that makes it.
struct Build {
    pub id: String,
    pub template_id: String,
    pub state: Mutex<BuildState>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    /// Asked for, not started.
    Waiting,
    Building,
    Ready,
    Error,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Waiting => "waiting",
            Status::Building => "building",
            Status::Ready => "ready",
            Status::Error => "error",
        }
    }
}

#[derive(Debug, Clone)]
struct LogEntry {
    pub at: SystemTime,
    pub level: &'static str,
    pub message: String,
}

struct BuildState {
    pub status: Status,
    pub logs: Vec<LogEntry>,
    /// Lines not kept past [`MAX_LOG_ENTRIES`].
    pub dropped: u64,
    /// Why it failed.
    pub reason: Option<String>,
    /// What it makes, once started: a template built `fromTemplate` this one starts with it.
    pub recipe: Option<Recipe>,
    pub root: Option<ImageRoot>,
}

impl BuildState {
    pub fn log(&mut self, level: &'static str, message: impl Into<String>) {
        if self.logs.len() + 1 < MAX_LOG_ENTRIES {
            self.logs.push(LogEntry {
                at: SystemTime::now(),
                level,
                message: message.into(),
            });
        } else {
            self.dropped += 1;
        }
    }

    pub fn fail(&mut self, reason: String) {
        self.log("error", reason.clone());
        self.end_logs();
        self.status = Status::Error;
        self.reason = Some(reason);
    }

    /// The last entry: how many lines were left out, when some were.
    pub fn end_logs(&mut self) {
        if self.dropped > 0 {
            let note = format!("[{} log lines left out]", self.dropped);
            self.logs.push(LogEntry {
                at: SystemTime::now(),
                level: "warn",
                message: note,
            });
            self.dropped = 0;
        }
    }
}

/// What a sandbox create finds under a template name.
pub(in crate::emulator) enum Found {
    Image(ImageRoot),
    /// The template exists; no build of it (of that tag) is ready.
    NotReady,
    Missing,
}

impl Templates {
    /// `max_running`: builds at once (`None`: the CPUs this process may use).
    pub fn new(state_dir: &Path, max_running: Option<usize>) -> Templates {
        Templates {
            table: Mutex::new(Table::default()),
            files: state_dir.join("template-files"),
            work: state_dir.join("template-builds"),
            secret: crate::id::random_hex(32).unwrap_or_else(|_| crate::id::unique_hex(16)),
            store_lock: Mutex::new(None),
            running: Arc::new(AtomicUsize::new(0)),
            max_running: max_running
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from))
                .max(1),
        }
    }

    /// A place for one more running build, unless [`Templates::max_running`] run already.
    fn slot(&self) -> Option<Slot> {
        let taken = self
            .running
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.max_running).then_some(n + 1)
            });
        taken.ok().map(|_| Slot(Arc::clone(&self.running)))
    }

    /// The root a sandbox of `name` (`name`, `name:tag` or a template id) runs on.
    pub fn for_create(&self, name: &str) -> Found {
        let table = lock(&self.table);
        let Some((template, tag)) = table.find(name) else {
            return Found::Missing;
        };
        match template
            .tagged(tag)
            .and_then(|b| lock(&b.state).root.clone())
        {
            Some(root) => Found::Image(root),
            None => Found::NotReady,
        }
    }

    /// A new build of the template `name` (made when new), tagged with `tags` (`default`
    /// when none, as E2B tags a build).
    fn request(&self, name: &str, tags: &[String]) -> Result<(String, Arc<Build>), String> {
        let mut table = lock(&self.table);
        let id = match table.by_name.get(name) {
            Some(id) => id.clone(),
            None => {
                if table.by_id.len() >= MAX_TEMPLATES {
                    return Err(format!(
                        "the emulator keeps at most {MAX_TEMPLATES} templates"
                    ));
                }
                let id = template_id();
                table.by_name.insert(name.to_string(), id.clone());
                table.by_id.insert(
                    id.clone(),
                    Template {
                        id: id.clone(),
                        name: name.to_string(),
                        builds: Vec::new(),
                        tags: BTreeMap::new(),
                    },
                );
                id
            }
        };
        let template = table
            .by_id
            .get_mut(&id)
            .ok_or_else(|| "the template went away".to_string())?;
        let build = Arc::new(Build {
            id: build_id(),
            template_id: id.clone(),
            state: Mutex::new(BuildState {
                status: Status::Waiting,
                logs: Vec::new(),
                dropped: 0,
                reason: None,
                recipe: None,
                root: None,
            }),
        });
        if template.builds.len() >= MAX_BUILDS_PER_TEMPLATE {
            let oldest = template.builds.remove(0);
            template.tags.retain(|_, (b, _)| *b != oldest.id);
        }
        template.builds.push(Arc::clone(&build));
        let default = [DEFAULT_TAG.to_string()];
        for tag in if tags.is_empty() { &default[..] } else { tags } {
            template
                .tags
                .insert(tag.clone(), (build.id.clone(), SystemTime::now()));
        }
        Ok((template.name.clone(), build))
    }

    /// The build `build_id` of the template `template_id`.
    fn build(&self, template_id: &str, build_id: &str) -> Option<Arc<Build>> {
        let table = lock(&self.table);
        let template = table.by_id.get(template_id)?;
        template.builds.iter().find(|b| b.id == build_id).cloned()
    }

    fn exists(&self, template_id: &str) -> bool {
        lock(&self.table).by_id.contains_key(template_id)
    }

    /// What the build `name` names made, once ready: where a build `fromTemplate` it starts.
    fn recipe_of(&self, name: &str) -> Option<Recipe> {
        let table = lock(&self.table);
        let (template, tag) = table.find(name)?;
        let state = lock(&template.tagged(tag)?.state);
        (state.status == Status::Ready)
            .then(|| state.recipe.clone())
            .flatten()
    }

    /// The template id a name or id names, whether it exists.
    fn id_of(&self, name: &str) -> Option<String> {
        lock(&self.table).find(name).map(|(t, _)| t.id.clone())
    }

    fn delete(&self, template_id: &str) -> bool {
        let mut table = lock(&self.table);
        match table.by_id.remove(template_id) {
            Some(t) => {
                table.by_name.remove(&t.name);
                true
            }
            None => false,
        }
    }

    /// Tags the build `target` (`name:tag`, or a name: its `default` build) names with
    /// `tags` as well; that build's id.
    fn assign_tags(&self, target: &str, tags: &[String]) -> Option<String> {
        let mut table = lock(&self.table);
        let (template, tag) = table.find(target)?;
        let (id, name) = (template.tagged(tag)?.id.clone(), template.id.clone());
        let template = table.by_id.get_mut(&name)?;
        for tag in tags {
            template
                .tags
                .insert(tag.clone(), (id.clone(), SystemTime::now()));
        }
        Some(id)
    }

    /// Removes `tags` from the template `name`; false when there is no such template.
    fn remove_tags(&self, name: &str, tags: &[String]) -> bool {
        let mut table = lock(&self.table);
        let Some(id) = table.find(name).map(|(t, _)| t.id.clone()) else {
            return false;
        };
        if let Some(template) = table.by_id.get_mut(&id) {
            template.tags.retain(|t, _| !tags.contains(t));
        }
        true
    }

    /// The template's tags: each with its build and when it was assigned.
    fn tags_of(&self, template_id: &str) -> Option<Vec<(String, String, SystemTime)>> {
        let table = lock(&self.table);
        let template = table.by_id.get(template_id)?;
        Some(
            template
                .tags
                .iter()
                .map(|(tag, (build, at))| (tag.clone(), build.clone(), *at))
                .collect(),
        )
    }

    fn keep_store(&self, store_lock: StoreLock) {
        lock(&self.store_lock).get_or_insert(store_lock);
    }

    fn holds_store(&self) -> bool {
        lock(&self.store_lock).is_some()
    }
}

impl Template {
    /// The build `tag` names; no tag is E2B's `default` tag.
    fn tagged(&self, tag: Option<&str>) -> Option<&Arc<Build>> {
        let (id, _) = self.tags.get(tag.unwrap_or(DEFAULT_TAG))?;
        self.builds.iter().find(|b| &b.id == id)
    }
}

impl Table {
    /// The template `name` names (`name`, `name:tag` or its id), and the tag, if any.
    fn find<'a, 'n>(&'a self, name: &'n str) -> Option<(&'a Template, Option<&'n str>)> {
        if let Some(t) = self.by_id.get(name) {
            return Some((t, None));
        }
        let (base, tag) = match name.split_once(':') {
            Some((b, t)) => (b, Some(t)),
            None => (name, None),
        };
        let id = self.by_name.get(base)?;
        Some((self.by_id.get(id)?, tag))
    }
}

/// E2B's template ids are 20 lowercase alphanumerics.
fn template_id() -> String {
    crate::id::unique_hex(10)
}

/// Build ids are UUIDs.
fn build_id() -> String {
    let h = crate::id::unique_hex(16);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(templates: &Templates, build: &Build, image: &str) {
        let mut state = lock(&build.state);
        state.status = Status::Ready;
        state.root = Some(ImageRoot {
            id: image.into(),
            rootfs: PathBuf::from("/nonexistent"),
            env: Vec::new(),
            workdir: None,
            user: 0,
            shell: "/bin/sh".into(),
            template: None,
        });
        let _ = templates;
    }

    fn image_of(found: Found) -> Option<String> {
        match found {
            Found::Image(root) => Some(root.id),
            _ => None,
        }
    }

    #[test]
    fn a_name_finds_its_newest_ready_build_and_a_tag_its_own() {
        let tmp = tempfile::tempdir().unwrap();
        let t = Templates::new(tmp.path(), None);
        assert!(matches!(t.for_create("app"), Found::Missing));
        let (_, first) = t.request("app", &[]).unwrap();
        assert!(matches!(t.for_create("app"), Found::NotReady));
        ready(&t, &first, "one");
        let (_, second) = t.request("app", &["v2".into()]).unwrap();
        assert_eq!(first.template_id, second.template_id);
        assert_eq!(image_of(t.for_create("app")).as_deref(), Some("one"));
        assert!(matches!(t.for_create("app:v2"), Found::NotReady));
        ready(&t, &second, "two");
        // A name without a tag is the `default` tag's build, however new another is.
        assert_eq!(image_of(t.for_create("app")).as_deref(), Some("one"));
        assert_eq!(
            image_of(t.for_create("app:default")).as_deref(),
            Some("one")
        );
        assert_eq!(image_of(t.for_create("app:v2")).as_deref(), Some("two"));
        assert_eq!(
            image_of(t.for_create(&first.template_id)).as_deref(),
            Some("one")
        );
        let (_, third) = t.request("app", &[]).unwrap();
        ready(&t, &third, "three");
        assert_eq!(image_of(t.for_create("app")).as_deref(), Some("three"));
        assert!(matches!(t.for_create("app:v3"), Found::NotReady));
        assert_eq!(
            t.assign_tags("app:v2", &["prod".into()]),
            Some(second.id.clone())
        );
        assert_eq!(image_of(t.for_create("app:prod")).as_deref(), Some("two"));
        assert!(t.remove_tags("app", &["prod".into()]));
        assert!(matches!(t.for_create("app:prod"), Found::NotReady));
        let tags = t.tags_of(&first.template_id).unwrap();
        assert!(tags
            .iter()
            .any(|(tag, build, _)| tag == "v2" && *build == second.id));
        assert!(t.delete(&first.template_id));
        assert!(matches!(t.for_create("app"), Found::Missing));
    }

    #[test]
    fn builds_per_template_are_bounded() {
        let tmp = tempfile::tempdir().unwrap();
        let t = Templates::new(tmp.path(), None);
        let (_, first) = t.request("app", &[]).unwrap();
        for _ in 0..MAX_BUILDS_PER_TEMPLATE {
            t.request("app", &[]).unwrap();
        }
        assert!(t.build(&first.template_id, &first.id).is_none());
        let table = lock(&t.table);
        assert_eq!(
            table.by_id[&first.template_id].builds.len(),
            MAX_BUILDS_PER_TEMPLATE
        );
    }

    #[test]
    fn running_builds_are_bounded_and_a_finished_one_frees_its_place() {
        let tmp = tempfile::tempdir().unwrap();
        let t = Templates::new(tmp.path(), Some(2));
        let first = t.slot().unwrap();
        let _second = t.slot().unwrap();
        assert!(t.slot().is_none());
        drop(first);
        assert!(t.slot().is_some());
    }

    #[test]
    fn build_logs_are_bounded_and_say_what_was_left_out() {
        let mut state = BuildState {
            status: Status::Building,
            logs: Vec::new(),
            dropped: 0,
            reason: None,
            recipe: None,
            root: None,
        };
        for i in 0..MAX_LOG_ENTRIES + 10 {
            state.log("info", format!("line {i}"));
        }
        state.end_logs();
        assert_eq!(state.logs.len(), MAX_LOG_ENTRIES);
        assert_eq!(
            state.logs.last().map(|l| l.message.as_str()),
            Some("[11 log lines left out]")
        );
    }
}
