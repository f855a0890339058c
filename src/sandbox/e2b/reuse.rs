//! Proven clean reuse of an E2B sandbox, done inside it by two root scripts.
//!
//! Task commands run as E2B's user `user` and the runner as `root`, so a task cannot touch
//! the runner's directory (unless it uses `sudo`; see the README). `seal` copies the home and
//! `/tmp` aside under the system directory and records every process running then. `reset`
//! kills every process that was not running at the seal, is not the runner (or a descendant
//! of it), and is not the reset itself; repeats until none is left (a fork loop included);
//! then empties the home and `/tmp`, copies the sealed state back, and compares both with the
//! sealed copy. Kernel threads and zombies are not processes to kill. Any doubt exits non-zero
//! and the caller retires the sandbox.

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

/// `seal`: run as root with no arguments.
pub(super) fn seal_script() -> String {
    format!(
        r#"set -eu
{LIST_PROCS}
S={SEALED}
rm -rf "$S"
mkdir -p "$S/home" "$S/tmp"
chmod 700 /opt/wmo-e2b "$S"
cp -a /home/user/. "$S/home/"
# tar leaves sockets out, which cannot be copied back anyway.
tar -C /tmp -cf - . 2>/dev/null | tar -C "$S/tmp" -xf -
list_procs | while read -r pid ppid start; do echo "$pid $start"; done > "$S/procs"
"#
    )
}

/// The verifier's own `HOME` and `TMPDIR`, under the system directory (root's alone).
const VERIFIER: &str = "/opt/wmo-e2b/verifier";

/// Empties `/tests` (its own directory may be a mount point: the emulator's is) and makes the
/// verifier's directories anew, so nothing a task left is there for the next verifier.
const CLEAR_VERIFIER: &str = r#"mkdir -p /tests && find /tests -mindepth 1 -maxdepth 1 -exec rm -rf {} + && chmod 755 /tests \
  && rm -rf /opt/wmo-e2b/verifier && mkdir -p -m 700 /opt/wmo-e2b/verifier/home /opt/wmo-e2b/verifier/tmp \
  || { echo "cannot empty /tests and the verifier's directory"; exit 3; }
"#;

/// `stop`: run as root before a verify; its arguments are the pids of the runner processes to
/// keep (none: the runner is ended too). The kill loop of `reset`, then the verifier's
/// directories made empty.
pub(super) fn stop_script() -> String {
    format!(
        "{}{CLEAR_VERIFIER}",
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
{KILL_LOOP_END}{CLEAR_VERIFIER}shopt -s dotglob nullglob
rm -rf /home/user/* /tmp/* || {{ echo "cannot empty the home or /tmp"; exit 3; }}
cp -a "$S/home/." /home/user/ && cp -a "$S/tmp/." /tmp/ && chmod 1777 /tmp || {{ echo "cannot restore the sealed state"; exit 3; }}
# A directory's own size only grows as entries come and go, so it is left out.
listing() {{ cd "$1" && {{ find . -mindepth 1 -type d -printf '%y %m %u %p\n'; find . -mindepth 1 ! -type d -printf '%y %m %u %s %l %p\n'; }} | LC_ALL=C sort; }}
for d in home:/home/user tmp:/tmp; do
  if ! diff <(listing "$S/${{d%%:*}}") <(listing "${{d#*:}}") > /dev/null; then
    echo "${{d#*:}} differs from the sealed copy after the reset:"
    diff <(listing "$S/${{d%%:*}}") <(listing "${{d#*:}}") | head -5
    exit 3
  fi
done
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scripts are bash; a syntax error would only show on a real sandbox.
    #[test]
    fn scripts_parse_as_bash() {
        for script in [seal_script(), reset_script(), stop_script()] {
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
