//! The system call filter every command started in a sandbox runs under (task commands,
//! verify, and the runner, whose harness code is untrusted), in the spirit of Docker's default
//! profile: the calls that reach shared kernel state or widen what the sandbox holds answer
//! EPERM, everything else is allowed (`ptrace` included, so `gdb` and `strace` work on a
//! command's own children).
//!
//! Denied: keyrings (a uid's keyring is the host's: a key one task adds, the next task, other
//! sandboxes and the host's own user of that uid would find), `bpf`, `perf_event_open`,
//! mounts and the mount API, new or joined namespaces (`unshare`, `setns`, `clone` with any
//! `CLONE_NEW*` flag; `clone3` answers ENOSYS, as it does under Docker, so libc falls back to
//! `clone`, whose flags a filter can read), kernel modules, kexec, `reboot`, swap, clock
//! setting, `acct`, `quotactl`, `open_by_handle_at`, `userfaultfd`, `syslog`, `iopl`/`ioperm`
//! and `lookup_dcookie`. A call made through another architecture's entry (i386 on x86_64)
//! kills the process: its numbers are not the ones checked; x32 calls answer ENOSYS.
//!
//! The program is a constant, built at compile time: the helper's child installs it between
//! its fork and its exec, where it may make system calls but not allocate.

use std::io;

use libc::sock_filter;

/// `AUDIT_ARCH_*` of the one architecture whose numbers the program checks.
#[cfg(target_arch = "x86_64")]
const ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const ARCH: u32 = 0xC000_00B7;

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("the sandbox's system call filter knows the numbers of x86_64 and aarch64 only");

/// x86_64's x32 calls: the same architecture in `seccomp_data`, numbers with this bit set.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// The calls that answer EPERM whatever their arguments.
const DENIED: &[libc::c_long] = &[
    libc::SYS_add_key,
    libc::SYS_keyctl,
    libc::SYS_request_key,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_quotactl_fd,
    libc::SYS_open_by_handle_at,
    libc::SYS_userfaultfd,
    libc::SYS_syslog,
    libc::SYS_lookup_dcookie,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_iopl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ioperm,
];

/// Every `CLONE_NEW*` flag `clone` takes (`CLONE_NEWTIME` is `unshare`'s and `clone3`'s only:
/// in `clone`'s flags its bit is part of the exit signal).
const CLONE_NEW_ANY: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u32;

// Offsets into `struct seccomp_data`: nr, arch, instruction_pointer, args[6]. The first
// argument's low word is at 16 on these little-endian architectures.
const NR: u32 = 0;
const ARCH_AT: u32 = 4;
const ARG0_LOW: u32 = 16;

const X32_CHECK: usize = if cfg!(target_arch = "x86_64") { 1 } else { 0 };
/// Instructions: load arch, check it, kill; load nr; [x32 check]; one per denied call;
/// clone3; clone, load its flags, test them; allow, EPERM, ENOSYS.
const LEN: usize = 4 + X32_CHECK + DENIED.len() + 4 + 3;

