//! The local backend: sandboxes are directories on this machine. Under bubblewrap (the
//! default where it works; see `isolation`) every sandbox process runs in namespaces that show
//! it only the system directories, read-only, and the sandbox's own: its home at `/home/user`,
//! a private `/tmp`, and (for the runner) `/opt/wmo-e2b`. Under `--isolation none` processes
//! are plain host processes in their own process groups: **not a security boundary**. Either
//! way the environment is scrubbed and every file the host reads or writes for a sandbox is
//! resolved beneath the sandbox's directories (see `confined`).
//!
//! Layout, under `<state>/sandboxes/` (and `<state>/sandbox-identity/`, the passwd and group
//! files bwrap sandboxes see):
//!
//! ```text
//! <id>/meta.json     id, created, deadline, metadata, template, internet, owner_pid, envs,
//!                    isolation, timeout, pause_at_deadline, paused (see `pause`)
//! <id>/procs/<pid>   one per started process: its start time and role, then its command
//!                    (`procs` links to a directory of a tmpfs: see `procs_dir`)
//!                    (`procs` links to a tmpfs directory: see `procs_dir`)
//! <id>/ns/           the holders of its PID namespaces (bwrap; see `ns`)
//! <id>/root/         the sandbox's home()
//! <id>/tmp/          its /tmp (bwrap)
//! <id>/system/       its system_dir()
//! <id>/sealed/       the copy of home and /tmp that `reset` restores (see `reset`)
//! <id>/cgroups       where its cgroups are, if it has limits (see `cgroup`)
//! <id>/boot_id       what its /proc/sys/kernel/random/boot_id reads (bwrap; see `boot_id`)
//! .dead-<id>-<rand>  a sandbox being killed (see `teardown`)
//! .new-<id>          a sandbox being created
//! ```
//!
//! Lifetimes: a sandbox dies at its deadline, or is paused then if it was created to be
//! (`OnTimeout::Pause`). Every `LocalBackend::open` (so every wmo-e2b command) sweeps expired
//! sandboxes, each backend runs a watcher thread that kills (or pauses) its own sandboxes
//! when their deadline passes, and any call on an expired sandbox kills it. Killing a sandbox
//! kills every process group it started, whichever wmo-e2b process started it. A paused
//! sandbox has no deadline: it lives until it is resumed (`connect`) or killed.
//!
//! Modules, each using only those above it:
//!
//! ```text
//! spawn         starting a child without copying this process's descriptor table
//! probe         short commands run to learn something, with a deadline
//! sys           process syscalls, /proc reads, probes
//! seccomp       the system call filter of every command started in a sandbox
//! start_report  what a starting process reports on a pipe, read with bounds
//! confined      host file operations that never leave a sandbox directory
//! boot_id       a sandbox's boot id, new at each boot
//! isolation     bwrap: found, probed, its command lines
//! cgroup        a sandbox's control groups: made, limited, counted, removed
//! procs_dir     where the process records live: a tmpfs where one can be had
//! meta          on-disk records: meta.json, procs/<pid>, ids
//! id_range      the host ids of a sandbox's user namespace (as root)
//! ns            namespace holders: their records, and killing them
//! enter         starting a process in a holder's namespaces through a helper
//! netns         a sandbox's own network namespace and its user-mode network stack
//! admission     how many holders start at once
//! holder_start  starting a holder
//! image_files   read_file and write_file on an image's own paths, in the task namespace
//! outlet        a background process's output, to its current subscriber
//! proc_table    the processes this wmo-e2b process started and has not reaped
//! watch         a child's output pipes and exit, watched from one thread
//! snapshot      copies and listings of directory trees
//! teardown      killing a sandbox
//! freeze        stopping and continuing every process of a sandbox's namespaces
//! limit_watch   the limits of a sandbox's current task, and which it ran into
//! state         what every handle on one sandbox shares
//! pause         pausing and resuming a sandbox
//! process       starting processes and carrying their output
//! reset         seal and reset
//! stop          stopping the agent before its work is verified
//! sandbox       the `Sandbox` handle
//! backend       the `Backend`: create, connect, list, kill, sweep, watch
//! ```

pub mod admission;
mod backend;
mod boot_id;
mod cgroup;
pub mod confined;
mod enter;
mod freeze;
mod holder_start;
mod id_range;
mod image_files;
mod image_root;
pub mod isolation;
mod limit_watch;
mod meta;
mod netns;
mod ns;
mod outlet;
mod pause;
mod ports;
mod pre_exec;
mod probe;
mod proc_table;
mod process;
mod procs_dir;
mod reset;
mod sandbox;
mod seccomp;
mod snapshot;
mod spawn;
mod start_report;
mod state;
mod stop;
mod sys;
mod teardown;
mod watch;

pub use backend::{LocalBackend, LocalOptions};
pub use confined::Beneath;
pub use image_root::images_in_use;
pub use isolation::{Isolation, IsolationChoice};
pub use netns::unavailable_with as network_unavailable;
pub use pause::{Resume, Resumed};
pub use sandbox::LocalSandbox;
