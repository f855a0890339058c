//! Proven clean reuse of an E2B sandbox, done inside it by root scripts.
//!
//! Task commands run as E2B's user `user` and the runner as `root`, so a task cannot touch
//! the runner's directory (unless it uses `sudo`; see the README). `seal` copies aside under
//! the system directory the home, `/tmp` and every other directory `user` may write, and
//! records every process running then. `reset` kills every process that was not running at
//! the seal, is not the runner (or a descendant of it), and is not the reset itself; repeats
//! until none is left (a fork loop included); then recreates each directory from its copy
//! (modes, owners and xattrs of the directories themselves included), empties `/dev/shm` and
//! the message queues, removes SysV IPC objects, and compares each directory with its copy.
//! Kernel threads and zombies are not processes to kill. Any doubt exits non-zero and the
//! caller retires the sandbox.

/// Where the scripts keep the sealed state, under the system directory.
pub(super) const SEALED: &str = "/opt/wmo-e2b/sealed";

/// Prints `pid start_time` for every user-space process except the script itself (and its
/// children). Field 22 of `/proc/PID/stat` is the start time, field 9 the flags
/// (0x200000: a kernel thread); the command name may hold spaces, so fields are counted after
/// its closing `) `.
const LIST_PROCS: &str = r#"list_procs() {
  local d pid line rest
  for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    read -r line < "$d/stat" 2>/dev/null || continue
    rest=${line##*) }
    set -- $rest
    [ "$1" = Z ] || [ "$1" = X ] && continue
    (( $7 & 0x200000 )) && continue
    [ "$pid" = "$$" ] || [ "$2" = "$$" ] && continue
    echo "$pid $2 ${20}"
  done
}
"#;

/// The extended attributes of every entry of a tree (`list DIR`: `x PATH NAME HEX` lines, the
/// root as `.`), or a directory given exactly another's (`sync LIVE SEALED`). Through
/// `python3` where the sandbox has it, else `getfattr`/`setfattr`; with neither, xattrs are
/// neither compared nor taken off a root that could not be replaced (see `restore_dir`).
const XATTRS: &str = r#"XATTR_PY='
import os, sys
def dump(p, rel):
    try:
        names = sorted(os.listxattr(p, follow_symlinks=False))
    except OSError:
        return
    for n in names:
        print("x", rel, n, os.getxattr(p, n, follow_symlinks=False).hex())
if sys.argv[1] == "list":
    root = sys.argv[2]
    dump(root, ".")
    for d, dirs, files in os.walk(root):
        for f in dirs + files:
            dump(os.path.join(d, f), os.path.join(".", os.path.relpath(os.path.join(d, f), root)))
else:
    live, sealed = sys.argv[2], sys.argv[3]
    want = {n: os.getxattr(sealed, n) for n in os.listxattr(sealed)}
    for n in os.listxattr(live):
        if n not in want:
            os.removexattr(live, n)
    for n, v in want.items():
        os.setxattr(live, n, v)
'
xattrs() {
  if command -v python3 > /dev/null; then python3 -c "$XATTR_PY" "$@"
  elif command -v getfattr > /dev/null && command -v setfattr > /dev/null; then
    if [ "$1" = list ]; then
      (cd "$2" && getfattr -R -P -d -m - -e hex . 2>/dev/null) \
        | awk '/^# file: /{f=substr($0,9); next} NF{i=index($0,"="); print "x", f, substr($0,1,i-1), substr($0,i+1)}'
    else
      getfattr -h -m - "$2" 2>/dev/null | grep -v '^#' | while read -r n; do
        [ -n "$n" ] && setfattr -h -x "$n" "$2"
      done
      getfattr -h -d -m - -e hex "$3" 2>/dev/null | sed "s|^# file: .*|# file: $2|" | setfattr -h --restore=-
    fi
  fi
}
"#;

/// `seal`: run as root with no arguments. Copies aside (`cp -a`: modes, owners, xattrs) the
/// home, `/tmp` and every other directory `user` may write, found now: world-writable ones
/// and ones `user` owns, outside `/proc`, `/sys` and `/dev`, on the root filesystem only,
/// the outermost of nested ones. `/dev/shm` and SysV IPC are not kept: the reset empties them,
/// as a boot would.
pub(super) fn seal_script() -> String {
    format!(
        r#"set -eu
{LIST_PROCS}
S={SEALED}
rm -rf "$S"
mkdir -p "$S/d"
chmod 700 /opt/wmo-e2b "$S"
uid=$(id -u user 2>/dev/null || echo 1000)
{{
  echo /home/user; echo /tmp
  find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /home/user -o -path /tmp \
    -o -path /opt/wmo-e2b \) -prune -o -type d \( -perm -0002 -o -user "$uid" \) -print 2>/dev/null \
    | LC_ALL=C sort | awk '{{ for (k in kept) if (index($0, k "/") == 1) next; kept[$0]; print }}'
}} > "$S/dirs"
# One path a line, read back by `read`: a name with blanks in it cannot be recorded.
! grep -q '[[:space:]]' "$S/dirs" || {{ echo "a directory writable by user has a blank in its name"; exit 3; }}
[ "$(wc -l < "$S/dirs")" -le 66 ] || {{ echo "more than 64 directories writable by user"; exit 3; }}
n=0
while read -r dir; do cp -a "$dir" "$S/d/$n"; n=$((n + 1)); done < "$S/dirs"
list_procs | while read -r pid ppid start; do echo "$pid $start"; done > "$S/procs"
"#
    )
}