const fn stmt(code: u32, k: u32) -> sock_filter {
    sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

const fn jump(code: u32, k: u32, jt: usize, jf: usize) -> sock_filter {
    assert!(jt <= u8::MAX as usize && jf <= u8::MAX as usize);
    sock_filter {
        code: code as u16,
        jt: jt as u8,
        jf: jf as u8,
        k,
    }
}

const fn build() -> [sock_filter; LEN] {
    use libc::{BPF_ABS, BPF_JEQ, BPF_JGE, BPF_JMP, BPF_JSET, BPF_K, BPF_LD, BPF_RET, BPF_W};
    const LOAD: u32 = BPF_LD | BPF_W | BPF_ABS;
    const RET: u32 = BPF_RET | BPF_K;
    const ALLOW: usize = LEN - 3;
    const EPERM: usize = LEN - 2;
    const ENOSYS: usize = LEN - 1;
    let mut p = [stmt(RET, libc::SECCOMP_RET_KILL_PROCESS); LEN];
    // How far a jump at `from` goes to reach `to`.
    const fn to(target: usize, from: usize) -> usize {
        target - from - 1
    }
    p[0] = stmt(LOAD, ARCH_AT);
    p[1] = jump(BPF_JMP | BPF_JEQ | BPF_K, ARCH, 1, 0);
    p[2] = stmt(RET, libc::SECCOMP_RET_KILL_PROCESS);
    p[3] = stmt(LOAD, NR);
    let mut i = 4;
    #[cfg(target_arch = "x86_64")]
    {
        p[i] = jump(BPF_JMP | BPF_JGE | BPF_K, X32_SYSCALL_BIT, to(ENOSYS, i), 0);
        i += 1;
    }
    let mut d = 0;
    while d < DENIED.len() {
        p[i] = jump(BPF_JMP | BPF_JEQ | BPF_K, DENIED[d] as u32, to(EPERM, i), 0);
        i += 1;
        d += 1;
    }
    p[i] = jump(
        BPF_JMP | BPF_JEQ | BPF_K,
        libc::SYS_clone3 as u32,
        to(ENOSYS, i),
        0,
    );
    i += 1;
    p[i] = jump(
        BPF_JMP | BPF_JEQ | BPF_K,
        libc::SYS_clone as u32,
        0,
        to(ALLOW, i),
    );
    i += 1;
    p[i] = stmt(LOAD, ARG0_LOW);
    i += 1;
    p[i] = jump(
        BPF_JMP | BPF_JSET | BPF_K,
        CLONE_NEW_ANY,
        to(EPERM, i),
        to(ALLOW, i),
    );
    i += 1;
    assert!(i == ALLOW);
    p[ALLOW] = stmt(RET, libc::SECCOMP_RET_ALLOW);
    p[EPERM] = stmt(RET, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32);
    p[ENOSYS] = stmt(RET, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32);
    p
}

static PROGRAM: [sock_filter; LEN] = build();

/// Puts this thread (and all it execs and starts) under the filter. Needs `no_new_privs` (or
/// CAP_SYS_ADMIN). Makes one system call and allocates nothing: safe between fork and exec.
pub(crate) fn install() -> io::Result<()> {
    let prog = libc::sock_fprog {
        len: LEN as u16,
        filter: PROGRAM.as_ptr().cast_mut(),
    };
    // SAFETY: the kernel copies the program from `prog`, which outlives the call.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &prog as *const libc::sock_fprog,
        )
    };
    if rc == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the program answers for one call, run by a small BPF interpreter over the few
    /// instructions it uses.
    fn verdict(arch: u32, nr: u32, arg0: u64) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_ne_bytes());
        data[4..8].copy_from_slice(&arch.to_ne_bytes());
        data[16..24].copy_from_slice(&arg0.to_ne_bytes());
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let ins = PROGRAM[pc];
            let code = u32::from(ins.code);
            match code & 0x07 {
                libc::BPF_LD => {
                    let at = ins.k as usize;
                    acc = u32::from_ne_bytes(data[at..at + 4].try_into().unwrap());
                    pc += 1;
                }
                libc::BPF_RET => return ins.k,
                libc::BPF_JMP => {
                    let taken = match code & 0xf0 {
                        libc::BPF_JEQ => acc == ins.k,
                        libc::BPF_JGE => acc >= ins.k,
                        libc::BPF_JSET => acc & ins.k != 0,
                        other => panic!("unexpected jump {other:#x}"),
                    };
                    pc += 1 + usize::from(if taken { ins.jt } else { ins.jf });
                }
                other => panic!("unexpected class {other:#x}"),
            }
        }
    }

    const EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
    const ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;

    #[test]
    fn denied_calls_answer_eperm_and_others_pass() {
        for &nr in DENIED {
            assert_eq!(verdict(ARCH, nr as u32, 0), EPERM, "call {nr}");
        }
        for nr in [libc::SYS_read, libc::SYS_ptrace, libc::SYS_execve] {
            assert_eq!(verdict(ARCH, nr as u32, 0), libc::SECCOMP_RET_ALLOW);
        }
    }

    #[test]
    fn clone_is_denied_only_with_a_new_namespace() {
        let clone = libc::SYS_clone as u32;
        let thread = (libc::CLONE_VM
            | libc::CLONE_FS
            | libc::CLONE_FILES
            | libc::CLONE_SIGHAND
            | libc::CLONE_THREAD
            | libc::CLONE_SETTLS) as u64;
        assert_eq!(verdict(ARCH, clone, thread), libc::SECCOMP_RET_ALLOW);
        assert_eq!(
            verdict(ARCH, clone, libc::SIGCHLD as u64),
            libc::SECCOMP_RET_ALLOW
        );
        for flag in [libc::CLONE_NEWUSER, libc::CLONE_NEWNS, libc::CLONE_NEWNET] {
            assert_eq!(verdict(ARCH, clone, flag as u64 | thread), EPERM);
        }
        assert_eq!(verdict(ARCH, libc::SYS_clone3 as u32, 0), ENOSYS);
    }

    #[test]
    fn a_foreign_architecture_is_killed() {
        const AUDIT_ARCH_I386: u32 = 0x4000_0003;
        assert_eq!(
            verdict(AUDIT_ARCH_I386, 0, 0),
            libc::SECCOMP_RET_KILL_PROCESS
        );
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            verdict(ARCH, X32_SYSCALL_BIT | libc::SYS_keyctl as u32, 0),
            ENOSYS
        );
    }
}
