//! One template build, on a thread of its own: the uploaded files unpacked into a build
//! context (refusing any entry that climbs out, as an image layer is), the recipe's
//! Dockerfile beside them, the host's builder run on it into the image store (built once per
//! content, as any Dockerfile is), and the image unpacked as the root its sandboxes run on.

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::recipe::{copy_target, dockerfile, is_dir_path, relative, Recipe, STEPS_DIR};
use super::{Build, Slot, Status, Templates};
use crate::errors::error_chain;
use crate::glob::{is_pattern, is_real_dir, matching};
use crate::image::build::DEFAULT_BUILD_TIMEOUT;
use crate::image::unpack::{unpack_image, LayerBlob};
use crate::image::{self, BuildRequest, RegistryConfig, Store};
use crate::sandbox::e2b::E2B_USER_ID;
use crate::sandbox::ImageRoot;
use crate::sync::lock;

/// The builder's log read back into the build's entries: its end, at most this much.
const MAX_LOG_TAIL: u64 = 256 << 10;

/// Starts making `build` from `recipe`; its state says how it went.
/// `slot` is held until the build ends.
pub(super) fn start(templates: Arc<Templates>, build: Arc<Build>, recipe: Recipe, slot: Slot) {
    {
        let mut state = lock(&build.state);
        state.status = Status::Building;
        state.recipe = Some(recipe.clone());
        state.log("info", format!("Building from {}", recipe.from_image));
    }
    let thread_build = Arc::clone(&build);
    let spawned = std::thread::Builder::new()
        .name("emu-template".into())
        .spawn(move || {
            let _running = slot;
            let made = make(&templates, &thread_build, &recipe);
            let mut state = lock(&thread_build.state);
            match made {
                Ok(root) => {
                    state.log("info", "Build finished");
                    state.end_logs();
                    state.root = Some(root);
                    state.status = Status::Ready;
                }
                Err(why) => state.fail(why),
            }
        });
    if let Err(e) = spawned {
        lock(&build.state).fail(format!("cannot start the build's thread: {e}"));
    }
}

fn make(templates: &Templates, build: &Build, recipe: &Recipe) -> Result<ImageRoot, String> {
    let file = dockerfile(recipe).map_err(|e| e.to_string())?;
    let context = templates.work.join(&build.id);
    let made = (|| {
        fs::create_dir_all(&context).map_err(io("create", &context))?;
        for (index, step) in recipe.steps.iter().enumerate() {
            if let (Some(hash), "COPY") = (step.files_hash.as_deref(), step.kind.as_str()) {
                let at = |i: usize| step.args.get(i).map(String::as_str).unwrap_or("");
                lay_out_copy(templates, &context, index, hash, at(0), at(1))?;
            }
        }
        let dockerfile_path = context.join("Dockerfile");
        fs::write(&dockerfile_path, file).map_err(io("write", &dockerfile_path))?;
        build_image(templates, build, &dockerfile_path, &context)
    })();
    // The context is this build's alone; a failure to remove it takes only room.
    let _ = crate::deep_remove::remove_tree(&context);
    made
}

fn build_image(
    templates: &Templates,
    build: &Build,
    dockerfile_path: &Path,
    context: &Path,
) -> Result<ImageRoot, String> {
    let store = Store::open_default().map_err(|e| format!("the image store: {e}"))?;
    let config = RegistryConfig::load_default().map_err(|e| error_chain(&e))?;
    let logs = templates.work.join("logs");
    let request = BuildRequest {
        dockerfile: dockerfile_path,
        context,
        args: &[],
        timeout: DEFAULT_BUILD_TIMEOUT,
        log_dir: &logs,
    };
    let built = image::build(&request, None, &store, &config).map_err(|e| error_chain(&e))?;
    {
        let mut state = lock(&build.state);
        if built.fresh {
            for line in log_tail(&built.log) {
                state.log("info", line);
            }
        } else {
            state.log("info", format!("Cached: built before as {}", built.key));
        }
    }
    if !templates.holds_store() {
        templates.keep_store(
            store
                .pull_lock()
                .map_err(|e| format!("the image store: {e}"))?,
        );
    }
    let root =
        image::task_root(&built.image, &store).map_err(|e| format!("unpacking the image: {e}"))?;
    // E2B runs a sandbox's commands as `user` whatever the image's `USER`: what uid 1000 owns
    // is theirs, as it is in the cloud's VM.
    Ok(ImageRoot {
        user: E2B_USER_ID,
        ..root
    })
}