/// The verifier's own `HOME` and `TMPDIR`, under the system directory (root's alone).
const VERIFIER: &str = "/opt/wmo-e2b/verifier";

/// Empties `/tests` (its own directory may be a mount point: the emulator's is) and makes the
/// verifier's directories anew, so nothing a task left is there for the next verifier; Harbor's
/// `/logs/verifier` too where root can make it (the emulator's root cannot).
const CLEAR_VERIFIER: &str = r#"mkdir -p /tests && find /tests -mindepth 1 -maxdepth 1 -exec rm -rf {} + && chmod 755 /tests \
  && rm -rf /opt/wmo-e2b/verifier && mkdir -p -m 700 /opt/wmo-e2b/verifier/home /opt/wmo-e2b/verifier/tmp \
  || { echo "cannot empty /tests and the verifier's directory"; exit 3; }
{ [ ! -L /logs ] || rm -f /logs; } && rm -rf /logs/verifier && mkdir -p -m 755 /logs/verifier 2>/dev/null || true
"#;

/// `stop`: run as root before a verify; its arguments are the pids of the runner processes to
/// keep (none: the runner is ended too). The kill loop of `reset`, then what the agent left
/// in `/dev/shm`, the message queues and SysV IPC emptied (the verifier, root, would see it),
/// then the verifier's directories made empty.
pub(super) fn stop_script() -> String {
    format!(
        "{}{SHARED_MEMORY}{CLEAR_VERIFIER}",
        reset_script()
            .split(KILL_LOOP_END)
            .next()
            .unwrap_or_default()
    )
}

/// A verifier's command (see [`crate::sandbox::Role::Verify`]): run as root through envd's
/// login shell, it replaces that shell with one that has nothing of the environment but a
/// fixed set and `envs`, and reads no dotfile.
pub(super) fn verify_command(cmd: &str, envs: &[(String, String)]) -> String {
    use crate::sandbox::shell_quote;
    let mut line = format!(
        "exec env -i PATH={} HOME={VERIFIER}/home TMPDIR={VERIFIER}/tmp USER=root LOGNAME=root \
         SHELL=/bin/bash LANG=C.UTF-8 PYTHONNOUSERSITE=1 PYTHONDONTWRITEBYTECODE=1",
        crate::sandbox::VERIFY_PATH
    );
    for (k, v) in envs {
        line.push(' ');
        line.push_str(&shell_quote(&format!("{k}={v}")));
    }
    line.push_str(" /bin/bash --noprofile --norc -c ");
    line.push_str(&shell_quote(cmd));
    line
}

/// Where `reset`'s kill loop ends, which `stop` runs alone.
const KILL_LOOP_END: &str = "# -- every process of the task is gone --\n";

