//! Starting a process inside a sandbox, through a helper that is this very program.
//!
//! Joining a holder's namespaces and dropping privileges must happen in the new process,
//! between its fork and its exec. Done there in this process (std's `pre_exec`), every start
//! would be a full `fork()` of a process with many threads, whose page tables the kernel
//! copies; a cheap start (see `spawn`) copies nothing but runs raw system calls alone in the
//! child, which suffices for a command as root (`spawn::Entry`). What takes more (mounting
//! an image, handing fds to bwrap, sweeping a namespace, watching a sandbox), and a command
//! that could not be started that way, goes through a helper: this program again
//! (`/proc/self/exe`), started cheaply, with a request on its command line. A hook that runs
//! before `main` in every program linking this library (the CLI and every test binary)
//! spots the request, carries it out, and never returns to `main`.
//!
//! The requests:
//! - **enter**: join every namespace of a holder, change root and directory, and start the
//!   command as a child (a PID namespace takes in only the children of a process that
//!   joined it), which drops every privilege and execs. The helper stays outside as the
//!   command's launcher: it reaps the command and ends as it ended (the shape of `nsenter
//!   --fork`). That launcher outside is why a holder's PID 1 is killed before the command
//!   groups (see `Holder::kill`). As root, a command is first started without it, straight
//!   into the sandbox (`spawn::Entry`, the same steps from the cheap start's child); this
//!   request is what remains without root or wherever that cannot be, and says why on the
//!   command's stderr.
//! - **join**: open a holder's PID namespace (and user namespace) and run the rest in it:
//!   as root, the helper joins the PID namespace and starts the rest there as a session
//!   whose leader it names (`lead`), which dies with the sandbox; without root it execs the
//!   rest (a nested holder's bwrap) with the namespaces as fd 10 (and 11), for bwrap to join
//!   itself (`--pidns 10`). A nested holder's bwrap always gets the user namespace as fd 11.
//!   For a sandbox with an image, the helper first mounts it as that holder's root
//!   (`image_mount`). slirp4netns is started the same way, into the sandbox holder's PID
//!   namespace.
//! - **plain**: exec the rest.
//! - **map**: exec the rest (a sandbox's first holder's bwrap, as root with an id range)
//!   with a child that maps the user namespace bwrap makes (`userns`, `id_range`). Started
//!   by path from the holder's watcher, which stays the host's.
//! - **watch**: lead the session of a sandbox's holder (and, without root, of its task
//!   holder): run the rest, and kill the session once the sandbox's `meta.json` is gone
//!   (`watch`).
//! - **init**: be a sandbox namespace's PID 1: say ready, then reap forever (`init`).
//! - **sweep**: kill every process of a holder's PID namespace that is not root's, from
//!   inside it, prove them gone, and look for what they left in the namespace (`sweep`).
//!
//! A holder's pid is checked to still name that holder after its namespaces are opened,
//! through the same `/proc` entry, so a recycled pid never puts a process in someone else's
//! namespace. Every request passes on nothing but stdio (and the fds `join` opens): fds the
//! caller holds, or inherited from its own parent, close at the exec. The command's
//! variables travel in the helper's environment under names of ours (which only root and
//! the owner can read, unlike a command line), so none of them reaches the helper's own
//! start as root (a loader variable such as LD_PRELOAD there would run code as root).

mod helper;
mod image_mount;
mod init;
mod lead;
mod request;
mod sweep;
mod userns;
mod watch;

pub(super) use request::{init, mapped, watching, ImageMount, Pass, Request};
pub(super) use sweep::{QUEUES_AT, QUEUES_DIR, SWEEP_LEFTOVERS};
pub(super) use userns::{HOST_ROOT_INSIDE, MAP_BLOCK_FD};