/// Lays out what COPY step `index` copies in `steps/<index>/`, named as it lands (see
/// [`copy_target`]): its upload (a tar, gzipped or not, as the SDK sends it) unpacked under
/// the bounds and checks of an image layer, and what `src` names in it moved into place.
fn lay_out_copy(
    templates: &Templates,
    context: &Path,
    index: usize,
    hash: &str,
    src: &str,
    dest: &str,
) -> Result<(), String> {
    let fail = |why: String| format!("steps[{index}]: COPY {src:?}: {why}");
    let upload = templates.files.join(hash);
    let mut magic = [0u8; 2];
    let read = File::open(&upload).and_then(|mut f| f.read(&mut magic));
    let media_type = match read {
        Ok(2) if magic == [0x1f, 0x8b] => "application/vnd.oci.image.layer.v1.tar+gzip",
        Ok(_) => "application/vnd.oci.image.layer.v1.tar",
        Err(e) => return Err(fail(format!("its files were not uploaded: {e}"))),
    };
    let staging = context.join(".unpack").join(index.to_string());
    let key = format!("sha256:{hash}");
    let blob = LayerBlob {
        path: upload,
        media_type: media_type.into(),
        digest: key.clone(),
        diff_id: None,
    };
    let unpacked = unpack_image(&[blob], &staging, &key).map_err(|e| fail(error_chain(&e)))?;
    let matches = matching(&unpacked, relative(src).map_err(fail)?).map_err(fail)?;
    let out = context.join(STEPS_DIR).join(index.to_string());
    fs::create_dir_all(&out).map_err(io("create", &out))?;
    let (_, name) = copy_target(src, dest);
    // A directory named as the source is copied by its contents, as a Dockerfile's `COPY`
    // does: into `dest` when that ends with a slash (else it becomes `dest` itself).
    let single_dir = !is_pattern(src) && matches.len() == 1 && is_real_dir(&matches[0]);
    if single_dir && is_dir_path(dest) {
        let entries = fs::read_dir(&matches[0]).map_err(|e| fail(format!("reading it: {e}")))?;
        for entry in entries {
            let entry = entry.map_err(|e| fail(format!("reading it: {e}")))?;
            let target = out.join(entry.file_name());
            fs::rename(entry.path(), &target).map_err(io("move into place", &target))?;
        }
        let _ = crate::deep_remove::remove_tree(&staging);
        return Ok(());
    }
    for found in &matches {
        let own = found
            .file_name()
            .map(|n| n.to_os_string())
            .unwrap_or_default();
        let target = out.join(name.map_or(own, Into::into));
        if fs::symlink_metadata(&target).is_ok() {
            return Err(fail(format!("two matches are named {}", target.display())));
        }
        fs::rename(found, &target).map_err(io("move into place", &target))?;
    }
    let _ = crate::deep_remove::remove_tree(&staging);
    Ok(())
}

/// The last lines of the builder's log, bounded.
fn log_tail(path: &Path) -> Vec<String> {
    let mut bytes = Vec::new();
    let read = File::open(path).and_then(|mut f| {
        let len = f.metadata()?.len();
        f.seek(SeekFrom::Start(len.saturating_sub(MAX_LOG_TAIL)))?;
        f.take(MAX_LOG_TAIL).read_to_end(&mut bytes)
    });
    if read.is_err() {
        return Vec::new();
    }
    String::from_utf8_lossy(&bytes)
        .lines()
        .map(str::to_string)
        .collect()
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> String {
    let path: PathBuf = path.to_path_buf();
    move |e| format!("cannot {op} {}: {e}", path.display())
}
