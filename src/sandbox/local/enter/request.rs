//! The caller's side: a request written onto the helper's command line and environment.

use std::ffi::OsString;

use super::helper::{open_holder_at, ENV_PREFIX, HELPER_HOOK, REQUEST};
use crate::sandbox::local::isolation::Identity;
use crate::sandbox::local::ns::Holder;
use crate::sandbox::local::spawn::{command_line_hidden, Entry, Spawn};

/// How a sandbox process is started.
pub(in crate::sandbox::local) enum Request<'a> {
    /// The command `argv` (its program by path, as the sandbox sees it) in every namespace
    /// of `holder`, at `cwd`, with exactly `env`.
    Enter {
        holder: &'a Holder,
        user_namespace: bool,
        /// As root: who to become. In a user namespace the command already is the sandbox
        /// user, and its exec drops the capabilities joining gave it.
        drop_to: Option<Identity>,
        /// A network namespace of the command's own, with only a loopback device, instead
        /// of the holder's (the host's network).
        own_network: bool,
        cwd: &'a str,
        env: &'a [(String, String)],
        argv: &'a [&'a str],
    },
    /// `argv` with the holder's PID namespace passed on as `pass` says (and its user
    /// namespace on fd `helper::JOINED_USER_FD`).
    Join {
        holder: &'a Holder,
        user_namespace: bool,
        pass: Pass,
        /// The image to mount as the holder's root first (see `image_mount`).
        image: Option<ImageMount<'a>>,
        argv: &'a [OsString],
    },
    /// Just `argv`, with nothing of ours but stdio.
    Plain { argv: &'a [OsString] },
    /// Kill every process in `holder`'s PID namespace that is not root's, from inside it,
    /// and prove them gone (as root only: there the holder's own processes are root's).
    Sweep { holder: &'a Holder },
}

/// How a `Join` passes a holder's PID namespace on to its program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::sandbox::local) enum Pass {
    /// As fd `helper::JOINED_PID_FD`, for bwrap to join itself (`--pidns`): without root,
    /// where only bwrap, once in the sandbox's user namespace, may join it.
    Fds,
    /// Joined by the helper (as root), which starts the program inside as a session of its
    /// own and names the leader on fd `announce`, 1 or 2, with a `/proc` of that namespace
    /// where `own_proc` (see `lead`).
    Lead { announce: u8, own_proc: bool },
}

/// An unpacked image mounted, idmapped onto a sandbox's id range from `base`, beneath the
/// writable layer in `layer` (see `image_root`).
#[derive(Clone, Copy)]
pub(in crate::sandbox::local) struct ImageMount<'a> {
    pub rootfs: &'a std::path::Path,
    pub layer: &'a std::path::Path,
    pub base: u32,
    /// The image's working directory, relative to its root (never `-`: see `image_root`),
    /// and the image id the sandbox user stands for there.
    pub workdir: Option<&'a str>,
    pub user: u32,
}

/// What the holder's watcher runs before `argv`, as root, for a sandbox with an id range:
/// this program as the helper, which leaves bwrap a child that maps the user namespace
/// bwrap makes (see `userns`), and execs `argv`. By path: the watcher is no child of ours.
pub(in crate::sandbox::local) fn mapped(program: &std::path::Path, base: u32) -> [OsString; 4] {
    std::hint::black_box(&HELPER_HOOK);
    [
        program.as_os_str().to_owned(),
        REQUEST.into(),
        "map".into(),
        base.to_string().into(),
    ]
}

/// The command line of a sandbox's PID 1 (see `init`): this program, at `path` inside.
pub(in crate::sandbox::local) fn init(path: &str) -> [OsString; 3] {
    std::hint::black_box(&HELPER_HOOK);
    [path.into(), REQUEST.into(), "init".into()]
}

/// The start of a `setsid --fork` command line that runs `argv` (appended after it) under
/// a watcher: this program as the helper, which names its session on fd `announce` (1 or
/// 2), and kills the session once `meta` (a sandbox's `meta.json`) is gone. This program by
/// a path `setsid`'s child can exec while this process lives, whatever became of its file.
pub(in crate::sandbox::local) fn watching(announce: u8, meta: &std::path::Path) -> [OsString; 5] {
    std::hint::black_box(&HELPER_HOOK);
    [
        format!("/proc/{}/exe", std::process::id()).into(),
        REQUEST.into(),
        "watch".into(),
        announce.to_string().into(),
        meta.as_os_str().to_owned(),
    ]
}

