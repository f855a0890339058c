//! A sandbox's namespace holders as its shared state keeps them: found alive (here or by
//! another wmo-e2b process), started, marked entered, and the spare made ahead for the next
//! task namespace.

use std::io;
use std::sync::Arc;

use super::SandboxState;
use crate::sandbox::local::image_root::{self, Layer};
use crate::sandbox::local::isolation::{Binds, Bwrap, SANDBOX_UID};
use crate::sandbox::local::netns;
use crate::sandbox::local::ns::{self, Holder, Space};
use crate::sandbox::local::{boot_id, holder_start};
use crate::sandbox::Result;
use crate::sync::lock;

impl SandboxState {
    /// The holder of a namespace, alive (bwrap only).
    pub fn holder(&self, space: Space) -> Result<Holder> {
        let slot = space as usize;
        if let Some(h) = lock(&self.holders)[slot].filter(Holder::is_alive) {
            return Ok(h);
        }
        // Another wmo-e2b process may have replaced it (a reset), or it died.
        let recorded = match ns::read(&self.dir, space) {
            // A reset cut short between dropping the old task record and renaming the spare's
            // into its place (see `ns::promote_spare`): finish it.
            Err(e) if space == Space::Task && e.kind() == io::ErrorKind::NotFound => {
                ns::promote_spare(&self.dir).and_then(|()| ns::read(&self.dir, space))
            }
            read => read,
        };
        match recorded {
            Ok(h) if h.is_alive() => {
                lock(&self.holders)[slot] = Some(h);
                Ok(h)
            }
            Ok(_) | Err(_) => {
                self.ensure_live()?;
                Err(self.io_error(
                    "joining the sandbox's namespace",
                    io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("the {space:?} namespace of the sandbox is gone"),
                    ),
                ))
            }
        }
    }

    /// Marks the task namespace `holder` holds as entered, before a task process enters it:
    /// a reset keeps only a namespace no task process ever ran in.
    pub fn mark_entered(&self, holder: &Holder) -> Result<()> {
        let mut marked = lock(&self.entered);
        if *marked != Some(*holder) {
            ns::mark_entered(&self.dir, holder)
                .map_err(|e| self.io_error("marking the task namespace entered", e))?;
            *marked = Some(*holder);
        }
        Ok(())
    }

    /// Starts the holder of `space` and caches it.
    pub fn start_holder(&self, bwrap: &Bwrap, space: Space) -> Result<Holder> {
        let parent = match space {
            Space::Sandbox => None,
            Space::Task | Space::Spare => Some(self.holder(Space::Sandbox)?),
        };
        // A task namespace on an image gets a layer of its own (see `image_root`).
        // The task namespace's is the current one when a task holder starts again for the
        // same task; a spare's is always fresh.
        let layer = match (&self.image, space) {
            (Some(image), Space::Task | Space::Spare) => {
                let workdir = image.workdir.as_deref();
                let current = match space {
                    Space::Task => Layer::current(&self.dir, workdir),
                    _ => None,
                };
                let owner = |inside| bwrap.host_owner(self.ids, inside).unwrap_or(inside);
                let owners = (owner(0), owner(SANDBOX_UID));
                let layer = match current {
                    Some(layer) => (layer, false),
                    None => Layer::make(&self.dir, owners, workdir)
                        .map(|l| (l, true))
                        .map_err(|e| self.io_error("making the task's layer of the image", e))?,
                };
                Some(layer)
            }
            _ => None,
        };
        let image = self.image.as_ref().zip(layer.as_ref().map(|(l, _)| l));
        // The first holder starts when the sandbox boots: at its create, and again when a
        // filesystem-only resume reboots it.
        if space == Space::Sandbox {
            boot_id::renew(&self.dir)
                .map_err(|e| self.io_error("giving the sandbox a boot id", e))?;
        }
        let boot_id = boot_id::path(&self.dir);
        let binds = Binds {
            boot_id: Some(&boot_id),
            ..self.binds()
        };
        let h = holder_start::start(
            bwrap,
            &binds,
            &self.dir,
            space,
            parent.as_ref(),
            self.own_network,
            self.ids,
            image,
        )
        .map_err(|e| {
            if let Some((l, true)) = &layer {
                let _ = crate::deep_remove::remove_tree(&l.dir);
            }
            self.io_error("starting the sandbox's namespace", e)
        })?;
        if let (Some((l, _)), Space::Task) = (&layer, space) {
            Layer::make_current(&self.dir, l.number)
                .map_err(|e| self.io_error("recording the task's layer of the image", e))?;
        }
        if self.own_network && space == Space::Sandbox {
            netns::attach(bwrap, &self.dir, &h)
                .map_err(|e| self.io_error("giving the sandbox its network", e))?;
        }
        lock(&self.holders)[space as usize] = Some(h);
        Ok(h)
    }

    /// Waits for the spare task namespace being made, if any, and hands it over: a pause
    /// needs no process of the sandbox still being started.
    pub fn take_spare(&self) -> Option<Holder> {
        let job = lock(&self.spare).take()?;
        job.join().ok().and_then(Result::ok)
    }

    /// Forgets the holders seen alive: a filesystem pause ended them.
    pub fn forget_holders(&self) {
        *lock(&self.holders) = [None, None, None];
    }

    /// Whether a reset keeps the task namespace once a sweep proves it empty (see `reset`):
    /// as root, where the holder's processes are root's and the task's are not, on a sandbox
    /// with no image.
    pub fn reuses_task_namespace(&self, bwrap: &Bwrap) -> bool {
        bwrap.is_root() && self.image.is_none()
    }

    /// Starts making the next task namespace in the background, where a reset is expected to
    /// need one: where it keeps its namespace, the rare reset that cannot makes its own.
    pub fn prepare_spare(self: &Arc<Self>, bwrap: &'static Bwrap) {
        if self.reuses_task_namespace(bwrap) {
            return;
        }
        let state = Arc::clone(self);
        let job = std::thread::Builder::new()
            .name("lsb-spare".into())
            .spawn(move || state.start_holder(bwrap, Space::Spare));
        // No thread: the next reset makes its namespace itself.
        *lock(&self.spare) = job.ok();
    }

    /// Makes a fresh task namespace the sandbox's: the spare when one is ready, else a new
    /// one now.
    pub fn replace_task_namespace(self: &Arc<Self>, bwrap: &'static Bwrap) -> Result<Holder> {
        // The task namespace replaced was the task's: the next is made over a fresh layer.
        Layer::forget_current(&self.dir);
        let job = lock(&self.spare).take();
        let spare = job
            .and_then(|j| j.join().ok())
            .and_then(Result::ok)
            .filter(Holder::is_alive);
        let holder = match spare {
            Some(h) => {
                ns::promote_spare(&self.dir)
                    .map_err(|e| self.io_error("recording the task namespace", e))?;
                if h.layer != 0 {
                    Layer::make_current(&self.dir, h.layer)
                        .map_err(|e| self.io_error("recording the task's layer", e))?;
                }
                let mut cache = lock(&self.holders);
                cache[Space::Task as usize] = Some(h);
                cache[Space::Spare as usize] = None;
                h
            }
            None => self.start_holder(bwrap, Space::Task)?,
        };
        // The replaced namespace's layer, dead with it; the spare's is young, and kept.
        image_root::sweep(&self.dir, &[holder.layer]);
        self.prepare_spare(bwrap);
        Ok(holder)
    }
}