/// `reset`: run as root; its arguments are the pids of the runner processes to keep.
pub(super) fn reset_script() -> String {
    format!(
        r#"set -u
{LIST_PROCS}
{XATTRS}
S={SEALED}
[ -f "$S/procs" ] || {{ echo "the sandbox was never sealed"; exit 3; }}
declare -A sealed runner
while read -r pid start; do sealed[$pid]=$start; done < "$S/procs"
for pid in "$@"; do [ -n "${{sealed[$pid]:-}}" ] && runner[$pid]=${{sealed[$pid]}}; done
round=0
while :; do
  declare -A parent started
  parent=(); started=()
  while read -r pid ppid start; do parent[$pid]=$ppid; started[$pid]=$start; done < <(list_procs)
  victims=()
  for pid in "${{!parent[@]}}"; do
    [ "${{sealed[$pid]:-}}" = "${{started[$pid]}}" ] && continue
    q=$pid; hops=0; keep=0
    while [ -n "${{parent[$q]:-}}" ] && [ $hops -lt 256 ]; do
      if [ -n "${{runner[$q]:-}}" ] && [ "${{runner[$q]}}" = "${{started[$q]}}" ]; then keep=1; break; fi
      q=${{parent[$q]}}; hops=$((hops + 1))
    done
    [ $keep = 1 ] || victims+=("$pid")
  done
  [ ${{#victims[@]}} = 0 ] && break
  round=$((round + 1))
  if [ $round -gt 50 ]; then echo "processes still running after 50 rounds of SIGKILL: ${{victims[*]}}"; exit 3; fi
  kill -KILL "${{victims[@]}}" 2>/dev/null
  sleep 0.02
done
{KILL_LOOP_END}{CLEAR_VERIFIER}{SHARED_MEMORY}
# Removes a tree, opening up first any directory a task made unreadable to its owner (root
# needs no such help; the emulator's root is the sandbox's user).
remove() {{ rm -rf "$@" 2>/dev/null || {{ chmod -R u+rwx "$@" 2>/dev/null; rm -rf "$@"; }}; }}
# Recreates a directory from its sealed copy, its own mode, owner and xattrs with it. One
# that cannot be replaced (a mount point, or its parent not ours to write) is emptied
# instead and given back the sealed mode, owner and xattrs.
restore_dir() {{
  remove "$1" 2> /dev/null
  [ -e "$1" ] || {{ cp -a "$2" "$1"; return; }}
  [ -d "$1" ] && [ ! -L "$1" ] && remove "$1"/* && cp -a "$2/." "$1/" || return 1
  chown --reference="$2" "$1" 2>/dev/null; chmod --reference="$2" "$1" && xattrs sync "$1" "$2"
}}
shopt -s dotglob nullglob
n=0
while read -r dir; do
  restore_dir "$dir" "$S/d/$n" || {{ echo "cannot restore $dir"; exit 3; }}
  n=$((n + 1))
done < "$S/dirs"
# A directory's own size only grows as entries come and go, so it is left out.
listing() {{ cd "$1" && {{ find . -type d -printf '%y %m %u %g %p\n'; find . ! -type d -printf '%y %m %u %g %s %l %p\n'; xattrs list .; }} | LC_ALL=C sort; }}
n=0
while read -r dir; do
  if ! diff <(listing "$S/d/$n") <(listing "$dir") > /dev/null; then
    echo "$dir differs from the sealed copy after the reset:"
    diff <(listing "$S/d/$n") <(listing "$dir") | head -5
    exit 3
  fi
  n=$((n + 1))
done < "$S/dirs"
"#
    )
}

/// Empties `/dev/shm` and the POSIX message queues and removes every SysV IPC object, then
/// proves them gone (as far as the caller sees them).
const SHARED_MEMORY: &str = r#"shopt -s dotglob nullglob
rm -rf /dev/shm/* /dev/mqueue/* 2>/dev/null || { chmod -R u+rwx /dev/shm/* 2>/dev/null; rm -rf /dev/shm/*; }
command -v ipcrm > /dev/null && ipcrm --all 2>/dev/null
[ -z "$(ls -A /dev/shm 2>/dev/null)" ] || { echo "/dev/shm cannot be emptied"; exit 3; }
if command -v ipcs > /dev/null && ipcs -m -q -s 2>/dev/null | grep -q '^0x'; then
  echo "SysV IPC objects remain"; exit 3
fi
shopt -u dotglob nullglob
"#;

/// `reset`'s second part, run as `user` after the first: on E2B the root script has emptied
/// `/dev/shm` and the IPC objects already and this finds nothing; the emulator's root runs in
/// its own namespaces, where the task's `/dev/shm` and IPC objects are not seen.
/// It also clears the user's persistent keyrings (`@u`, `@us`), which outlive every process
/// of the uid: a key one task added would be found by the next (locally the system call
/// filter keeps tasks from keyrings altogether).
pub(super) fn reset_user_script() -> String {
    format!("set -u\n{SHARED_MEMORY}{CLEAR_KEYRINGS}")
}

/// `keyctl(KEYCTL_CLEAR, KEY_SPEC_USER_KEYRING)`, and the user session keyring's, through
/// `python3` (`keyctl` the program is rarely installed); an error (no keyring, a filter) is
/// nothing to clear.
const CLEAR_KEYRINGS: &str = r#"command -v python3 > /dev/null && python3 -c '
import ctypes, platform
nr = {"x86_64": 250, "aarch64": 219}.get(platform.machine())
if nr:
    for ring in (-4, -5):
        ctypes.CDLL(None).syscall(nr, 7, ring)
'
exit 0
"#;

#[cfg(test)]
mod tests {
    use super::*;

    /// Once the agent's processes are gone, the stop empties what they could leave for the
    /// verifier in the kernel's shared memory, and only then readies the verifier.
    #[test]
    fn the_stop_empties_shared_memory_between_the_kill_and_the_verifier() {
        let stop = stop_script();
        let at = |part: &str| stop.find(part);
        let (kill, shm, verifier) = (at("kill -KILL"), at("ipcrm --all"), at("find /tests"));
        assert!(
            kill.is_some() && shm.is_some() && verifier.is_some(),
            "{stop}"
        );
        assert!(kill < shm && shm < verifier, "{stop}");
    }

    /// The scripts are bash; a syntax error would only show on a real sandbox.
    #[test]
    fn scripts_parse_as_bash() {
        for script in [
            seal_script(),
            reset_script(),
            reset_user_script(),
            stop_script(),
        ] {
            let out = std::process::Command::new("bash")
                .args(["-n", "-c", &script])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