impl Request<'_> {
    /// The helper's command for this request: it inherits no variable of ours (`Plain` and
    /// `Join` pass `env` on to their program; `Enter` sets the command's own).
    pub fn command(&self, env: &[(&str, &str)]) -> Spawn {
        // Referenced here so that whatever starts helpers links the hook in with it.
        std::hint::black_box(&HELPER_HOOK);
        let mut args: Vec<OsString> = vec![REQUEST.into()];
        let mut c = Spawn::new("/proc/self/exe");
        match self {
            Request::Enter {
                holder,
                user_namespace,
                drop_to,
                own_network,
                cwd,
                env: command_env,
                argv,
            } => {
                args.extend(["enter".into(), holder_arg(holder)]);
                args.push(flag(*user_namespace, "u").into());
                args.push(drop_to.map_or("-".into(), identity_arg).into());
                args.push(flag(*own_network, "n").into());
                args.push(cwd.into());
                args.extend(argv.iter().map(OsString::from));
                for (i, (k, v)) in command_env.iter().enumerate() {
                    c.env(format!("{ENV_PREFIX}{i}"), format!("{k}={v}"));
                }
                if let Some(entry) = direct_entry(self) {
                    c.enter_directly(entry);
                }
            }
            Request::Join {
                holder,
                user_namespace,
                pass,
                image,
                argv,
            } => {
                args.extend(["join".into(), holder_arg(holder)]);
                args.push(flag(*user_namespace, "u").into());
                args.push(match pass {
                    Pass::Fds => "fds".into(),
                    Pass::Lead { announce, own_proc } => {
                        format!("{announce}{}", if *own_proc { "p" } else { "" }).into()
                    }
                });
                match image {
                    Some(i) => args.extend([
                        i.rootfs.as_os_str().to_owned(),
                        i.layer.as_os_str().to_owned(),
                        i.base.to_string().into(),
                        i.workdir.unwrap_or("-").into(),
                        i.user.to_string().into(),
                    ]),
                    None => args.extend(["-", "-", "-", "-", "-"].map(OsString::from)),
                }
                args.extend(argv.iter().cloned());
            }
            Request::Plain { argv } => {
                args.push("plain".into());
                args.extend(argv.iter().cloned());
            }
            Request::Sweep { holder } => args.extend(["sweep".into(), holder_arg(holder)]),
        }
        if !matches!(self, Request::Enter { .. }) {
            c.envs(env.iter().copied());
        }
        c.args(args);
        c
    }
}

/// An `Enter` as a direct entry (see `spawn::Entry`), with the holder's namespaces opened
/// here; none where they cannot be (the holder gone: the helper then says so), none while
/// this process's command line shows (see `spawn::entry`), and none without root. Until its
/// exec the command shares this process's memory, credentials of the host's included: only
/// a command that becomes another user (root's drop to the sandbox's) can be kept from every
/// process of the sandbox then (see `spawn::entry`); in a user namespace it already is their
/// user, and the helper's own memory is all it could show.
fn direct_entry(request: &Request) -> Option<Entry> {
    let Request::Enter {
        holder,
        user_namespace,
        drop_to,
        own_network,
        cwd,
        env,
        argv,
        ..
    } = request
    else {
        return None;
    };
    if drop_to.is_none() || !command_line_hidden() {
        return None;
    }
    let opened = open_holder_at(holder.init, holder.start_time, *user_namespace, true).ok()?;
    let [mnt, ipc, uts, root] = opened.rest?;
    Some(Entry {
        user: opened.user,
        namespaces: [ipc, uts, opened.pid, mnt],
        root,
        own_network: *own_network,
        drop_to: *drop_to,
        argv: argv.iter().map(OsString::from).collect(),
        env: env
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect(),
        cwd: OsString::from(cwd),
    })
}

/// `UID`, or `UID+GROUP` with a supplementary group.
fn identity_arg(id: Identity) -> String {
    match id.group {
        Some(g) => format!("{}+{g}", id.uid),
        None => id.uid.to_string(),
    }
}

fn holder_arg(h: &Holder) -> OsString {
    format!("{}:{}", h.init, h.start_time).into()
}

fn flag(on: bool, name: &str) -> &str {
    if on {
        name
    } else {
        "-"
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::*;

    #[test]
    fn a_request_is_the_option_then_its_kind() {
        let h = Holder {
            init: 42,
            start_time: 7,
            group: 41,
            group_start: 6,
            layer: 0,
        };
        let env = [("A".to_string(), "1".to_string())];
        let c = Request::Enter {
            holder: &h,
            user_namespace: false,
            drop_to: Some(Identity {
                uid: 1000,
                group: None,
            }),
            own_network: true,
            cwd: "/home/user",
            env: &env,
            argv: &["/bin/bash", "-c", "echo hi"],
        }
        .command(&[("PATH", "/bin")]);
        let args: Vec<&OsStr> = c.get_args().iter().map(|a| a.as_os_str()).collect();
        assert_eq!(
            args,
            [
                REQUEST,
                "enter",
                "42:7",
                "-",
                "1000",
                "n",
                "/home/user",
                "/bin/bash",
                "-c",
                "echo hi"
            ]
        );
        let envs: Vec<_> = c
            .get_envs()
            .iter()
            .map(|(k, v)| (k.as_os_str(), Some(v.as_os_str())))
            .collect();
        // The command's variables travel under our names; the caller's PATH does not reach
        // the helper.
        assert_eq!(
            envs,
            [(OsStr::new("WMO_E2B_SANDBOX_ENV_0"), Some(OsStr::new("A=1")))]
        );
    }
}
